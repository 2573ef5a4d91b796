"""QuantState.from_dict on state-dict items built from fuzz bytes, with the packed JSON blob taken verbatim
from the input's tail (seeds: real ``as_dict(packed=True)`` output).

Allowed: TypeError / ValueError naming the offending key or argument. A 4-bit state that from_dict accepts
must dequantize: dequantize_4bit of codes of its size returns its shape and dtype, without an error.
"""

from __future__ import annotations

from math import prod

import torch
from _harness import Finding, Reader, call, main
from _quant_items import PREFIXES, quant_items

KEYS = ("qs_dict", "device", "absmax", "quant_map", "nested_", "quant_state", "quant_type", "blocksize", "dtype",
        "shape", "nested_absmax", "nested_blocksize", "nested_quant_map", "nested_dtype", "nested_offset")  # fmt: skip


def test_one_input(data: bytes) -> None:
    import bitsandbytes.functional as F

    r = Reader(data)
    items = quant_items(r, r.pick(PREFIXES))
    ok, qs = call(F.QuantState.from_dict, items, "cpu", names=KEYS)
    if not ok:
        return
    if qs.quant_type is None:
        return  # an 8-bit (quant_type None) state: its codes' shape is the caller's, nothing to check here
    n = prod(qs.shape)
    packed = torch.zeros((n + 1) // 2, 1, dtype=torch.uint8)
    out = F.dequantize_4bit(packed, qs)
    if tuple(out.shape) != tuple(qs.shape) or out.dtype != qs.dtype:
        raise Finding(f"dequantize_4bit gave {out.dtype} {tuple(out.shape)} for {qs}")


if __name__ == "__main__":
    main(test_one_input, ["bitsandbytes", "bitsandbytes.functional"])
