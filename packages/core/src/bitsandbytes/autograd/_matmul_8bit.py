"""LLM.int8() matrix multiplication with autograd: ``bitsandbytes.matmul`` and its state.

``matmul(A, B)`` computes ``A @ B.T (+ bias)`` where ``B`` is a weight ``[N, K]``: either floating point
(quantized per row on the fly, ``has_fp16_weights=True``) or already int8 codes held in
``state.CB``/``state.SCB``. Two routes, chosen as upstream 0.50 chooses them (``_uses_float_route``):

- LLM.int8() (``MatMul8bitLt``): activations quantized per row to int8 (from float16, as upstream);
  with ``threshold > 0`` the activation columns holding a value of magnitude ``>= threshold`` are
  multiplied in floating point instead (outlier decomposition). Evaluation mode everywhere, and
  training mode on every device type but CPU and XPU.
- Float (``MatMul8bitFp``): the unquantized activations times the dequantized int8 weight, in A's
  dtype; no threshold, no outliers. Training mode (``state.is_training``) on CPU and XPU.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from .. import functional as F

__all__ = ["GlobalOutlierPooler", "MatMul8bitFp", "MatMul8bitLt", "MatmulLtState", "matmul"]

_INV127 = 1.0 / 127.0


class GlobalOutlierPooler:
    """Process-wide set of outlier dimensions pooled across layers of one model width."""

    _instance = None

    def __init__(self):
        raise RuntimeError("Call GlobalOutlierPooler.get_instance() instead")

    def initialize(self):
        self.outliers = set()
        self.model_dim = None

    @classmethod
    def get_instance(cls):
        if cls._instance is None:
            cls._instance = cls.__new__(cls)
            cls._instance.initialize()
        return cls._instance

    def add_outliers(self, outlier_idx, feature_dim):
        if self.model_dim is None:
            self.model_dim = feature_dim
        if feature_dim != self.model_dim:
            return  # only layers of the model width are pooled (not the second FFN layer)
        self.outliers.update(outlier_idx.tolist())

    def get_current_outlier_idx(self):
        return torch.tensor(sorted(self.outliers), dtype=torch.int64)


@dataclass
class MatmulLtState:
    """What ``matmul`` keeps between calls for one weight: its int8 codes ``CB`` and row scales ``SCB``."""

    force_no_igemmlt: bool = False
    CB: torch.Tensor | None = None
    SB: torch.Tensor | None = None
    SCB: torch.Tensor | None = None
    SBt: torch.Tensor | None = None
    CBt: torch.Tensor | None = None
    subB: torch.Tensor | None = None
    outlier_pool: GlobalOutlierPooler | None = None
    has_accumulated_gradients: bool = False
    threshold: float = 0.0
    idx: torch.Tensor | None = None
    is_training: bool = True
    has_fp16_weights: bool = True
    use_pool: bool = False
    # Which floating-point weight CB/SCB were computed from (storage, version, shape): re-quantized
    # whenever the weight changes, never otherwise.
    _source: tuple | None = None

    # Removed layouts; upstream still answers None for them (TGI, vLLM read them).
    _deprecated_fields = frozenset({"CxB", "CxBt", "formatB", "_tile_indices"})

    def __getattr__(self, name):
        if name in MatmulLtState._deprecated_fields:
            warnings.warn(
                f"MatmulLtState.{name} is deprecated and always None (only the row-major layout exists)",
                FutureWarning,
                stacklevel=2,
            )
            return None
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def reset_grads(self):
        self.CB = None
        self.SB = None
        self.SCB = None
        self.SBt = None
        self.CBt = None
        self._source = None


def _weight_codes(B: torch.Tensor, state: MatmulLtState) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 codes and float32 row scales of the weight, from ``state`` or by quantizing ``B``."""
    if state.has_fp16_weights or state.CB is None or state.SCB is None:
        if B.dtype == torch.int8:
            if state.SCB is None:
                raise ValueError("B is int8 codes but state.SCB (its row scales) is None")
            state.CB = B.detach()
            return state.CB, state.SCB
        source = (B.untyped_storage().data_ptr(), B.storage_offset(), B._version, tuple(B.shape), B.device)
        if state.CB is None or state.SCB is None or state._source != source:
            state.CB, state.SCB, _ = F.int8_vectorwise_quant(B.detach().contiguous().to(torch.float16))
            state._source = source
    return state.CB, state.SCB


def _frozen_codes(state: MatmulLtState) -> torch.Tensor | None:
    """``state.CB`` when it alone defines the weight (frozen int8 weight with its scales), else None."""
    if state.has_fp16_weights or state.CB is None or state.SCB is None:
        return None
    return state.CB


def _check_inputs(A: torch.Tensor, B: torch.Tensor, bias: torch.Tensor | None, state: MatmulLtState) -> bool:
    """Checks the operands; returns whether ``B`` is the ``[K, N]`` view of the frozen weight ``state.CB``."""
    if not isinstance(A, torch.Tensor) or not A.is_floating_point():
        raise TypeError(f"A must be a floating-point tensor; got {getattr(A, 'dtype', type(A).__name__)}")
    if not isinstance(B, torch.Tensor):
        raise TypeError(f"B must be a torch.Tensor, got {type(B).__name__}")
    if B.dim() != 2:
        raise ValueError(f"B must be a 2-D weight [out_features, in_features]; got shape {tuple(B.shape)}")
    CB = _frozen_codes(state)
    transposed = False
    if CB is not None:
        # The weight is state.CB; B only has to be it or its transpose, as upstream reads B from the
        # state then (test_matmullt passes CB.t()).
        N, K = CB.shape
        if tuple(B.shape) not in ((N, K), (K, N)):
            raise ValueError(f"B must be state.CB's shape {(N, K)} or its transpose {(K, N)}; got {tuple(B.shape)}")
        transposed = tuple(B.shape) != (N, K)
        if A.dim() < 1 or A.shape[-1] != K:
            raise ValueError(f"A's last dimension must equal state.CB.shape[1] ({K}); got A of shape {tuple(A.shape)}")
    else:
        N = B.shape[0]
        if A.dim() < 1 or A.shape[-1] != B.shape[1]:
            raise ValueError(
                f"A's last dimension must equal B.shape[1] ({B.shape[1]}); got A of shape {tuple(A.shape)}"
            )
    if A.device != B.device:
        raise ValueError(f"A and B must be on the same device; got {A.device} and {B.device}")
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != N):
        raise ValueError(f"bias must have shape ({N},); got {tuple(bias.shape)}")
    return transposed


def _dequantized(CB: torch.Tensor, SCB: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``CB * SCB / 127`` rounded to ``dtype`` (the scale product in float32, as upstream)."""
    return CB.to(dtype, copy=True).mul_(SCB.unsqueeze(1).mul(_INV127))


class MatMul8bitLt(torch.autograd.Function):
    """``A @ B.T + bias`` with int8 activations and weights (LLM.int8()); gradients for A, B and bias.

    The gradient of A uses the dequantized weight; the gradient of a floating-point B is the int8
    product of the column-quantized output gradient and activations (outlier columns in floating point).
    """

    @staticmethod
    def forward(ctx, A, B, out=None, bias=None, state=None):
        state = state or MatmulLtState()
        ctx.B_transposed = _frozen_codes(state) is not None and tuple(B.shape) != tuple(state.CB.shape)
        CB, SCB = _weight_codes(B, state)
        N, K = CB.shape
        ctx.state = state
        ctx.shape_A, ctx.dtype_A, ctx.dtype_B = A.shape, A.dtype, B.dtype
        ctx.dtype_bias = None if bias is None else bias.dtype
        ctx.is_empty = A.numel() == 0
        if ctx.is_empty:
            ctx.save_for_backward(CB, SCB, None, None, None, None)
            return A.new_empty((*A.shape[:-1], N))

        A2 = A.reshape(-1, K)
        A16 = A2.to(torch.float16)
        CAt = SCAt = None
        if ctx.needs_input_grad[1]:
            CA, CAt, SCA, SCAt, outliers = F.int8_double_quant(A16, threshold=state.threshold)
        else:
            CA, SCA, outliers = F.int8_vectorwise_quant(A16, threshold=state.threshold)

        subA = None
        if state.threshold > 0.0:
            state.idx = outliers
            output, subA = torch.ops.bitsandbytes.int8_mixed_scaled_mm.default(A2, CA, CB, SCA, SCB, outliers, bias)
            if CAt is not None and outliers is not None and outliers.numel():
                # The outlier columns enter the weight gradient through subA, in full precision.
                CAt[:, outliers] = 0
        else:
            output = torch.ops.bitsandbytes.int8_scaled_mm.default(CA, CB, SCA, SCB, bias=bias, dtype=A.dtype)

        ctx.save_for_backward(CB, SCB, CAt, SCAt, subA, state.idx if subA is not None else None)
        return output.reshape(*A.shape[:-1], N)

    @staticmethod
    def backward(ctx, grad_output):
        need_A, need_B, _, need_bias, _ = ctx.needs_input_grad
        CB, SCB, CAt, SCAt, subA, idx = ctx.saved_tensors
        N = CB.shape[0]
        if ctx.is_empty:
            grad_A = torch.zeros(ctx.shape_A, dtype=ctx.dtype_A, device=grad_output.device) if need_A else None
            grad_B = torch.zeros((N, CB.shape[1]), dtype=ctx.dtype_B, device=grad_output.device) if need_B else None
            grad_bias = torch.zeros(N, dtype=ctx.dtype_bias, device=grad_output.device) if need_bias else None
            if grad_B is not None and ctx.B_transposed:
                grad_B = grad_B.t()
            return grad_A, grad_B, None, grad_bias, None

        g = grad_output.reshape(-1, N)
        grad_A = grad_B = grad_bias = None
        if need_bias:
            grad_bias = g.sum(0, dtype=ctx.dtype_bias)
        if need_A:
            grad_A = (g.to(ctx.dtype_A) @ _dequantized(CB, SCB, ctx.dtype_A)).reshape(ctx.shape_A)
        if need_B:
            _, Cg_col, _, Sg_col, _ = F.int8_double_quant(g.to(torch.float16))
            gB = torch.ops.bitsandbytes.int8_scaled_mm.default(
                Cg_col.t().contiguous(), CAt.t().contiguous(), Sg_col, SCAt, dtype=torch.float32
            )
            if subA is not None and subA.numel():
                gB[:, idx] += g.t().float() @ subA.float()
            grad_B = gB.to(ctx.dtype_B)
            if ctx.B_transposed:
                grad_B = grad_B.t()
        return grad_A, grad_B, None, grad_bias, None


class MatMul8bitFp(torch.autograd.Function):
    """``A @ dequant(B).T + bias`` in A's dtype: the weight quantized to int8, the activations not.

    ``matmul`` takes it in training mode on CPU and XPU, as upstream. ``threshold`` plays no part (no
    activation is quantized, so none is an outlier) and ``state.idx`` is left as it is. Gradients:
    A's is ``grad @ dequant(B)``, B's (a trainable floating-point weight) the dense ``grad.T @ A``,
    the bias's the sum of ``grad`` over rows in the bias's dtype.
    """

    @staticmethod
    def forward(ctx, A, B, out=None, bias=None, state=None):
        state = state or MatmulLtState()
        ctx.B_transposed = _frozen_codes(state) is not None and tuple(B.shape) != tuple(state.CB.shape)
        CB, SCB = _weight_codes(B, state)
        ctx.shape_A, ctx.dtype_A, ctx.dtype_B = A.shape, A.dtype, B.dtype
        ctx.dtype_bias = None if bias is None else bias.dtype
        # The int8 codes, not the dequantized weight: a quarter (fp32: an eighth) of the memory kept
        # for backward, which recomputes the weight as upstream does.
        ctx.save_for_backward(A if ctx.needs_input_grad[1] else None, CB, SCB)
        W = _dequantized(CB, SCB, A.dtype)
        return torch.nn.functional.linear(A, W, None if bias is None else bias.to(A.dtype))

    @staticmethod
    def backward(ctx, grad_output):
        need_A, need_B, _, need_bias, _ = ctx.needs_input_grad
        A, CB, SCB = ctx.saved_tensors
        g = grad_output.reshape(-1, grad_output.shape[-1])
        grad_A = grad_B = grad_bias = None
        if need_bias:
            grad_bias = g.sum(0, dtype=ctx.dtype_bias)
        if need_A:
            grad_A = (g.to(ctx.dtype_A) @ _dequantized(CB, SCB, ctx.dtype_A)).reshape(ctx.shape_A)
        if need_B:
            grad_B = (g.t() @ A.reshape(-1, A.shape[-1]).to(g.dtype)).to(ctx.dtype_B)
            if ctx.B_transposed:
                grad_B = grad_B.t()
        return grad_A, grad_B, None, grad_bias, None


# Upstream 0.50 computes training-mode products on these device types with MatMul8bitFp (its
# reason: without fast int8 quantization kernels there, LLM.int8() makes fine-tuning slow). We
# follow it for drop-in behaviour: a CPU/XPU training step gives upstream's numbers (its accuracy
# tests run modules in their default training mode on CPU and hold to bounds LLM.int8() cannot
# meet). The cost is that a module in training mode there no longer computes what it computes in
# evaluation mode; see docs/pages/api/nn8bit.md.
_FLOAT_TRAINING_DEVICE_TYPES = ("cpu", "xpu")


def _uses_float_route(state: MatmulLtState, device_type: str) -> bool:
    """Whether ``matmul`` takes MatMul8bitFp (True) or LLM.int8() MatMul8bitLt for this state and device."""
    return bool(state.is_training) and device_type in _FLOAT_TRAINING_DEVICE_TYPES


def matmul(
    A: torch.Tensor,
    B: torch.Tensor,
    out: torch.Tensor | None = None,
    state: MatmulLtState | None = None,
    threshold=0.0,
    bias: torch.Tensor | None = None,
):
    """``A @ B.T + bias`` with an int8 weight, with autograd (routes: see the module docstring).

    Args:
        A: activations ``[..., K]``, float16/bfloat16/float32; the result has A's dtype.
        B: the weight ``[N, K]``: floating point, or int8 codes when ``state`` holds ``SCB``. When
            ``state`` holds a frozen weight (``CB`` and ``SCB`` set, ``has_fp16_weights=False``), that
            weight is used and ``B`` may be ``CB`` or its ``[K, N]`` transpose, as upstream.
        out: optional tensor the result is copied into (and returned).
        state: a MatmulLtState kept across calls (a fresh one when None, whose ``is_training`` is
            True: on CPU/XPU that is the float route, as upstream). Linear8bitLt sets
            ``state.is_training`` from its ``training`` flag on each forward.
        threshold: outlier threshold; when > 0 it is stored into ``state``.
        bias: optional ``[N]`` of any floating dtype: LLM.int8() adds it in float32 before rounding to
            A's dtype, the float route in A's dtype.
    """
    state = state or MatmulLtState()
    if threshold > 0.0:
        state.threshold = threshold
    _check_inputs(A, B, bias, state)
    route = MatMul8bitFp if _uses_float_route(state, A.device.type) else MatMul8bitLt
    result = route.apply(A, B, None, bias, state)
    if out is not None:
        return out.copy_(result)
    return result
