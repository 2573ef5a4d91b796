"""Kernels of csrc/kernels/int8.cu (LLM.int8() quantization and dequantization)."""

from __future__ import annotations

from . import Kernel

# dtype suffix -> C element type
FLOATS = {"f32": "float", "f16": "__half", "bf16": "__nv_bfloat16"}
ROW_THREADS = 256  # threads per row in int8_row_quant
COL_ROWS = 8  # lanes per column in int8_col_absmax: blocks are (32, COL_ROWS)

KERNELS = [Kernel("int8_vectorwise_dequant", "int8.cu", "int8_vectorwise_dequant",
                  ("const signed char*", "const float*", "float*", "long long", "long long"))]  # fmt: skip
for sfx, t in FLOATS.items():
    KERNELS += [
        Kernel(f"int8_outlier_cols_{sfx}", "int8.cu", f"int8_outlier_cols<{t}>",
               (f"const {t}*", "float", "unsigned char*", "long long", "long long")),
        Kernel(f"int8_row_quant_{sfx}", "int8.cu", f"int8_row_quant<{t}, {ROW_THREADS}>",
               (f"const {t}*", "float", "const unsigned char*", "signed char*", "float*", "long long")),
        Kernel(f"int8_col_absmax_{sfx}", "int8.cu", f"int8_col_absmax<{t}, {COL_ROWS}>",
               (f"const {t}*", "float", "int", "float*", "long long", "long long")),
        Kernel(f"int8_col_quant_{sfx}", "int8.cu", f"int8_col_quant<{t}>",
               (f"const {t}*", "float", "int", "const float*", "signed char*", "long long", "long long")),
        Kernel(f"int8_mm_dequant_{sfx}", "int8.cu", f"int8_mm_dequant<{t}>",
               ("const int*", "const float*", "const float*", "const float*", f"{t}*", "long long", "long long")),
    ]  # fmt: skip
