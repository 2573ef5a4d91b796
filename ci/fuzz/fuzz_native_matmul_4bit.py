"""bitsandbytes_cpu._C.gemv_4bit / dequantize_4bit_range / expand_nested_absmax called directly.

These take their sizes (M, N, K, i0, i1) as plain integers next to the arrays, so the harness mostly
passes sizes that match the arrays and sometimes any int64 (overflow of the size products must be refused,
not wrapped). Allowed: ValueError naming an argument. Outputs lie between canaries.
"""

from __future__ import annotations

import torch
from _harness import EDGE_INTS, FLOAT_DTYPES, THREADS, Finding, Guarded, Reader, array, call, main

BLOCKSIZES = (32, 64, 128, 256, 512, 1024, 2048, 4096, *EDGE_INTS)
NAMES = ("A", "B", "M", "N", "K", "absmax", "code", "blocksize", "bias", "out", "i0", "i1", "absmax_8bit",
         "absmax_code", "absmax_offset")  # fmt: skip


def _dim(r: Reader, true: int) -> int:
    return r.int64() if r.u8() % 6 == 0 else true


def _blocks(n: int, blocksize: int) -> int:
    return max(-(-n // blocksize), 0) if blocksize > 0 else 1


def test_one_input(data: bytes) -> None:
    from bitsandbytes_cpu import _C

    r, g = Reader(data), Guarded()
    which = r.u8() % 3
    blocksize = r.pick(BLOCKSIZES)
    threads = r.pick(THREADS)
    if which == 0:
        m, n, k = r.small(4), r.small(40), r.small(130)
        dtype = r.pick(FLOAT_DTYPES)
        A = array(r, g, "A", m * k, dtype)
        B = array(r, g, "B", (n * k + 1) // 2, torch.uint8)
        absmax = array(r, g, "absmax", _blocks(n * k, blocksize), torch.float32)
        code = array(r, g, "code", 16, torch.float32)
        bias = array(r, g, "bias", n, dtype) if r.flag() else None
        out = array(r, g, "out", m * n, dtype)
        M, N, K = _dim(r, m), _dim(r, n), _dim(r, k)
        ran, _ = call(_C.gemv_4bit, A, B, M, N, K, absmax, code, blocksize, bias, out, threads, names=NAMES)
        # Python's integers do not wrap: a call that ran must have had arrays of the sizes M, N, K imply.
        if ran and (M * K != A.numel() or (N * K + 1) // 2 > B.numel() or M * N != out.numel()):
            raise Finding(f"gemv_4bit ran with M={M} N={N} K={K} for arrays of {A.numel()}, {B.numel()}, {out.numel()}")
    elif which == 1:
        total = r.small(600)
        i0 = r.small(total)
        i1 = i0 + r.small(total - i0)
        B = array(r, g, "B", (total + 1) // 2, torch.uint8)
        absmax = array(r, g, "absmax", _blocks(total, blocksize), torch.float32)
        code = array(r, g, "code", 16, torch.float32)
        out = array(r, g, "out", i1 - i0, r.pick(FLOAT_DTYPES))
        i0, i1 = _dim(r, i0), _dim(r, i1)
        ran, _ = call(_C.dequantize_4bit_range, B, absmax, code, blocksize, i0, i1, out, threads, names=NAMES)
        fits = 0 <= i0 <= i1 and (i1 + 1) // 2 <= B.numel() and i1 - i0 == out.numel()
        if ran and not (fits and _blocks(i1, blocksize) <= absmax.numel()):
            raise Finding(f"dequantize_4bit_range ran with i0={i0} i1={i1} for arrays of {B.numel()}, {out.numel()}")
    else:
        n = r.small(700)
        q = array(r, g, "absmax_8bit", n, torch.uint8)
        absmax2 = array(r, g, "absmax", _blocks(n, 256), torch.float32)
        code8 = array(r, g, "absmax_code", 256, torch.float32)
        offset = array(r, g, "absmax_offset", 1, torch.float32)
        out = array(r, g, "out", n, torch.float32)
        call(_C.expand_nested_absmax, q, absmax2, code8, offset, out, threads, names=NAMES)
    g.check(("gemv_4bit", "dequantize_4bit_range", "expand_nested_absmax")[which])


if __name__ == "__main__":
    main(test_one_input, ["bitsandbytes", "bitsandbytes_cpu"])
