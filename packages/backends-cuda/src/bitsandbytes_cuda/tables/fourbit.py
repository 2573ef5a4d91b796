"""Kernel table of the fourbit family (csrc/kernels/fourbit.cu): 4-bit NF4/FP4 blockwise quantization.

As in the blockwise family, the block size is a kernel argument: one instance per element type and format.
"""

from __future__ import annotations

from . import Kernel
from .blockwise import ELEMENT_TYPES

SOURCE = "fourbit.cu"

# 4-bit format -> the QuantType4 template argument in fourbit.cu.
QUANT_TYPES = {"nf4": 0, "fp4": 1}

KERNELS = []
for _sfx, _t in ELEMENT_TYPES.items():
    for _qt, _qv in QUANT_TYPES.items():
        KERNELS += [
            Kernel(
                name=f"quantize_4bit_{_qt}_{_sfx}",
                source=SOURCE,
                expr=f"quantize_4bit<{_t}, {_qv}>",
                params=(f"const {_t}*", "unsigned char*", "float*", "long long", "int"),
            ),
            Kernel(
                name=f"dequantize_4bit_{_qt}_{_sfx}",
                source=SOURCE,
                expr=f"dequantize_4bit<{_t}, {_qv}>",
                params=("const unsigned char*", "const float*", f"{_t}*", "long long", "int"),
            ),
        ]
