"""gemv_4bit / gemm_4bit for device cuda, on the standard packed 4-bit layout (no repacking).

Few rows of A (decoding, up to FUSED_MAX_ROWS): one fused kernel; a block computes GEMV_FEATURES output
features for all rows, its threads splitting K, so the weight is streamed once and every value of A it
loads serves all of the block's features; fp32 accumulation, warp then block reductions. More rows: the
weight is dequantized to A's dtype by a kernel (exactly the reference's rounded weight) and multiplied
by torch's GEMM (cuBLAS: tensor cores, fp32 accumulation), which a hand-written dequantizing GEMM would
have to beat on every arch; at many rows the GEMM's compute dominates and the extra pass over the
weight is amortised. The crossover is not measured yet (no GPU here); FUSED_MAX_ROWS is the issue's
"batch 1..~8". Double-quantized block scales are expanded to fp32 first by a small kernel.
"""

from __future__ import annotations

from math import prod

import torch

from bitsandbytes import _checks, _formats
from bitsandbytes._ops import check_gemm_4bit, check_gemv_4bit

from ..launch import launch
from ..tables.matmul_4bit import DEQUANT_PER_THREAD, GEMV_CHUNK, GEMV_FEATURES, GEMV_MAX_ROWS, GEMV_WARPS
from ._common import suffix

__all__ = ["OPS", "gemm_4bit", "gemv_4bit", "gemv_4bit_out"]

# Rows of A up to which the fused gemv kernel runs; above it, dequantize + torch GEMM.
FUSED_MAX_ROWS = 8
DEQUANT_THREADS = 256
NESTED_THREADS = 256

_TABLES: dict[tuple[str, torch.device], torch.Tensor] = {}


def _table(quant_type: str, device: torch.device) -> torch.Tensor:
    key = (quant_type, device)
    t = _TABLES.get(key)
    if t is None:
        t = _TABLES[key] = _formats.code_table(quant_type, device).float().contiguous()
    return t


def _bytes(B: torch.Tensor) -> torch.Tensor:
    """The packed codes as flat uint8, whatever quant_storage holds them (no copy if contiguous)."""
    return B.contiguous().reshape(-1).view(torch.uint8)


def _gemv_into(A, Bb, M, N, K, absmax, code, blocksize, bias, out) -> None:
    # vec: 16-byte loads of A and 4-byte loads of B (8 weights) at every chunk of every row.
    vec = K % GEMV_CHUNK == 0 and A.data_ptr() % 16 == 0 and Bb.data_ptr() % 4 == 0
    launch(
        f"gemv_4bit_{suffix(A.dtype)}_{'vec' if vec else 'any'}",
        (-(-N // GEMV_FEATURES), -(-M // GEMV_MAX_ROWS)),
        GEMV_WARPS * 32,
        0,
        A,
        Bb,
        absmax,
        code,
        bias,
        out,
        M,
        N,
        K,
        blocksize,
    )


def dequantize_weight(Bb, N, K, absmax, code, blocksize, dtype) -> torch.Tensor:
    """The [N, K] weight in ``dtype``: ``code[c] * absmax[block]`` in fp32, rounded once."""
    W = torch.empty((N, K), dtype=dtype, device=Bb.device)
    n = N * K
    if n:
        grid = -(-n // (DEQUANT_THREADS * DEQUANT_PER_THREAD))
        launch(f"dequantize_4bit_weight_{suffix(dtype)}", grid, DEQUANT_THREADS, 0, Bb, absmax, code, W, n, blocksize)
    return W


def _matmul_into(A, B, N, K, absmax, code, blocksize, bias, out) -> None:
    """out[..., N] = A[..., K] @ W.T (+ bias) in A.dtype, fp32 accumulation."""
    M = A.numel() // K if K else prod(A.shape[:-1])
    if M == 0 or N == 0:
        return
    if K == 0:
        out.copy_(bias.expand_as(out) if bias is not None else torch.zeros_like(out))
        return
    A = A.contiguous()
    Bb = _bytes(B)
    absmax = absmax.contiguous()
    bias = bias.contiguous() if bias is not None else None
    if M <= FUSED_MAX_ROWS:
        _gemv_into(A, Bb, M, N, K, absmax, code, blocksize, bias, out)
    else:
        W = dequantize_weight(Bb, N, K, absmax, code, blocksize, A.dtype)
        A2, out2 = A.reshape(M, K), out.view(M, N)  # out is contiguous (checked or fresh)
        if bias is None:
            torch.mm(A2, W.T, out=out2)
        else:
            torch.addmm(bias, A2, W.T, out=out2)


def gemv_4bit(A, B, shapeB, absmax, code, blocksize) -> torch.Tensor:
    N, K = check_gemv_4bit(A, B, shapeB, absmax, code, blocksize)
    out = torch.empty((*A.shape[:-1], N), dtype=A.dtype, device=A.device)
    _matmul_into(A, B, N, K, absmax, code.contiguous(), blocksize, None, out)
    return out


def gemv_4bit_out(A, B, shapeB, absmax, code, blocksize, out) -> None:
    N, K = check_gemv_4bit(A, B, shapeB, absmax, code, blocksize)
    _checks.out_tensor(
        out, (*A.shape[:-1], N), A.dtype, A.device, reads={"A": A, "B": B, "absmax": absmax, "code": code}
    )
    _matmul_into(A, B, N, K, absmax, code.contiguous(), blocksize, None, out)


def expand_nested_absmax(absmax_8bit, absmax, absmax_code, absmax_offset) -> torch.Tensor:
    """Double-quantized block scales in fp32: ``absmax_code[q] * absmax[j // 256] + offset`` (as the reference)."""
    n = absmax_8bit.numel()
    out = torch.empty(n, dtype=torch.float32, device=absmax_8bit.device)
    if n:
        launch(
            "expand_nested_absmax",
            -(-n // NESTED_THREADS),
            NESTED_THREADS,
            0,
            absmax_8bit.contiguous().reshape(-1),
            absmax.contiguous(),
            absmax_code.contiguous(),
            absmax_offset.float().contiguous().reshape(-1),  # the contract allows fp16/bf16; the kernel reads fp32
            out,
            n,
        )
    return out


def gemm_4bit(
    A, B, shapeB, absmax, blocksize, quant_type, bias=None, absmax_8bit=None, absmax_code=None, absmax_offset=None
) -> torch.Tensor:
    N, K = check_gemm_4bit(A, B, shapeB, absmax, blocksize, quant_type, bias, absmax_8bit, absmax_code, absmax_offset)
    if absmax_8bit is not None:
        absmax = expand_nested_absmax(absmax_8bit, absmax, absmax_code, absmax_offset)
    out = torch.empty((*A.shape[:-1], N), dtype=A.dtype, device=A.device)
    _matmul_into(A, B, N, K, absmax, _table(quant_type, A.device), blocksize, bias, out)
    return out


OPS = {"gemv_4bit": gemv_4bit, "gemv_4bit.out": gemv_4bit_out, "gemm_4bit": gemm_4bit}
