"""gemv_4bit and gemm_4bit on MPS: the fused kernel of metal/matmul_4bit.metal, and for many rows the
weight dequantized by fourbit.metal then torch.matmul.

Validation is the core's (the reference's errors); outputs are allocated by torch on the input's device;
the launch geometry of the gemv kernel is computed here and nowhere else (what it needs is stated above
it in metal/matmul_4bit.metal). A kernel the loaded library lacks (bfloat before macOS 14) sends the op to
the core's reference kernel, on the same device.

gemm_4bit with many rows is dequantize + torch.matmul on purpose: the product is compute-bound, and
PyTorch's MPS matmul (MPSGraph / Metal Performance Shaders, simdgroup-matrix tiles) is what a hand-written
dequantizing GEMM would have to beat on every Apple GPU generation; the extra pass over the weight is
amortised over the rows. With few rows (decoding; the core's one-row product of a double-quantized
weight comes here), where the weight's bytes dominate, it is the gemv_4bit kernel: one fused pass that
reads each weight byte once per GEMV_ROWS rows.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from math import prod

import torch

from bitsandbytes import _checks, _formats
from bitsandbytes._ops import check_gemm_4bit
from bitsandbytes._reference import REFERENCE
from bitsandbytes.backends import kit

from .. import library
from ..tables.matmul_4bit import GEMV_FEATURES, GEMV_ROWS, GEMV_THREADS, SOURCE
from ._common import native, placeholder, suffix
from ._quantize import as_bytes, dequantize_geometry
from .blockwise import dequantize_blockwise_into
from .fourbit import dequantize_4bit_into

__all__ = ["OPS"]

# gemm_4bit's other kernels (fourbit.metal, blockwise.metal) are checked one by one at the call: when one
# is absent the call runs on the reference.
SOURCES = (SOURCE,)


# Rows of A up to which gemm_4bit runs the gemv kernel; above, dequantize + torch.matmul. UNMEASURED (no
# Mac here): two threadgroup rows of the kernel (each reads the weight once, 0.5 byte a weight) against
# the dense path's 4.5 bytes a weight (write and read an fp16 weight, read the packed one). Bytes alone
# would move the crossover to ~36 rows; the kernel's fp32 FMAs (no simdgroup matrices) keep it low.
GEMM_FUSED_MAX_ROWS = 2 * GEMV_ROWS


@functools.cache
def _table(quant_type: str, device: torch.device) -> torch.Tensor:
    """The 16-entry float32 table of ``quant_type`` on ``device``, made once (no copy in the hot path)."""
    return _formats.code_table(quant_type, device).float().contiguous()


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
    Bb = as_bytes(B)
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


def _gemv_kernel(A, B, shapeB, absmax, code, blocksize, out) -> None:
    """The kernel of gemv_4bit and its ``.out`` (after the op's check)."""
    N, K = shapeB
    _gemv(A, B, N, K, absmax, code, blocksize, out)


def _gemv_served(A, B, shapeB, absmax, code, blocksize) -> bool:
    return native(f"gemv_4bit_{suffix(A.dtype)}", _gemv_threads(shapeB[0]))


# The op and its .out from the one kernel (kit.out_pair: the check, out=, the reference where not served).
_GEMV = kit.out_pair("gemv_4bit", _gemv_kernel, native=_gemv_served)
gemv_4bit = _GEMV["gemv_4bit"]
gemv_4bit_out = _GEMV["gemv_4bit.out"]


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
        blocksize_8bit = _formats.DOUBLE_QUANT_BLOCKSIZE
        dequantize_blockwise_into(absmax_8bit, absmax, absmax_code, blocksize_8bit, torch.float32, scales)
        absmax = scales + absmax_offset.reshape(()).float()
    if fused:
        out = torch.empty((*A.shape[:-1], N), dtype=A.dtype, device=A.device)
        _gemv(A, B, N, K, absmax, _table(quant_type, A.device), blocksize, out, bias)
        return out
    W = torch.empty((N, K), dtype=A.dtype, device=A.device)  # the reference's weight, rounded to A's dtype
    dequantize_4bit_into(B, absmax, blocksize, quant_type, (N, K), A.dtype, W)
    if bias is None:
        return torch.matmul(A, W.T)
    return torch.nn.functional.linear(A, W, bias)


# op name -> implementation (registered for "mps" by the plugin, for "cpu" by the emulated test plugin).
OPS = {**_GEMV, "gemm_4bit": gemm_4bit}
