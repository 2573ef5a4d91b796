"""Kernel table of the blockwise family (csrc/kernels/blockwise.cu): 8-bit blockwise quantization.

The block size is a kernel argument, not a template parameter: it only sets the thread-group size and
a shift, so one instance per element type serves every block size the core accepts.
"""

from __future__ import annotations

from . import Kernel

SOURCE = "blockwise.cu"

# Suffix used in kernel names -> the C element type of the floating-point tensors.
ELEMENT_TYPES = {"f32": "float", "f16": "__half", "bf16": "__nv_bfloat16"}

KERNELS = [
    Kernel(
        name="quant_map_prepare",
        source=SOURCE,
        expr="quant_map_prepare",
        params=("const float*", "float*", "unsigned char*"),
    )
]
for _sfx, _t in ELEMENT_TYPES.items():
    KERNELS += [
        Kernel(
            name=f"quantize_blockwise_{_sfx}",
            source=SOURCE,
            expr=f"quantize_blockwise<{_t}>",
            params=(
                f"const {_t}*",
                "const float*",
                "const unsigned char*",
                "unsigned char*",
                "float*",
                "long long",
                "int",
            ),
        ),
        Kernel(
            name=f"dequantize_blockwise_{_sfx}",
            source=SOURCE,
            expr=f"dequantize_blockwise<{_t}>",
            params=("const unsigned char*", "const float*", "const float*", f"{_t}*", "long long", "int"),
        ),
    ]
