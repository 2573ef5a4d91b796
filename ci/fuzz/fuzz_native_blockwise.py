"""bitsandbytes_cpu._C.quantize_blockwise / dequantize_blockwise called directly with fuzzed arrays.

Allowed: ValueError (nanobind's translation of the bindings' std::invalid_argument) naming an argument.
Every output lies between canaries that must come back untouched, whether the call ran or refused.
"""

from __future__ import annotations

import torch
from _harness import EDGE_INTS, FLOAT_DTYPES, THREADS, Guarded, Reader, array, call, main

BLOCKSIZES = (32, 64, 128, 256, 512, 1024, 2048, 4096, *EDGE_INTS)
NAMES = ("A", "code", "out", "absmax", "blocksize")


def test_one_input(data: bytes) -> None:
    from bitsandbytes_cpu import _C

    r, g = Reader(data), Guarded()
    quantize = r.flag()
    n = r.small(700)
    blocksize = r.pick(BLOCKSIZES)
    blocks = max(-(-n // blocksize), 0) if blocksize > 0 else 1
    dtype = r.pick(FLOAT_DTYPES)
    code = array(r, g, "code", 256, torch.float32)
    if quantize:
        A = array(r, g, "A", n, dtype)
        out = array(r, g, "out", n, torch.uint8)
        absmax = array(r, g, "absmax", blocks, torch.float32)
        call(_C.quantize_blockwise, A, code, blocksize, out, absmax, r.pick(THREADS), names=NAMES)
    else:
        A = array(r, g, "A", n, torch.uint8)
        absmax = array(r, g, "absmax", blocks, torch.float32)
        out = array(r, g, "out", n, dtype)
        call(_C.dequantize_blockwise, A, absmax, code, blocksize, out, r.pick(THREADS), names=NAMES)
    g.check("quantize_blockwise" if quantize else "dequantize_blockwise")


if __name__ == "__main__":
    main(test_one_input, ["bitsandbytes", "bitsandbytes_cpu"])
