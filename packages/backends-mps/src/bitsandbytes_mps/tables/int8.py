"""Kernels of metal/int8.metal (LLM.int8() quantization and dequantization)."""

from __future__ import annotations

from . import Kernel

# dtype suffix -> Metal element type
FLOATS = {"f32": "float", "f16": "half", "bf16": "bfloat"}
# The largest threadgroup ops/int8.py launches any of these kernels with (its GROUP).
THREADS = 256

KERNELS = [
    Kernel("int8_vectorwise_dequant", "int8.metal", (
        ("A", "device const char*"), ("stats", "device const float*"), ("out", "device float*"),
        ("scale", "constant float&"), ("rows", "constant long&"), ("cols", "constant long&")), THREADS),
]  # fmt: skip
for sfx, t in FLOATS.items():
    KERNELS += [
        Kernel(f"int8_outlier_cols_{sfx}", "int8.metal", (
            ("A", f"device const {t}*"), ("thr", "constant float&"), ("flags", "device uchar*"),
            ("rows", "constant long&"), ("cols", "constant long&")), THREADS),
        Kernel(f"int8_row_quant_{sfx}", "int8.metal", (
            ("A", f"device const {t}*"), ("thr", "constant float&"), ("outliers", "constant long&"),
            ("flags", "device const uchar*"), ("codes", "device char*"), ("stats", "device float*"),
            ("cols", "constant long&")), THREADS),
        Kernel(f"int8_mm_dequant_{sfx}", "int8.metal", (
            ("A", "device const int*"), ("row_stats", "device const float*"), ("col_stats", "device const float*"),
            ("bias", "device const float*"), ("has_bias", "constant long&"), ("out", f"device {t}*"),
            ("scale", "constant float&"), ("rows", "constant long&"), ("cols", "constant long&")), THREADS),
    ]  # fmt: skip
