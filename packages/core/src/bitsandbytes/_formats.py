"""The 4-bit and 8-bit storage formats: the one place their constants are written down.

Everything that produces or reads quantized bytes (the reference kernels, ``functional``, every
backend through the conformance suite) takes its tables and layout rules from here, so they cannot
drift apart. The values are those of upstream bitsandbytes 0.50, so checkpoints interoperate.

Layout of a 4-bit tensor with ``n`` values:

* the values are taken in row-major order of the flattened tensor and split into blocks of
  ``blocksize`` consecutive values (the last block may be shorter); each block has one float32
  scale, its largest absolute value (``absmax``);
* each value is stored as a 4-bit index into a 16-entry table (NF4 or FP4) of numbers in [-1, 1];
  value ~= table[index] * absmax[block];
* two indices share a byte, the first (even position) in the high nibble; for an odd ``n`` the
  final low nibble holds the code of 0.0 (NF4: 7, FP4: 0), as if one more value 0.0 followed;
* the ``(n + 1) // 2`` bytes are viewed as ``quant_storage`` with shape ``((n + 1) // (2 * itemsize), 1)``.

Double quantization ("compress_statistics") stores the 4-bit absmax itself 8-bit blockwise-quantized
with the signed dynamic map, in blocks of ``DOUBLE_QUANT_BLOCKSIZE``, after subtracting its mean.
"""

from __future__ import annotations

import torch

# NF4 (QLoRA's NormalFloat4): equal-mass quantiles of N(0, 1) scaled to [-1, 1], sorted ascending.
# Index i is the 4-bit code i. Upstream's exact float32 literals (create_normal_map() reproduces them).
NF4_TABLE: tuple[float, ...] = (
    -1.0,
    -0.6961928009986877,
    -0.5250730514526367,
    -0.39491748809814453,
    -0.28444138169288635,
    -0.18477343022823334,
    -0.09105003625154495,
    0.0,
    0.07958029955625534,
    0.16093020141124725,
    0.24611230194568634,
    0.33791524171829224,
    0.44070982933044434,
    0.5626170039176941,
    0.7229568362236023,
    1.0,
)

# FP4 (1 sign, 2 exponent, 1 mantissa bit, exponent bias 2) in *code order*, not value order:
# the magnitude of codes 0..7 is FP4_NUMERATORS[code] / FP4_DIVISOR (divided in float32); bit 3 is the
# sign, so codes 8..15 are the negatives of codes 0..7. Code 8 ("minus zero") holds +0.0 in the table,
# bit for bit as upstream's get_4bit_type (its literal is the integer -0), so code 8 dequantizes to +0.0.
FP4_NUMERATORS: tuple[float, ...] = (0.0, 0.0625, 8.0, 12.0, 4.0, 6.0, 2.0, 3.0)
FP4_DIVISOR = 12.0
FP4_SIGN_BIT = 0b1000

QUANT_TYPES = ("nf4", "fp4")

# Within a byte the value that comes first in memory order sits in the high nibble.
FIRST_VALUE_IN_HIGH_NIBBLE = True
# The value whose code fills the spare low nibble of an odd-length tensor.
PAD_VALUE = 0.0

# Double quantization of the 4-bit absmax: block size of the nested 8-bit quantization.
DOUBLE_QUANT_BLOCKSIZE = 256

# LLM.int8(): codes are round(x * 127 / row_absmax); dequantization multiplies by the scale(s) and these
# float32 constants, upstream's literals (the second is not exactly 1/127**2: 6.2000124e-05).
INT8_DEQUANT_SCALE = 7.874015718698502e-3
INT8_MM_DEQUANT_SCALE = 6.200124e-05

# Block size of the 8-bit optimizer states (fixed by upstream's optimizer state format).
OPTIMIZER_BLOCKSIZE = 256

# Smallest absmax used when *scaling* a block (the stored absmax stays the true value, 0 for an
# all-zero block): keeps an all-zero block finite, 0 * (1 / 1e-38) == 0, instead of 0 / 0.
MIN_SCALE = 1e-38


def _fp4_signed_numerators() -> list[float]:
    # 0.0 - v rather than -v: the negative of 0.0 must stay +0.0 (see FP4_NUMERATORS).
    return [*FP4_NUMERATORS, *(0.0 - v for v in FP4_NUMERATORS)]


def code_table(quant_type: str, device: torch.device | str | None = None) -> torch.Tensor:
    """The 16-entry float32 value table of ``quant_type`` ("nf4" or "fp4"), indexed by 4-bit code."""
    if quant_type == "nf4":
        return torch.tensor(NF4_TABLE, dtype=torch.float32, device=device)
    if quant_type == "fp4":
        # Divide in float32 on purpose: that is how upstream's table is computed, bit for bit.
        return torch.tensor(_fp4_signed_numerators(), dtype=torch.float32, device=device) / FP4_DIVISOR
    raise ValueError(f"quant_type must be 'nf4' or 'fp4'; got {quant_type!r}")


def packed_4bit_numel_bytes(n: int) -> int:
    """Bytes that hold ``n`` 4-bit codes."""
    return (n + 1) // 2


def packed_4bit_shape(n: int, quant_storage: torch.dtype) -> tuple[int, int]:
    """Shape of the packed tensor for ``n`` values stored as ``quant_storage``."""
    return ((n + 1) // (2 * quant_storage.itemsize), 1)
