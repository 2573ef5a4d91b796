"""What the quantizer tables share, as metal/quantize.h shares it between blockwise.metal and fourbit.metal:
the launch geometry of the quantizers and dequantizers (ops/_quantize.py computes it; a test reads the
#defines of quantize.h), the element types and the quantizers' position attributes."""

from __future__ import annotations

# Kernel-name suffix -> MSL element type of the floating-point tensors.
ELEMENT_TYPES = {"f32": "float", "f16": "half", "bf16": "bfloat"}

QUANT_ITEMS = 8  # values per thread in the quantizers (BNB_QUANT_ITEMS)
QUANT_MIN_THREADS = 256  # least threads per threadgroup of the quantizers
DEQUANT_ITEMS = 8  # values per thread in the dequantizers (BNB_DEQUANT_ITEMS)
DEQUANT_THREADS = 256  # threads per threadgroup of the dequantizers
QUANT_MAX_BLOCKSIZE = 4096  # the largest block size (bitsandbytes._checks.BLOCKSIZES; a test compares)
QUANT_MAX_THREADS = max(QUANT_MIN_THREADS, QUANT_MAX_BLOCKSIZE // QUANT_ITEMS)  # a quantizer's largest group

# The quantizers' position attributes, after their buffers: (MSL type, parameter name, attribute).
QUANTIZE_POSITIONS = (
    ("uint", "tg", "threadgroup_position_in_grid"),
    ("uint", "lid", "thread_index_in_threadgroup"),
    ("uint", "tg_size", "threads_per_threadgroup"),
    ("uint", "sg", "simdgroup_index_in_threadgroup"),
    ("uint", "lane", "thread_index_in_simdgroup"),
)
# The element count and block size every quantizer and dequantizer takes after its buffers.
N_BLOCKSIZE = (("n", "constant long&"), ("blocksize", "constant long&"))
