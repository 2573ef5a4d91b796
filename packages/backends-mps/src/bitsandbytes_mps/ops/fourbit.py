"""4-bit NF4/FP4 quantization on MPS (metal/fourbit.metal): quantize_4bit, dequantize_4bit.

Validation is the core's (the reference's errors); outputs are allocated by torch on the input's device;
the launch geometry of every kernel is computed here and in ops/_quantize.py, nowhere else (what each
kernel needs is stated above it in metal/fourbit.metal). A kernel the loaded library lacks (bfloat
before macOS 14) sends the op to the core's reference kernel, on the same device.
"""

from __future__ import annotations

from math import prod

import torch

from bitsandbytes import _checks, _formats
from bitsandbytes._ops import check_quantize_4bit
from bitsandbytes._reference import REFERENCE
from bitsandbytes.backends import kit

from .. import library
from ..tables.fourbit import SOURCE
from ._common import suffix
from ._quantize import as_bytes, dequantize_geometry, quantize_geometry, served

__all__ = ["OPS"]

SOURCES = (SOURCE,)


def quantize_4bit(
    A: torch.Tensor, blocksize: int, quant_type: str, quant_storage: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    check_quantize_4bit(A, blocksize, quant_type, quant_storage)
    name = f"quantize_4bit_{quant_type}_{suffix(A.dtype)}"
    if not served(name, A.numel()):
        return REFERENCE["quantize_4bit"](A, blocksize, quant_type, quant_storage)
    n = A.numel()
    # The kernel writes bytes; quant_storage is only a view of them.
    packed = torch.empty(_checks.packed_4bit_bytes(n), dtype=torch.uint8, device=A.device)
    absmax = torch.empty(_checks.n_blocks(n, blocksize), dtype=torch.float32, device=A.device)
    if n:
        threads, size = quantize_geometry(n, blocksize)
        flat = A.contiguous().reshape(-1)
        library.dispatch(name, flat, packed, absmax, n, blocksize, threads=threads, group_size=size)
    return packed.view(quant_storage).reshape(_formats.packed_4bit_shape(n, quant_storage)), absmax


def dequantize_4bit_into(A, absmax, blocksize, quant_type, shape, dtype, out) -> None:
    """The kernel of dequantize_4bit and its ``.out``: the values of A into ``out`` (contiguous)."""
    n = out.numel()
    if n:
        threads, size = dequantize_geometry(n)
        library.dispatch(
            f"dequantize_4bit_{quant_type}_{suffix(dtype)}",
            as_bytes(A),
            absmax.contiguous(),
            out.view(-1),
            n,
            blocksize,
            threads=threads,
            group_size=size,
        )


def _dequantize_served(A, absmax, blocksize, quant_type, shape, dtype) -> bool:
    return served(f"dequantize_4bit_{quant_type}_{suffix(dtype)}", prod(shape))


# The op and its .out from the one kernel (kit.out_pair: the check, out=, the reference where not served).
_DEQUANTIZE = kit.out_pair("dequantize_4bit", dequantize_4bit_into, native=_dequantize_served)
dequantize_4bit = _DEQUANTIZE["dequantize_4bit"]
dequantize_4bit_out = _DEQUANTIZE["dequantize_4bit.out"]


# op name -> implementation (registered for "mps" by the plugin, for "cpu" by the emulated test plugin).
OPS = {"quantize_4bit": quantize_4bit, **_DEQUANTIZE}
