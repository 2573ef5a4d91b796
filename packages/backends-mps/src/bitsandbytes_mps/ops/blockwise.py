"""8-bit blockwise quantization on MPS (metal/blockwise.metal): quantize_blockwise, dequantize_blockwise.

Validation is the core's (the reference's errors); outputs are allocated by torch on the input's device;
the launch geometry of every kernel is computed here and in ops/_quantize.py, nowhere else (what each
kernel needs is stated above it in metal/blockwise.metal). A kernel the loaded library lacks (bfloat
before macOS 14) sends the op to the core's reference kernel, on the same device.
"""

from __future__ import annotations

import torch

from bitsandbytes import _checks
from bitsandbytes._ops import check_dequantize_blockwise, check_quantize_blockwise

from .. import library
from ..tables.blockwise import MAP_THREADS, SOURCE
from ._common import suffix
from ._quantize import as_bytes, dequantize_geometry, fallback, quantize_geometry

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
    if ref := fallback("quantize_blockwise", name, A.numel(), blocksize):
        return ref(A, code, blocksize)
    n = A.numel()
    out = torch.empty(A.shape, dtype=torch.uint8, device=A.device)
    absmax = torch.empty(_checks.n_blocks(n, blocksize), dtype=torch.float32, device=A.device)
    if n:
        mids, order = sorted_code_map(code)
        threads, size = quantize_geometry(n, blocksize)
        flat = A.contiguous().reshape(-1)
        library.dispatch(name, flat, mids, order, out.view(-1), absmax, n, blocksize, threads=threads, group_size=size)
    return out, absmax


def dequantize_blockwise_into(A, absmax, code, blocksize, out) -> None:
    n = A.numel()
    if n:
        threads, size = dequantize_geometry(n)
        library.dispatch(
            f"dequantize_blockwise_{suffix(out.dtype)}",
            as_bytes(A),
            absmax.contiguous(),
            code.contiguous(),
            out,
            n,
            blocksize,
            threads=threads,
            group_size=size,
        )


def dequantize_blockwise(
    A: torch.Tensor, absmax: torch.Tensor, code: torch.Tensor, blocksize: int, dtype: torch.dtype
) -> torch.Tensor:
    check_dequantize_blockwise(A, absmax, code, blocksize, dtype)
    if ref := fallback("dequantize_blockwise", f"dequantize_blockwise_{suffix(dtype)}", A.numel(), blocksize):
        return ref(A, absmax, code, blocksize, dtype)
    out = torch.empty(A.shape, dtype=dtype, device=A.device)
    dequantize_blockwise_into(A, absmax, code, blocksize, out.view(-1))
    return out


def dequantize_blockwise_out(
    A: torch.Tensor, absmax: torch.Tensor, code: torch.Tensor, blocksize: int, dtype: torch.dtype, out: torch.Tensor
) -> None:
    check_dequantize_blockwise(A, absmax, code, blocksize, dtype)
    _checks.out_tensor(out, A.shape, dtype, A.device, reads={"A": A, "absmax": absmax, "code": code})
    if ref := fallback("dequantize_blockwise.out", f"dequantize_blockwise_{suffix(dtype)}", A.numel(), blocksize):
        return ref(A, absmax, code, blocksize, dtype, out)
    dequantize_blockwise_into(A, absmax, code, blocksize, out.view(-1))  # out_tensor: contiguous


# op name -> implementation (registered for "mps" by the plugin, for "cpu" by the emulated test plugin).
OPS = {
    "quantize_blockwise": quantize_blockwise,
    "dequantize_blockwise": dequantize_blockwise,
    "dequantize_blockwise.out": dequantize_blockwise_out,
}
