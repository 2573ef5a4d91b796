"""Kernel table of ``csrc/kernels/matmul_4bit.cu``: the fused 4-bit matmul and the weight dequantization.

Names: ``gemv_4bit_<dtype>_<v16|v4|any>_m<rows>``: ``v16`` K % 32 == 0, A and B 16-byte aligned, one
16-byte load of B per lane and 32 weights; ``v4`` K % 8 == 0, A 16-byte and B 4-byte aligned, 4 bytes
and 8 weights; ``any`` every shape and alignment; ``rows`` the tile of rows of A per block (1, 2, 4, 8;
``any`` only 1 and 8). ``gemm_4bit_tc_<f16|bf16>_m<rows>``: the tensor-core kernel for up to 16, 32 or
64 rows of A, and ``gemm_4bit_tc_reduce_<dtype>`` which adds its split-K partial sums.
``dequantize_4bit_weight_<dtype>``. All take plain or double-quantized scales.
"""

from __future__ import annotations

from . import Kernel

SOURCE = "matmul_4bit.cu"
# Launch geometry the kernels assume (kGemvWarps, kGemvWarpFeatures, kDequantPerThread in the source; a
# test checks they agree): warps per gemv block, output features per warp for each tile of rows,
# weights per thread of the dequantization.
GEMV_WARPS = 4
GEMV_WARP_FEATURES = {1: 2, 2: 1, 4: 1, 8: 1}
DEQUANT_PER_THREAD = 8
# The tensor-core kernel (kTcWarps, kTcFeatures, kTcChunk, kTcReduceThreads in the source): warps per
# block, output features per block, K per chunk, threads per block of the split-K reduction; the row
# tiles it is built for (16 * MT rows of A) and its dtypes (fp32 stays on the SIMT kernel: torch's fp32
# matmul does not use TF32 by default, nor may we).
TC_WARPS = 4
TC_FEATURES = 64
TC_CHUNK = 64
TC_REDUCE_THREADS = 256
TC_ROWS = (16, 32, 64)
TC_DTYPES = ("f16", "bf16")
# Path -> bytes of B per lane and chunk (the CB template argument), and the tiles of rows it is built for.
GEMV_PATHS = {"v16": (16, (1, 2, 4, 8)), "v4": (4, (1, 2, 4, 8)), "any": (0, (1, 8))}
# Short name -> CUDA element type, for A, bias, out and the dequantized weight.
DTYPES = {"f32": "float", "f16": "__half", "bf16": "__nv_bfloat16"}
# The block scales, after B: absmax (fp32 per block, or per 256 codes when nested), then the nested
# state (null when plain): the 8-bit codes, their 256-entry table, the fp32 offset.
_SCALES = ("const float*", "const unsigned char*", "const float*", "const float*")


def _gemv(dt: str, ctype: str, path: str, rows: int) -> Kernel:
    return Kernel(
        name=f"gemv_4bit_{dt}_{path}_m{rows}",
        source=SOURCE,
        expr=f"gemv_4bit<{ctype}, {GEMV_PATHS[path][0]}, {rows}>",
        params=(
            f"const {ctype}*",  # A [M, K]
            "const unsigned char*",  # B, packed codes
            *_SCALES,
            "const float*",  # code, the 16-entry table
            f"const {ctype}*",  # bias [N], or null
            f"{ctype}*",  # out [M, N]
            "long long",  # M
            "long long",  # N
            "long long",  # K
            "int",  # blocksize
        ),
    )


def _tc(dt: str, ctype: str, rows: int) -> Kernel:
    return Kernel(
        name=f"gemm_4bit_tc_{dt}_m{rows}",
        source=SOURCE,
        expr=f"gemm_4bit_tc<{ctype}, {rows // 16}>",
        params=(
            f"const {ctype}*",  # A [M, K]
            "const unsigned char*",  # B, packed codes
            *_SCALES,
            "const float*",  # code, the 16-entry table
            f"const {ctype}*",  # bias [N], or null
            f"{ctype}*",  # out [M, N] (one split)
            "float*",  # partial [splits, M, N] fp32 (several splits), or null
            "long long",  # M
            "long long",  # N
            "long long",  # K
            "int",  # blocksize
            "int",  # chunks of K per split
        ),
    )


def _tc_reduce(dt: str, ctype: str) -> Kernel:
    return Kernel(
        name=f"gemm_4bit_tc_reduce_{dt}",
        source=SOURCE,
        expr=f"gemm_4bit_tc_reduce<{ctype}>",
        params=("const float*", f"const {ctype}*", f"{ctype}*", "long long", "long long", "int"),
    )


def _dequant(dt: str, ctype: str) -> Kernel:
    return Kernel(
        name=f"dequantize_4bit_weight_{dt}",
        source=SOURCE,
        expr=f"dequantize_4bit_weight<{ctype}>",
        params=("const unsigned char*", *_SCALES, "const float*", f"{ctype}*", "long long", "int"),
    )


KERNELS = [
    *(
        _gemv(dt, ctype, path, rows)
        for dt, ctype in DTYPES.items()
        for path, (_, tiles) in GEMV_PATHS.items()
        for rows in tiles
    ),
    *(_tc(dt, DTYPES[dt], rows) for dt in TC_DTYPES for rows in TC_ROWS),
    *(_tc_reduce(dt, DTYPES[dt]) for dt in TC_DTYPES),
    *(_dequant(dt, ctype) for dt, ctype in DTYPES.items()),
]
