"""Kernel table of ``csrc/kernels/matmul_4bit.cu``: the 4-bit gemv, weight dequantization, nested absmax.

Names: ``gemv_4bit_<dtype>_<vec|any>`` (``vec``: K % 8 == 0, A 16-byte and B 4-byte aligned, one 4-byte
load per 8 weights; ``any``: every shape and alignment), ``dequantize_4bit_weight_<dtype>``,
``expand_nested_absmax``.
"""

from __future__ import annotations

from . import Kernel

SOURCE = "matmul_4bit.cu"
# Launch geometry the kernels assume (kGemvWarps, kGemvFeatures, kGemvMaxRows, kGemvChunk,
# kDequantPerThread in the source; a test checks they agree): warps per gemv block, output features per
# gemv block (gridDim.x), rows of A per gemv block (gridDim.y), weights per load on the vec path,
# weights per thread of the dequantization.
GEMV_WARPS = 4
GEMV_FEATURES = 4
GEMV_MAX_ROWS = 8
GEMV_CHUNK = 8
DEQUANT_PER_THREAD = 8
# Short name -> CUDA element type, for A, bias, out and the dequantized weight.
DTYPES = {"f32": "float", "f16": "__half", "bf16": "__nv_bfloat16"}


def _gemv(dt: str, ctype: str, vec: bool) -> Kernel:
    return Kernel(
        name=f"gemv_4bit_{dt}_{'vec' if vec else 'any'}",
        source=SOURCE,
        expr=f"gemv_4bit<{ctype}, {'true' if vec else 'false'}>",
        params=(
            f"const {ctype}*",  # A [M, K]
            "const unsigned char*",  # B, packed codes
            "const float*",  # absmax, one per block
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
        params=("const unsigned char*", "const float*", "const float*", f"{ctype}*", "long long", "int"),
    )


KERNELS = [
    *(_gemv(dt, ctype, vec) for dt, ctype in DTYPES.items() for vec in (True, False)),
    *(_dequant(dt, ctype) for dt, ctype in DTYPES.items()),
    Kernel(
        name="expand_nested_absmax",
        source=SOURCE,
        expr="expand_nested_absmax",
        params=("const unsigned char*", "const float*", "const float*", "const float*", "float*", "long long"),
    ),
]
