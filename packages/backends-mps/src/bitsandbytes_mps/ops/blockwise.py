"""8-bit blockwise quantization on MPS (metal/blockwise.metal): quantize_blockwise, dequantize_blockwise.

Validation is the core's (the reference's errors); outputs are allocated by torch on the input's device;
the launch geometry of every kernel is computed here and in ops/_quantize.py, nowhere else (what each
kernel needs is stated above it in metal/blockwise.metal). A kernel the loaded library lacks (bfloat
before macOS 14) sends the op to the core's reference kernel, on the same device.
"""

from __future__ import annotations

import torch

from bitsandbytes import _checks
from bitsandbytes._ops import check_quantize_blockwise
from bitsandbytes._reference import REFERENCE
from bitsandbytes.backends import kit

from .. import library
from ..tables.blockwise import MAP_THREADS, SOURCE
from ._common import suffix
from ._quantize import as_bytes, dequantize_geometry, quantize_geometry, served

__all__ = ["OPS"]

SOURCES = (SOURCE,)


def sorted_code_map(code: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The 8-bit map's float32 midpoints in value order (256; the last unused) and each sorted slot's code."""
    mids = torch.empty(256, dtype=torch.float32, device=code.device)
    order = torch.empty(256, dtype=torch.uint8, device=code.device)
    library.dispatch("quant_map_prepare", code.contiguous(), mids, order, threads=MAP_THREADS, group_size=MAP_THREADS)
    return mids, order


def quantize_blockwise(A: torch.Tensor, code: torch.Tensor, blocksize: int) -> tuple[torch.Tensor, torch.Tensor]:
    check_quantize_blockwise(A, code, blocksize)
    name = f"quantize_blockwise_{suffix(A.dtype)}"
    if not served(name, A.numel(), blocksize):
        return REFERENCE["quantize_blockwise"](A, code, blocksize)
    n = A.numel()
    out = A.new_empty(A.shape, dtype=torch.uint8)
    absmax = A.new_empty(_checks.n_blocks(n, blocksize), dtype=torch.float32)
    if n:
        mids, order = sorted_code_map(code)
        threads, size = quantize_geometry(n, blocksize)
        flat = A.contiguous().reshape(-1)
        library.dispatch(name, flat, mids, order, out.view(-1), absmax, n, blocksize, threads=threads, group_size=size)
    return out, absmax


def dequantize_blockwise_into(A, absmax, code, blocksize, dtype, out) -> None:
    """The kernel of dequantize_blockwise and its ``.out``: the values of A into ``out`` (contiguous)."""
    n = A.numel()
    if n:
        threads, size = dequantize_geometry(n)
        library.dispatch(
            f"dequantize_blockwise_{suffix(dtype)}",
            as_bytes(A),
            absmax.contiguous(),
            code.contiguous(),
            out.view(-1),
            n,
            blocksize,
            threads=threads,
            group_size=size,
        )


def _dequantize_served(A, absmax, code, blocksize, dtype) -> bool:
    return served(f"dequantize_blockwise_{suffix(dtype)}", A.numel(), blocksize)


# The op and its .out from the one kernel (kit.out_pair: the check, out=, the reference where not served).
_DEQUANTIZE = kit.out_pair("dequantize_blockwise", dequantize_blockwise_into, native=_dequantize_served)
dequantize_blockwise = _DEQUANTIZE["dequantize_blockwise"]
dequantize_blockwise_out = _DEQUANTIZE["dequantize_blockwise.out"]


# op name -> implementation (registered for "mps" by the plugin, for "cpu" by the emulated test plugin).
OPS = {"quantize_blockwise": quantize_blockwise, **_DEQUANTIZE}
