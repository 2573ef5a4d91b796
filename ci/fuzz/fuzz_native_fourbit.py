"""bitsandbytes_cpu._C.quantize_4bit / dequantize_4bit called directly with fuzzed arrays and names.

Allowed: ValueError naming an argument. Outputs lie between canaries that must come back untouched.
"""

from __future__ import annotations

import torch
from _harness import EDGE_INTS, FLOAT_DTYPES, THREADS, Guarded, Reader, array, call, main

BLOCKSIZES = (32, 64, 128, 256, 512, 1024, 2048, 4096, *EDGE_INTS)
QUANT_TYPES = ("nf4", "fp4", "nf4", "fp4", "", "int4", "NF4", "nf4\0")
NAMES = ("A", "out", "absmax", "blocksize", "quant_type")


def test_one_input(data: bytes) -> None:
    from bitsandbytes_cpu import _C

    r, g = Reader(data), Guarded()
    quantize = r.flag()
    n = r.small(700)
    blocksize = r.pick(BLOCKSIZES)
    blocks = max(-(-n // blocksize), 0) if blocksize > 0 else 1
    qt = r.pick(QUANT_TYPES)
    dtype = r.pick(FLOAT_DTYPES)
    if quantize:
        A = array(r, g, "A", n, dtype)
        out = array(r, g, "out", (n + 1) // 2, torch.uint8)
        absmax = array(r, g, "absmax", blocks, torch.float32)
        call(_C.quantize_4bit, A, qt, blocksize, out, absmax, r.pick(THREADS), names=NAMES)
    else:
        A = array(r, g, "A", (n + 1) // 2, torch.uint8)
        absmax = array(r, g, "absmax", blocks, torch.float32)
        out = array(r, g, "out", n, dtype)
        call(_C.dequantize_4bit, A, absmax, qt, blocksize, out, r.pick(THREADS), names=NAMES)
    g.check("quantize_4bit" if quantize else "dequantize_4bit")


if __name__ == "__main__":
    main(test_one_input, ["bitsandbytes", "bitsandbytes_cpu"])
