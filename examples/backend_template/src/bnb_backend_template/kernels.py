"""The kernels, in NumPy: stand-ins for a backend's own native code (C++, CUDA, SYCL ...).

Each kernel has the op's schema (``bitsandbytes._ops.SCHEMAS``), calls the op's contract first so
that bad input raises exactly what it raises on every other device, and returns what the formats
specify (docs: formats.md), checked by the conformance suite against the reference kernel. Ops left
out here keep running on the core's reference kernels. An overload is an op of its own: ``kit.out_pair``
makes ``dequantize_4bit`` and ``dequantize_4bit.out`` from one kernel that writes into ``out``.
"""

from __future__ import annotations

from collections.abc import Callable
from math import prod

import numpy as np
import torch

import bitsandbytes.functional as F
from bitsandbytes._ops import check_int8_vectorwise_dequant
from bitsandbytes.backends import kit

# LLM.int8() dequantization multiplies by this fp32 constant (1/127 rounded to fp32), not divides by 127.
INT8_SCALE = np.float32(1 / 127)

# The 16 values of each 4-bit type, indexed by code, as float32.
TABLES = {q: F.get_4bit_type(q, device="cpu").numpy() for q in ("nf4", "fp4")}


def int8_vectorwise_dequant(A: torch.Tensor, stats: torch.Tensor) -> torch.Tensor:
    """int8 codes, one fp32 absmax per row (all but the last dimension) -> fp32 ``A * stats / 127``."""
    check_int8_vectorwise_dequant(A, stats)
    cols = A.shape[-1]
    rows = prod(A.shape[:-1])
    codes = A.contiguous().numpy().reshape(rows, cols)
    scales = stats.contiguous().numpy().reshape(rows, 1)
    # Same order of fp32 products as the reference (codes * stat, then * scale): equal bit for bit.
    with np.errstate(invalid="ignore"):  # 0 * inf = nan is the specified result for a non-finite row
        values = codes.astype(np.float32) * scales * INT8_SCALE
    return torch.from_numpy(values).reshape(A.shape)


def _dequantize_4bit_into(A, absmax, blocksize, quant_type, shape, dtype, out: torch.Tensor) -> None:
    """Packed NF4/FP4 codes (two per byte, first in the high nibble) -> ``table[code] * absmax`` in ``dtype``,
    written into ``out`` (already checked by ``kit.out_pair``: the op's result shape and dtype)."""
    n = out.numel()
    # The codes are bytes whatever quant_storage dtype carries them.
    raw = A.contiguous().reshape(-1).view(torch.uint8).numpy()[: (n + 1) // 2]
    codes = np.empty(2 * raw.size, dtype=np.uint8)
    codes[0::2] = raw >> 4
    codes[1::2] = raw & 0x0F
    scales = np.repeat(absmax.contiguous().numpy(), blocksize)[:n]
    with np.errstate(invalid="ignore"):  # 0 * inf = nan is the specified result for a non-finite block
        values = TABLES[quant_type][codes[:n]] * scales
    # One rounding from fp32 to dtype, by torch: NumPy has no bfloat16.
    out.copy_(torch.from_numpy(values).reshape(out.shape))


# op -> kernel: what load() registers for the cpu, and what the tests expect to run natively.
KERNELS: dict[str, Callable] = {
    "int8_vectorwise_dequant": int8_vectorwise_dequant,
    **kit.out_pair("dequantize_4bit", _dequantize_4bit_into),
}
