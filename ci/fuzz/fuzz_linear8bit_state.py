"""Linear8bitLt.load_state_dict on a state dict built from fuzz bytes: weight (int8 codes or floats, any shape
and dtype), SCB (row scales) and weight_format of any shape, dtype and value, into modules with and without
fp16 weights; strict or not, assign or not.

Allowed: RuntimeError (torch's gathered load errors), TypeError or ValueError, naming a key. A module that
loaded must run forward on an input of its in_features and give [rows, out_features].
"""

from __future__ import annotations

import torch
from _harness import ANY_DTYPES, Finding, Reader, call, main

KEYS = ("weight", "SCB", "weight_format", "bias", "state_dict")
DTYPES = (torch.int8, torch.int8, torch.float16, torch.float32, *ANY_DTYPES)


def _shape(r: Reader, rows: int, cols: int) -> tuple[int, ...]:
    return r.pick(((rows, cols), (rows, cols), (rows, cols), (cols, rows), (rows,), (), (rows, cols, 1), (0, cols),
                   (rows + 1, cols), (rows, max(cols - 1, 0))))  # fmt: skip


def test_one_input(data: bytes) -> None:
    import bitsandbytes as bnb

    r = Reader(data)
    in_f, out_f = max(r.small(48), 1), max(r.small(48), 1)
    fp16_weights, threshold = r.flag(), r.pick((0.0, 0.0, 6.0, 1e-3))
    module = bnb.nn.Linear8bitLt(in_f, out_f, bias=r.flag(), has_fp16_weights=fp16_weights, threshold=threshold)
    sd = {}
    if r.u8() % 8:
        dtype = r.pick(DTYPES)
        sd["weight"] = _tensor(r, _shape(r, out_f, in_f), dtype)
    if r.u8() % 4:
        sd["SCB"] = _tensor(
            r, _shape(r, out_f, 1)[:1], r.pick((torch.float32, torch.float32, torch.float16, torch.int8))
        )
    if r.u8() % 4 == 0:
        sd["weight_format"] = _tensor(r, r.pick(((), (1,), (2,))), r.pick((torch.uint8, torch.int64, torch.float32)))
    if module.bias is not None and r.u8() % 4:
        sd["bias"] = _tensor(r, _shape(r, out_f, 1)[:1], r.pick((torch.float16, torch.float32)))
    strict, assign = r.flag(), r.flag()
    ok, _ = call(module.load_state_dict, sd, strict=strict, assign=assign, names=KEYS,
                 errors=(RuntimeError, TypeError, ValueError))  # fmt: skip
    if not ok:
        return
    x = torch.ones(3, in_f, dtype=r.pick((torch.float16, torch.float32)))
    y = module(x)
    if tuple(y.shape) != (3, out_f):
        raise Finding(f"Linear8bitLt({in_f}, {out_f}) gave shape {tuple(y.shape)} after loading")


def _tensor(r: Reader, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    n = 1
    for s in shape:
        n *= s
    return r.values(n, dtype).reshape(shape)


if __name__ == "__main__":
    main(test_one_input, ["bitsandbytes", "bitsandbytes.nn"])
