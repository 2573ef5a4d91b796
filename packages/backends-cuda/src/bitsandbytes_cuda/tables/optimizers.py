"""Kernels of csrc/kernels/optimizers.cu (the 32-bit and 8-bit blockwise optimizer steps)."""

from __future__ import annotations

from . import Kernel

SOURCE = "optimizers.cu"
THREADS = 256  # threads per block of every optimizer kernel (kBlock in optimizers.cuh: one 8-bit state block)

# dtype suffix -> C element type of g and p
FLOATS = {"f32": "float", "f16": "__half", "bf16": "__nv_bfloat16"}

# rule, flags, n, then the step's scalars (the Hyper struct of optimizers.cuh, in order)
HYPER = ("int", "int", "long long") + ("float",) * 16

KERNELS = [
    Kernel("optimizer_32bit_norm_total", SOURCE, "optimizer_32bit_norm_total",
           ("const float*", "int", "int", "float*")),
]  # fmt: skip
for sfx, t in FLOATS.items():
    KERNELS += [
        Kernel(f"optimizer_32bit_norm_{sfx}", SOURCE, f"optimizer_32bit_norm<{t}>",
               (f"const {t}*", "const float*", "const float*", "float*", *HYPER, "float", "float")),
        Kernel(f"optimizer_32bit_{sfx}", SOURCE, f"optimizer_32bit<{t}>",
               (f"const {t}*", f"{t}*", "float*", "float*", "const float*", *HYPER, "float")),
        Kernel(f"optimizer_8bit_blockwise_{sfx}", SOURCE, f"optimizer_8bit_blockwise<{t}>",
               (f"const {t}*", f"{t}*", "unsigned char*", "unsigned char*", "float*", "float*", "const float*",
                "const float*", *HYPER)),
    ]  # fmt: skip
