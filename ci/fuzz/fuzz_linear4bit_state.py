"""Linear4bit.load_state_dict (through Params4bit.from_prequantized) on a state dict built from fuzz bytes: packed
weight of any storage dtype and size, its quant_state items and packed JSON blob, strict or not, assign or not.

Allowed: RuntimeError (torch gathers the load errors into one), TypeError or ValueError, naming a key. A module
that loaded must run forward and match x @ W.T + bias with W its dequantized weight (where that is finite).
"""

from __future__ import annotations

import copy

import torch
from _harness import Finding, Reader, call, count, main
from _quant_items import quant_items

STORAGE = (torch.uint8, torch.int8, torch.float16, torch.bfloat16, torch.float32, torch.int32)
KEYS = ("weight", "bias", "absmax", "quant_map", "quant_state", "quant_type", "blocksize", "dtype", "shape",
        "nested_", "state_dict")  # fmt: skip


def test_one_input(data: bytes) -> None:
    import bitsandbytes as bnb

    r = Reader(data)
    in_f, out_f, bias = r.small(64), max(r.small(64), 1), r.flag()
    storage = r.pick(STORAGE)
    size = storage.itemsize if hasattr(storage, "itemsize") else torch.empty(0, dtype=storage).element_size()
    nbytes = count(r, (in_f * out_f + 1) // 2)
    weight = torch.zeros(-(-nbytes // size), dtype=storage).reshape(-1, 1)
    if r.flag():
        weight = weight.reshape(1, -1)
    strict, assign = r.flag(), r.flag()
    x = r.values(in_f * 2, torch.float32).reshape(2, in_f)[: r.pick((1, 2))]
    sd = {"weight": weight, **quant_items(r, "weight.")}
    if bias:
        sd["bias"] = torch.zeros(out_f, dtype=torch.float16)
    module = bnb.nn.Linear4bit(in_f, out_f, bias=bias, compute_dtype=torch.float32)
    ok, _ = call(module.load_state_dict, sd, strict=strict, assign=assign, names=KEYS,
                 errors=(RuntimeError, TypeError, ValueError))  # fmt: skip
    if not ok or module.weight.quant_state is None:
        return  # not strict, and the weight's keys were not all there: nothing was loaded into it
    y = module(x)
    if tuple(y.shape) != (x.shape[0], out_f):
        raise Finding(f"Linear4bit({in_f}, {out_f}) gave shape {tuple(y.shape)} after loading")
    # The dense product with the dequantized weight (the fuzzed absmax may hold NaN, Inf or huge values).
    # As [bytes, 1]: dequantize_4bit transposes the result of a [1, bytes] packed tensor back, as upstream does.
    # In float32, the compute dtype: rounding W to the state's 16-bit dtype first would flush or overflow it.
    qs = copy.copy(module.weight.quant_state)
    qs.dtype = torch.float32
    W = bnb.functional.dequantize_4bit(module.weight.data.reshape(-1, 1), qs)
    b = module.bias.float() if module.bias is not None else torch.zeros(out_f)
    want = x.double() @ W.double().T + b.double()
    scale = x.double().abs() @ W.double().abs().T + b.double().abs()
    # Only where float32 can hold every partial sum: past that, inf and NaN are the right float32 answers.
    wrong = (scale < torch.finfo(torch.float32).max) & ~((y.double() - want).abs() <= 1e-4 * scale + 1e-30)
    if bool(wrong.any()):
        raise Finding(f"Linear4bit({in_f}, {out_f}) forward differs from x @ W.T + b: {y.tolist()} vs {want.tolist()}")


if __name__ == "__main__":
    main(test_one_input, ["bitsandbytes", "bitsandbytes.nn"])
