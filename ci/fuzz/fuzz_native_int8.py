"""bitsandbytes_cpu._C's LLM.int8() entry points called directly: vectorwise/colwise quant, vectorwise
dequant, mm_dequant, linear_matmul and scaled_mm, with fuzzed arrays, thresholds and shapes.

Allowed: ValueError naming an argument. Outputs lie between canaries that must come back untouched.
"""

from __future__ import annotations

import torch
from _harness import FLOAT_DTYPES, THREADS, Guarded, Reader, array, call, main

NAMES = ("A", "B", "codes", "stats", "cols", "row_stats", "col_stats", "bias", "out")


def _shape(r: Reader, rows: int, k: int) -> tuple[int, ...]:
    return r.pick(((rows, k), (rows, k), (k,) if rows == 1 else (rows, k), (1, rows, k)))


def test_one_input(data: bytes) -> None:
    from bitsandbytes_cpu import _C

    r, g = Reader(data), Guarded()
    which = r.u8() % 6
    rows, k, n = r.small(6), r.small(70), r.small(40)
    threads = r.pick(THREADS)
    dtype = r.pick(FLOAT_DTYPES)
    shape = _shape(r, rows, k)
    if which == 0:
        A = array(r, g, "A", rows * k, dtype, shape)
        codes = array(r, g, "codes", rows * k, torch.int8, shape)
        stats = array(r, g, "stats", rows, torch.float32)
        cols = array(r, g, "cols", k, torch.int64) if r.flag() else None
        call(_C.int8_vectorwise_quant, A, r.float(), codes, stats, cols, threads, names=NAMES)
    elif which == 1:
        A = array(r, g, "A", rows * k, dtype, shape)
        codes = array(r, g, "codes", rows * k, torch.int8, shape)
        stats = array(r, g, "stats", k, torch.float32)
        call(_C.int8_colwise_quant, A, r.flag(), r.float(), codes, stats, threads, names=NAMES)
    elif which == 2:
        A = array(r, g, "A", rows * k, torch.int8, shape)
        stats = array(r, g, "stats", rows, torch.float32)
        out = array(r, g, "out", rows * k, torch.float32, shape)
        call(_C.int8_vectorwise_dequant, A, stats, out, threads, names=NAMES)
    elif which == 3:
        A = array(r, g, "A", rows * k, torch.int32, shape)
        rs = array(r, g, "row_stats", rows, torch.float32)
        cs = array(r, g, "col_stats", k, torch.float32)
        bias = array(r, g, "bias", k, r.pick(FLOAT_DTYPES)) if r.flag() else None
        out = array(r, g, "out", rows * k, dtype, shape)
        call(_C.int8_mm_dequant, A, rs, cs, bias, out, threads, names=NAMES)
    else:
        A = array(r, g, "A", rows * k, torch.int8, shape)
        B = array(r, g, "B", n * k, torch.int8, (n, k))
        vnni = r.flag()
        if which == 4:
            out = array(r, g, "out", rows * n, torch.int32)
            call(_C.int8_linear_matmul, A, B, out, threads, vnni, names=NAMES)
        else:
            rs = array(r, g, "row_stats", rows, torch.float32)
            cs = array(r, g, "col_stats", n, torch.float32)
            bias = array(r, g, "bias", n, r.pick(FLOAT_DTYPES)) if r.flag() else None
            out = array(r, g, "out", rows * n, dtype)
            call(_C.int8_scaled_mm, A, B, rs, cs, bias, out, threads, vnni, names=NAMES)
    g.check(f"int8 entry point {which}")


if __name__ == "__main__":
    main(test_one_input, ["bitsandbytes", "bitsandbytes_cpu"])
