"""Kernel table of metal/fourbit.metal: 4-bit NF4/FP4 quantization and dequantization.

Each kernel is a template instance per element type and 4-bit format. Its buffers are listed here once;
the explicit instantiations at the end of fourbit.metal are generated from ``INSTANCES``
(tables/_generate.py).
"""

from __future__ import annotations

from ._generate import Instance, kernels
from ._quantize import DEQUANT_THREADS, ELEMENT_TYPES, N_BLOCKSIZE, QUANT_MAX_THREADS, QUANTIZE_POSITIONS

SOURCE = "fourbit.metal"

# 4-bit format -> the QT template argument in fourbit.metal.
FORMATS = {"nf4": 0, "fp4": 1}

# template -> the largest threadgroup ops/fourbit.py launches it with: its [[max_total_threads_per_threadgroup]].
MAX_THREADS = {"quantize_4bit": QUANT_MAX_THREADS, "dequantize_4bit": DEQUANT_THREADS}

INSTANCES: dict[str, Instance] = {}
for _sfx, _t in ELEMENT_TYPES.items():
    for _qt, _qv in FORMATS.items():
        INSTANCES[f"quantize_4bit_{_qt}_{_sfx}"] = Instance(
            "quantize_4bit",
            f"{_t}, {_qv}",
            (("A", f"device const {_t}*"), ("out", "device uchar*"), ("absmax", "device float*"), *N_BLOCKSIZE),
            QUANTIZE_POSITIONS,
        )
        INSTANCES[f"dequantize_4bit_{_qt}_{_sfx}"] = Instance(
            "dequantize_4bit",
            f"{_t}, {_qv}",
            (("A", "device const uchar*"), ("absmax", "device const float*"), ("out", f"device {_t}*"), *N_BLOCKSIZE),
            (("uint", "gid", "thread_position_in_grid"),),
        )

KERNELS = kernels(SOURCE, INSTANCES, MAX_THREADS)
