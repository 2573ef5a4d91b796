"""Kernel table of metal/matmul_4bit.metal: gemv_4bit on the packed 4-bit weight.

One template instance per element type. Its buffers are listed here once; the explicit instantiations at
the end of matmul_4bit.metal are generated from ``INSTANCES`` (tables/_generate.py).
"""

from __future__ import annotations

from ._generate import Instance, kernels
from ._quantize import ELEMENT_TYPES

SOURCE = "matmul_4bit.metal"

# Launch geometry shared by the kernel and ops/matmul_4bit.py (a test reads the #defines of the source).
GEMV_FEATURES = 4  # output features per gemv threadgroup (BNB_GEMV_FEATURES)
GEMV_ROWS = 4  # rows of A per gemv threadgroup (BNB_GEMV_ROWS)
GEMV_THREADS = 128  # threads per gemv threadgroup, splitting K (at most BNB_GEMV_MAX_SIMDGROUPS * 32)

# template -> the largest threadgroup ops/matmul_4bit.py launches it with: its [[max_total_threads_per_threadgroup]].
MAX_THREADS = {"gemv_4bit": GEMV_THREADS}

INSTANCES = {
    f"gemv_4bit_{sfx}": Instance(
        "gemv_4bit",
        t,
        (
            ("A", f"device const {t}*"),
            ("B", "device const uchar*"),
            ("absmax", "device const float*"),
            ("code", "device const float*"),
            ("out", f"device {t}*"),
            ("M", "constant long&"),
            ("N", "constant long&"),
            ("K", "constant long&"),
            ("blocksize", "constant long&"),
            ("words", "constant long&"),
            ("bias", "device const float*"),
            ("has_bias", "constant long&"),
        ),
        (
            ("uint2", "tg", "threadgroup_position_in_grid"),
            ("uint", "lid", "thread_index_in_threadgroup"),
            ("uint2", "tg_size", "threads_per_threadgroup"),
            ("uint", "sg", "simdgroup_index_in_threadgroup"),
            ("uint", "lane", "thread_index_in_simdgroup"),
            ("uint", "sg_count", "simdgroups_per_threadgroup"),
        ),
    )
    for sfx, t in ELEMENT_TYPES.items()
}

KERNELS = kernels(SOURCE, INSTANCES, MAX_THREADS)
