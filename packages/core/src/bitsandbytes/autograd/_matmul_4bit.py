"""``matmul_4bit``: ``A @ W.T (+ bias)`` for a 4-bit quantized weight ``W``, with an input gradient.

The weight is frozen: no gradient flows to the packed codes. Without autograd the product is one op
(``gemv_4bit`` for a single row of A and a plain state, ``gemm_4bit`` otherwise: its schema takes the
double-quantized scales, which the backends decode where they load them, while ``gemv_4bit``'s would
need them expanded by a launch of their own first); with autograd, ``MatMul4Bit`` runs the same
forward and, in backward, multiplies by the dequantized weight.
"""

from __future__ import annotations

import warnings

import torch

from .. import _checks as c
from .. import _formats
from .. import functional as F
from .._functional.quant import _check_quant_state, _nested_absmax, gemm_takes_nested, nested_gemm_kwargs

_ops = torch.ops.bitsandbytes


def _gemm(A: torch.Tensor, B: torch.Tensor, qs: F.QuantState, bias: torch.Tensor | None) -> torch.Tensor:
    if not qs.nested or not gemm_takes_nested(qs):
        absmax = _nested_absmax(qs) if qs.nested else qs.absmax
        return _ops.gemm_4bit.default(A, B, qs.shape, absmax, qs.blocksize, qs.quant_type, bias=bias)
    return _ops.gemm_4bit.default(
        A, B, qs.shape, qs.state2.absmax, qs.blocksize, qs.quant_type, bias=bias, **nested_gemm_kwargs(qs)
    )


def _empty_result(A: torch.Tensor, qs: F.QuantState, bias: torch.Tensor | None) -> torch.Tensor:
    # A holds no values: no rows, or K == 0. The sum over K's zero terms is 0 (+ bias), as torch's linear
    # gives; upstream returns torch.empty, uninitialized memory whenever there are rows (found by ci/fuzz).
    result = A.new_zeros((*A.shape[:-1], qs.shape[0]))
    return result if bias is None else result.add_(bias.to(A.dtype))


class MatMul4Bit(torch.autograd.Function):
    """Forward ``A @ W.T + bias``; backward gives the gradients of ``A`` and ``bias`` (never of ``W``)."""

    @staticmethod
    def forward(ctx, A, B, out=None, bias=None, quant_state: F.QuantState | None = None):
        ctx.state = quant_state
        ctx.bias_dtype = None if bias is None else bias.dtype
        ctx.A_shape = A.shape
        ctx.B = B if ctx.needs_input_grad[0] else None
        if A.numel() == 0:
            output = _empty_result(A, quant_state, bias)
        else:
            # The kernel takes the bias in A's dtype (linear_4bit passes it in the module's dtype);
            # backward gives the gradient in the bias's own dtype.
            output = _gemm(A, B.reshape(-1, 1), quant_state, None if bias is None else bias.to(A.dtype))
        if out is not None:
            out.copy_(output)
            ctx.mark_dirty(out)
            return out
        return output

    @staticmethod
    def backward(ctx, grad_output):
        need_A, _, _, need_bias, _ = ctx.needs_input_grad
        grad_A = grad_bias = None
        if need_bias:
            grad_bias = grad_output.reshape(-1, grad_output.shape[-1]).sum(0, dtype=ctx.bias_dtype)
        if need_A:
            if grad_output.numel() == 0:
                grad_A = grad_output.new_zeros(ctx.A_shape)
            else:
                W = F.dequantize_4bit(ctx.B.reshape(-1, 1), ctx.state).to(grad_output.dtype)
                grad_A = torch.matmul(grad_output, W)
        return grad_A, None, None, grad_bias, None


def matmul_4bit(
    A: torch.Tensor,
    B: torch.Tensor,
    quant_state: F.QuantState,
    out: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """``A @ dequantize_4bit(B, quant_state).T + bias`` for a weight quantized from shape [N, K].

    ``B`` is the packed weight in any view (``weight`` or ``weight.t()``); ``quant_state.shape`` is
    the source of truth for N and K. ``bias`` must have A's dtype.
    """
    if quant_state is None:
        raise ValueError("quant_state is required: pass the QuantState from quantize_4bit (weight.quant_state)")
    qs = _check_quant_state("quant_state", quant_state)
    if qs.shape is None or len(qs.shape) != 2:
        raise ValueError(f"quant_state.shape must be the 2-D weight shape [N, K]; got {qs.shape}")
    if not isinstance(A, torch.Tensor):
        raise TypeError(f"A must be a torch.Tensor; got {type(A).__name__}")
    N, K = qs.shape
    if A.dim() > 0 and A.shape[-1] == N and N != K:
        # Upstream accepts a weight quantized in [K, N] orientation with a deprecation warning.
        warnings.warn(
            f"matmul_4bit: the weight was quantized from a [K, N] tensor (quant_state.shape={list(qs.shape)}); "
            "quantize the [N, K] (out_features, in_features) weight instead",
            DeprecationWarning,
            stacklevel=2,
        )
        W = F.dequantize_4bit(B.reshape(-1, 1), qs).to(A.dtype)
        result = torch.nn.functional.linear(A, W.t(), bias)
        return out.copy_(result) if out is not None else result

    if bias is not None:
        c.dtype("bias", bias, (A.dtype,))
    return _product(A, B, qs, bias, out)


def linear_4bit(A: torch.Tensor, B: torch.Tensor, quant_state: F.QuantState, bias: torch.Tensor | None) -> torch.Tensor:
    """``matmul_4bit`` for the 4-bit modules: ``bias`` may have any floating dtype (the module's own).

    On the one-row path the bias is added to the kernel's output as it is, never first rounded to A's
    dtype by a separate cast: torch.compile (Inductor) fuses such a cast into the addition and skips
    the rounding, so eager and compiled forwards would round the sum differently.
    """
    qs = _check_quant_state("quant_state", quant_state)
    if bias is not None and not bias.is_floating_point():
        raise TypeError(f"bias must be a floating point tensor; got {bias.dtype}")
    return _product(A, B, qs, bias, None)


def _one_row(A: torch.Tensor, B: torch.Tensor, qs: F.QuantState) -> torch.Tensor:
    # Nested scales go to gemm_4bit, which decodes them in the matmul (no separate expansion); plain
    # ones stay on gemv_4bit, the op upstream calls here (torch.compile traces and clients see it). The
    # same bits either way: the reference expands nested scales exactly as F.gemv_4bit does. gemm_4bit
    # needs the format's name, which gemv_4bit (reading qs.code) does not: a hand-built state may lack it.
    if qs.nested and qs.quant_type in _formats.QUANT_TYPES:
        return _gemm(A, B, qs, None)
    return F.gemv_4bit(A, B, state=qs)


def _product(A, B, qs: F.QuantState, bias: torch.Tensor | None, out: torch.Tensor | None) -> torch.Tensor:
    needs_grad = torch.is_grad_enabled() and (A.requires_grad or (bias is not None and bias.requires_grad))
    if needs_grad:
        return MatMul4Bit.apply(A, B, out, bias, qs)

    B = B.reshape(-1, 1)
    if A.numel() == 0:
        result = _empty_result(A, qs, bias)
    elif A.numel() == A.shape[-1]:  # one row: the inference (token-by-token decoding) fast path
        result = _one_row(A, B, qs)
        if bias is not None:
            result = result.add_(bias)  # computed in the wider of the two dtypes, rounded once to A's
    else:
        result = _gemm(A, B, qs, None if bias is None else bias.to(A.dtype))
    return out.copy_(result) if out is not None else result


MatMul4Bit.__module__ = "bitsandbytes.autograd._functions"
