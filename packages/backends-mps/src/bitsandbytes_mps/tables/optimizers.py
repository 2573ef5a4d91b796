"""Kernels of metal/optimizers.metal (the 32-bit and 8-bit blockwise optimizer steps)."""

from __future__ import annotations

from . import Kernel

SOURCE = "optimizers.metal"
THREADS = 256  # threads per threadgroup of every optimizer kernel (kBlock: one 8-bit state block)

# dtype suffix -> Metal element type of g and p
FLOATS = {"f32": "float", "f16": "half", "bf16": "bfloat"}

# The step's float32 scalars and its integers, each bound as one array (see the .metal file's h*/c* indices).
_HYPER = ("hyper", "constant float*")
_CONFIG = ("config", "constant long*")

KERNELS = [
    Kernel("optimizer_32bit_norm_total", SOURCE,
           (("partials", "device const float*"), ("unorm", "device float*"), _CONFIG), THREADS),
]  # fmt: skip
for sfx, t in FLOATS.items():
    KERNELS += [
        Kernel(f"optimizer_32bit_norm_{sfx}", SOURCE,
               (("g", f"device const {t}*"), ("state1", "device const float*"), ("state2", "device const float*"),
                ("partials", "device float*"), _HYPER, _CONFIG), THREADS),
        Kernel(f"optimizer_32bit_{sfx}", SOURCE,
               (("g", f"device const {t}*"), ("p", f"device {t}*"), ("state1", "device float*"),
                ("state2", "device float*"), ("unorm", "device const float*"), _HYPER, _CONFIG), THREADS),
        Kernel(f"optimizer_8bit_blockwise_{sfx}", SOURCE,
               (("g", f"device const {t}*"), ("p", f"device {t}*"), ("state1", "device uchar*"),
                ("state2", "device uchar*"), ("absmax1", "device float*"), ("absmax2", "device float*"),
                ("qmap1", "device const float*"), ("qmap2", "device const float*"), _HYPER, _CONFIG), THREADS),
    ]  # fmt: skip
