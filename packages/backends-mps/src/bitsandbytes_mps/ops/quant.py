"""The quant family on MPS: 8-bit blockwise and 4-bit NF4/FP4 (de)quantization, gemv_4bit, gemm_4bit.

Validation is the core's (the reference's errors); outputs are allocated by torch on the input's device;
the launch geometry of every kernel is computed here and nowhere else (what each kernel needs is stated
above it in metal/quant.metal). A kernel the loaded library lacks (bfloat before macOS 14) sends the op
to the core's reference kernel, on the same device.

gemm_4bit with many rows is dequantize + torch.matmul on purpose: the product is compute-bound, and
PyTorch's MPS matmul (MPSGraph / Metal Performance Shaders, simdgroup-matrix tiles) is what a hand-written
dequantizing GEMM would have to beat on every Apple GPU generation; the extra pass over the weight is
amortised over the rows. With few rows (decoding; the core's one-row product of a double-quantized
weight comes here), where the weight's bytes dominate, it is the gemv_4bit kernel: one fused pass that
reads each weight byte once per GEMV_ROWS rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from math import prod

import torch

from bitsandbytes import _checks, _formats
from bitsandbytes._ops import (
    check_dequantize_4bit,
    check_dequantize_blockwise,
    check_gemm_4bit,
    check_gemv_4bit,
    check_quantize_4bit,
    check_quantize_blockwise,
)
from bitsandbytes._reference import REFERENCE

from .. import library
from ..tables.quant import (
    DEQUANT_ITEMS,
    DEQUANT_THREADS,
    GEMV_FEATURES,
    GEMV_ROWS,
    GEMV_THREADS,
    MAP_THREADS,
    QUANT_ITEMS,
    QUANT_MIN_THREADS,
)
from ._common import native, placeholder, suffix

__all__ = ["OPS"]

SOURCES = ("quant.metal",)


def _fallback(op: str, kernel: str, threads: int = 0, blocksize: int | None = None) -> Callable | None:
    """The reference kernel of ``op`` when ``kernel`` is not loaded (or ``threads`` is past 32-bit
    positions, or ``blocksize`` is one the kernels do not cover), else None."""
    if blocksize is not None and blocksize not in _checks.BLOCKSIZES:
        return REFERENCE[op]
    return None if native(kernel, threads) else REFERENCE[op]


def quantize_geometry(n: int, blocksize: int) -> tuple[int, int]:
    """(threads, group_size) of a quantizer: blocksize / QUANT_ITEMS threads per quantization block,
    threadgroups of max(QUANT_MIN_THREADS, that) threads, as many as the blocks need."""
    group = blocksize // QUANT_ITEMS
    size = max(QUANT_MIN_THREADS, group)
    groups = _checks.n_blocks(_checks.n_blocks(n, blocksize), size // group)
    return groups * size, size


def dequantize_geometry(n: int) -> tuple[int, int]:
    """(threads, group_size) of a dequantizer: DEQUANT_ITEMS consecutive values per thread (n > 0), in whole
    threadgroups of DEQUANT_THREADS (a uniform grid: dequantize_blockwise copies its map with a stride of
    the threadgroup size, which a partial edge threadgroup would make Metal's choice; the threads past n
    return)."""
    return _checks.n_blocks(_checks.n_blocks(n, DEQUANT_ITEMS), DEQUANT_THREADS) * DEQUANT_THREADS, DEQUANT_THREADS


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """A tensor's bytes as flat uint8, whatever dtype stores them (no copy when contiguous)."""
    return t.contiguous().reshape(-1).view(torch.uint8)


# ------------------------------------------------------------------------------------------- 8-bit


def sorted_code_map(code: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The 8-bit map's float32 midpoints in value order (256; the last unused) and each sorted slot's code."""
    mids = torch.empty(256, dtype=torch.float32, device=code.device)
    order = torch.empty(256, dtype=torch.uint8, device=code.device)
    library.dispatch("quant_map_prepare", code.contiguous(), mids, order, threads=MAP_THREADS, group_size=MAP_THREADS)
    return mids, order


def quantize_blockwise(A: torch.Tensor, code: torch.Tensor, blocksize: int) -> tuple[torch.Tensor, torch.Tensor]:
    check_quantize_blockwise(A, code, blocksize)
    name = f"quantize_blockwise_{suffix(A.dtype)}"
    if ref := _fallback("quantize_blockwise", name, A.numel(), blocksize):
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


def _dequantize_blockwise_into(A, absmax, code, blocksize, out) -> None:
    n = A.numel()
    if n:
        threads, size = dequantize_geometry(n)
        library.dispatch(
            f"dequantize_blockwise_{suffix(out.dtype)}",
            _bytes(A),
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
    if ref := _fallback("dequantize_blockwise", f"dequantize_blockwise_{suffix(dtype)}", A.numel(), blocksize):
        return ref(A, absmax, code, blocksize, dtype)
    out = torch.empty(A.shape, dtype=dtype, device=A.device)
    _dequantize_blockwise_into(A, absmax, code, blocksize, out.view(-1))
    return out


def dequantize_blockwise_out(
    A: torch.Tensor, absmax: torch.Tensor, code: torch.Tensor, blocksize: int, dtype: torch.dtype, out: torch.Tensor
) -> None:
    check_dequantize_blockwise(A, absmax, code, blocksize, dtype)
    _checks.out_tensor(out, A.shape, dtype, A.device, reads={"A": A, "absmax": absmax, "code": code})
    if ref := _fallback("dequantize_blockwise.out", f"dequantize_blockwise_{suffix(dtype)}", A.numel(), blocksize):
        return ref(A, absmax, code, blocksize, dtype, out)
    _dequantize_blockwise_into(A, absmax, code, blocksize, out.view(-1))  # out_tensor: contiguous


# ------------------------------------------------------------------------------------------- 4-bit


def quantize_4bit(
    A: torch.Tensor, blocksize: int, quant_type: str, quant_storage: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    check_quantize_4bit(A, blocksize, quant_type, quant_storage)
    name = f"quantize_4bit_{quant_type}_{suffix(A.dtype)}"
    if ref := _fallback("quantize_4bit", name, A.numel()):
        return ref(A, blocksize, quant_type, quant_storage)
    n = A.numel()
    # The kernel writes bytes; quant_storage is only a view of them.
    packed = torch.empty(_checks.packed_4bit_bytes(n), dtype=torch.uint8, device=A.device)
    absmax = torch.empty(_checks.n_blocks(n, blocksize), dtype=torch.float32, device=A.device)
    if n:
        threads, size = quantize_geometry(n, blocksize)
        flat = A.contiguous().reshape(-1)
        library.dispatch(name, flat, packed, absmax, n, blocksize, threads=threads, group_size=size)
    return packed.view(quant_storage).reshape(_formats.packed_4bit_shape(n, quant_storage)), absmax


def _dequantize_4bit_into(A, absmax, blocksize, quant_type, out) -> None:
    n = out.numel()
    if n:
        threads, size = dequantize_geometry(n)
        library.dispatch(
            f"dequantize_4bit_{quant_type}_{suffix(out.dtype)}",
            _bytes(A),
            absmax.contiguous(),
            out,
            n,
            blocksize,
            threads=threads,
            group_size=size,
        )


def dequantize_4bit(
    A: torch.Tensor, absmax: torch.Tensor, blocksize: int, quant_type: str, shape: Sequence[int], dtype: torch.dtype
) -> torch.Tensor:
    dims = check_dequantize_4bit(A, absmax, blocksize, quant_type, shape, dtype)
    if ref := _fallback("dequantize_4bit", f"dequantize_4bit_{quant_type}_{suffix(dtype)}", prod(dims)):
        return ref(A, absmax, blocksize, quant_type, shape, dtype)
    out = torch.empty(dims, dtype=dtype, device=A.device)
    _dequantize_4bit_into(A, absmax, blocksize, quant_type, out.view(-1))
    return out


def dequantize_4bit_out(
    A: torch.Tensor,
    absmax: torch.Tensor,
    blocksize: int,
    quant_type: str,
    shape: Sequence[int],
    dtype: torch.dtype,
    out: torch.Tensor,
) -> None:
    dims = check_dequantize_4bit(A, absmax, blocksize, quant_type, shape, dtype)
    _checks.out_tensor(out, dims, dtype, A.device, reads={"A": A, "absmax": absmax})
    if ref := _fallback("dequantize_4bit.out", f"dequantize_4bit_{quant_type}_{suffix(dtype)}", prod(dims)):
        return ref(A, absmax, blocksize, quant_type, shape, dtype, out)
    _dequantize_4bit_into(A, absmax, blocksize, quant_type, out.view(-1))


# ------------------------------------------------------------------------------------------ matmul


# Rows of A up to which gemm_4bit runs the gemv kernel; above, dequantize + torch.matmul. UNMEASURED (no
# Mac here): two threadgroup rows of the kernel (each reads the weight once, 0.5 byte a weight) against
# the dense path's 4.5 bytes a weight (write and read an fp16 weight, read the packed one). Bytes alone
# would move the crossover to ~36 rows; the kernel's fp32 FMAs (no simdgroup matrices) keep it low.
GEMM_FUSED_MAX_ROWS = 2 * GEMV_ROWS

_TABLES: dict[tuple[str, torch.device], torch.Tensor] = {}


def _table(quant_type: str, device: torch.device) -> torch.Tensor:
    """The 16-entry float32 table of ``quant_type`` on ``device``, made once (no copy in the hot path)."""
    key = (quant_type, device)
    t = _TABLES.get(key)
    if t is None:
        t = _TABLES[key] = _formats.code_table(quant_type, device).float().contiguous()
    return t


def _rows(A: torch.Tensor, K: int) -> int:
    return A.numel() // K if K else prod(A.shape[:-1])


def _gemv_threads(N: int) -> int:
    """Threads along x of a gemv launch: a threadgroup of GEMV_THREADS per GEMV_FEATURES output features."""
    return _checks.n_blocks(N, GEMV_FEATURES) * GEMV_THREADS


def gemv_reads_words(Bb: torch.Tensor, K: int) -> bool:
    """Whether gemv may load the weight's bytes as 32-bit words: whole words per row (K % 8 == 0) and a
    word-aligned binding (torch binds a tensor's buffer at its storage offset)."""
    return K % 8 == 0 and Bb.storage_offset() % 4 == 0


def _gemv_into(A, B, N, K, absmax, code, blocksize, out, bias=None) -> None:
    """out[..., N] = A[..., K] @ W.T (+ bias) by the fused kernel (any M, N, K > 0); ``out`` flat and
    contiguous."""
    M = A.numel() // K
    Bb = _bytes(B)
    words = int(gemv_reads_words(Bb, K))
    # The kernel adds the bias in float32 before its one rounding to A's dtype, as the reference.
    b = placeholder(A.device) if bias is None else bias.contiguous().float()
    library.dispatch(
        f"gemv_4bit_{suffix(A.dtype)}",
        A.contiguous().reshape(-1),
        Bb,
        absmax.contiguous(),
        code.contiguous(),
        out,
        M,
        N,
        K,
        blocksize,
        words,
        b,
        int(bias is not None),
        threads=(_gemv_threads(N), _checks.n_blocks(M, GEMV_ROWS)),
        group_size=(GEMV_THREADS, 1),
    )


def _gemv(A, B, N, K, absmax, code, blocksize, out, bias=None) -> None:
    if out.numel() == 0:
        return
    if K == 0:
        if bias is None:
            out.zero_()
        else:
            out.copy_(bias.expand_as(out))
        return
    _gemv_into(A, B, N, K, absmax, code, blocksize, out.view(-1), bias)


def gemv_4bit(
    A: torch.Tensor, B: torch.Tensor, shapeB: Sequence[int], absmax: torch.Tensor, code: torch.Tensor, blocksize: int
) -> torch.Tensor:
    N, K = check_gemv_4bit(A, B, shapeB, absmax, code, blocksize)
    if ref := _fallback("gemv_4bit", f"gemv_4bit_{suffix(A.dtype)}", _gemv_threads(N)):
        return ref(A, B, shapeB, absmax, code, blocksize)
    out = torch.empty((*A.shape[:-1], N), dtype=A.dtype, device=A.device)
    _gemv(A, B, N, K, absmax, code, blocksize, out)
    return out


def gemv_4bit_out(
    A: torch.Tensor,
    B: torch.Tensor,
    shapeB: Sequence[int],
    absmax: torch.Tensor,
    code: torch.Tensor,
    blocksize: int,
    out: torch.Tensor,
) -> None:
    N, K = check_gemv_4bit(A, B, shapeB, absmax, code, blocksize)
    _checks.out_tensor(
        out, (*A.shape[:-1], N), A.dtype, A.device, reads={"A": A, "B": B, "absmax": absmax, "code": code}
    )
    if ref := _fallback("gemv_4bit.out", f"gemv_4bit_{suffix(A.dtype)}", _gemv_threads(N)):
        return ref(A, B, shapeB, absmax, code, blocksize, out)
    _gemv(A, B, N, K, absmax, code, blocksize, out)


def gemm_4bit(
    A: torch.Tensor,
    B: torch.Tensor,
    shapeB: Sequence[int],
    absmax: torch.Tensor,
    blocksize: int,
    quant_type: str,
    bias: torch.Tensor | None = None,
    absmax_8bit: torch.Tensor | None = None,
    absmax_code: torch.Tensor | None = None,
    absmax_offset: torch.Tensor | None = None,
) -> torch.Tensor:
    N, K = check_gemm_4bit(A, B, shapeB, absmax, blocksize, quant_type, bias, absmax_8bit, absmax_code, absmax_offset)
    fused = _rows(A, K) <= GEMM_FUSED_MAX_ROWS
    if fused:
        kernels = [(f"gemv_4bit_{suffix(A.dtype)}", _gemv_threads(N))]
    else:
        kernels = [(f"dequantize_4bit_{quant_type}_{suffix(A.dtype)}", N * K)]
    if absmax_8bit is not None:
        kernels.append(("dequantize_blockwise_f32", dequantize_geometry(max(absmax_8bit.numel(), 1))[0]))
    if not all(native(k, threads) for k, threads in kernels):
        return REFERENCE["gemm_4bit"](
            A, B, shapeB, absmax, blocksize, quant_type, bias, absmax_8bit, absmax_code, absmax_offset
        )
    if absmax_8bit is not None:
        # Double quantization: the block scales back in float32, then the offset, as the reference.
        scales = torch.empty(absmax_8bit.numel(), dtype=torch.float32, device=A.device)
        _dequantize_blockwise_into(absmax_8bit, absmax, absmax_code, _formats.DOUBLE_QUANT_BLOCKSIZE, scales)
        absmax = scales + absmax_offset.reshape(()).float()
    if fused:
        out = torch.empty((*A.shape[:-1], N), dtype=A.dtype, device=A.device)
        _gemv(A, B, N, K, absmax, _table(quant_type, A.device), blocksize, out, bias)
        return out
    W = torch.empty((N, K), dtype=A.dtype, device=A.device)  # the reference's weight, rounded to A's dtype
    _dequantize_4bit_into(B, absmax, blocksize, quant_type, W.view(-1))
    if bias is None:
        return torch.matmul(A, W.T)
    return torch.nn.functional.linear(A, W, bias)


# op name -> implementation (registered for "mps" by the plugin, for "cpu" by the emulated test plugin).
OPS = {
    "quantize_blockwise": quantize_blockwise,
    "dequantize_blockwise": dequantize_blockwise,
    "dequantize_blockwise.out": dequantize_blockwise_out,
    "quantize_4bit": quantize_4bit,
    "dequantize_4bit": dequantize_4bit,
    "dequantize_4bit.out": dequantize_4bit_out,
    "gemv_4bit": gemv_4bit,
    "gemv_4bit.out": gemv_4bit_out,
    "gemm_4bit": gemm_4bit,
}
