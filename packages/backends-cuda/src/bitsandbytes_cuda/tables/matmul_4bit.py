"""Kernel table of ``csrc/kernels/matmul_4bit.cu``: the fused 4-bit matmul and the weight dequantization.

Names: ``gemv_4bit_<dtype>_<v16|v4|any>_m<rows>``: ``v16`` K % 32 == 0, A and B 16-byte aligned, one
16-byte load of B per lane and 32 weights; ``v4`` K % 8 == 0, A 16-byte and B 4-byte aligned, 4 bytes
and 8 weights; ``any`` every shape and alignment; ``rows`` the tile of rows of A per block (1, 2, 4, 8;
``any`` only 1 and 8). ``dequantize_4bit_weight_<dtype>``. Both take plain or double-quantized scales.
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
    *(_dequant(dt, ctype) for dt, ctype in DTYPES.items()),
]
