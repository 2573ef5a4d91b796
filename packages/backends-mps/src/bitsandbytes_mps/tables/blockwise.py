"""Kernel table of metal/blockwise.metal: 8-bit blockwise quantization with a 256-entry map.

Each kernel is a template instance per element type. Its buffers are listed here once; the explicit
instantiations at the end of blockwise.metal are generated from ``INSTANCES`` (tables/_generate.py).
"""

from __future__ import annotations

from ._generate import Instance, kernels
from ._quantize import DEQUANT_THREADS, ELEMENT_TYPES, N_BLOCKSIZE, QUANT_MAX_THREADS, QUANTIZE_POSITIONS

SOURCE = "blockwise.metal"

MAP_THREADS = 256  # quant_map_prepare: one thread per map entry

# template -> the largest threadgroup ops/blockwise.py launches it with: its [[max_total_threads_per_threadgroup]].
MAX_THREADS = {
    "quant_map_prepare": MAP_THREADS,
    "quantize_blockwise": QUANT_MAX_THREADS,
    "dequantize_blockwise": DEQUANT_THREADS,
}

INSTANCES = {
    "quant_map_prepare": Instance(
        "quant_map_prepare",
        "",
        (("code", "device const float*"), ("mids", "device float*"), ("order", "device uchar*")),
        (("uint", "i", "thread_index_in_threadgroup"),),
    )
}
for _sfx, _t in ELEMENT_TYPES.items():
    INSTANCES[f"quantize_blockwise_{_sfx}"] = Instance(
        "quantize_blockwise",
        _t,
        (
            ("A", f"device const {_t}*"),
            ("map_mids", "device const float*"),
            ("map_order", "device const uchar*"),
            ("out", "device uchar*"),
            ("absmax", "device float*"),
            *N_BLOCKSIZE,
        ),
        QUANTIZE_POSITIONS,
    )
    INSTANCES[f"dequantize_blockwise_{_sfx}"] = Instance(
        "dequantize_blockwise",
        _t,
        (
            ("A", "device const uchar*"),
            ("absmax", "device const float*"),
            ("code", "device const float*"),
            ("out", f"device {_t}*"),
            *N_BLOCKSIZE,
        ),
        (
            ("uint", "gid", "thread_position_in_grid"),
            ("uint", "lid", "thread_index_in_threadgroup"),
            ("uint", "tg_size", "threads_per_threadgroup"),
        ),
    )

KERNELS = kernels(SOURCE, INSTANCES, MAX_THREADS)
