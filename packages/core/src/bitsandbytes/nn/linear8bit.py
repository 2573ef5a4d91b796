"""Linear8bitLt (LLM.int8() linear layer) and OutlierAwareLinear."""

from __future__ import annotations

import logging

import torch
from torch import nn

from ..autograd._matmul_8bit import MatmulLtState, matmul
from ..utils import OutlierTracer
from .int8params import Int8Params, Int8WeightIO

logger = logging.getLogger(__name__)

__all__ = ["Linear8bitLt", "OutlierAwareLinear"]


class Linear8bitLt(Int8WeightIO, nn.Linear):
    """Linear layer with an int8 weight: LLM.int8() (int8 activations too, int32 accumulation), or in
    training mode on CPU/XPU, as upstream, the input times the dequantized weight.

    With ``has_fp16_weights=False`` the weight is quantized once, on the first move to a device (or the
    first forward), and is not trainable. With ``has_fp16_weights=True`` it stays floating point and
    trainable and is quantized for each forward in which it changed. ``threshold > 0`` computes the
    activation columns holding a value of magnitude ``>= threshold`` in floating point.

    The route follows ``self.training`` (see ``bitsandbytes.matmul``), so on CPU/XPU train and eval mode
    give different results, as upstream's do. ``state_dict()`` holds ``weight`` (int8),
    ``SCB`` (float32 row scales) and ``weight_format`` (uint8 0 = row-major) once quantized, and
    loads into a module in any state, a freshly built one included.
    """

    _int8_write_format = True

    def __init__(
        self,
        input_features: int,
        output_features: int,
        bias=True,
        has_fp16_weights=True,
        threshold=0.0,
        index=None,
        device=None,
    ):
        super().__init__(input_features, output_features, bias, device)
        self.state = MatmulLtState()
        self.index = index
        self.state.threshold = threshold
        self.state.has_fp16_weights = has_fp16_weights
        if threshold > 0.0 and not has_fp16_weights:
            self.state.use_pool = True
        self.weight = Int8Params(self.weight.data, has_fp16_weights=has_fp16_weights, requires_grad=has_fp16_weights)

    def _int8_holds_fp16(self) -> bool:
        return bool(self.state.has_fp16_weights)

    def init_8bit_state(self):
        """Hand the codes and scales to ``state`` (upstream API; forward keeps both in sync anyway)."""
        self.state.CB = self.weight.CB
        self.state.SCB = self.weight.SCB

    def _sync_state(self) -> None:
        weight = self.weight
        if self.state.has_fp16_weights:
            return
        if weight.dtype != torch.int8:
            if weight.device.type == "meta":
                raise RuntimeError("Linear8bitLt weight is on the meta device; load or move real weights first")
            if not isinstance(weight, Int8Params):
                raise TypeError(f"Linear8bitLt.weight must be an Int8Params; got {type(weight).__name__}")
            weight._quantize(weight.device)  # not moved to a device yet: quantize where it is
        scb = self._int8_scb()
        if scb is None:
            raise RuntimeError("Linear8bitLt weight is int8 but has no row scales (weight.SCB is None)")
        self.state.CB = weight.data
        self.state.SCB = scb

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        # As upstream's Linear8bitLt.to: the state follows the weight at once, not at the next forward.
        weight = self.weight
        if not self.state.has_fp16_weights and weight.dtype == torch.int8 and self._int8_scb() is not None:
            self.state.CB = weight.data
            self.state.SCB = self._int8_scb()
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            raise TypeError(f"x must be a floating-point tensor; got {getattr(x, 'dtype', type(x).__name__)}")
        if x.device != self.weight.device:
            raise ValueError(f"x must be on the weight's device ({self.weight.device}); got {x.device}")
        self.state.is_training = self.training  # picks matmul's route, as upstream
        self._sync_state()
        # Cast a copy: the module (and so its state_dict) keeps the bias as it is.
        bias = self.bias if self.bias is None or self.bias.dtype == x.dtype else self.bias.to(x.dtype)
        return matmul(x, self.weight, bias=bias, state=self.state)


class OutlierAwareLinear(nn.Linear):
    """Base class for linear layers that quantize their weight knowing the outlier input dimensions.

    Subclasses implement ``quantize_weight(w, outlier_idx)`` and ``forward_with_outliers(x, outlier_idx)``;
    the outlier dimensions come from ``OutlierTracer`` (initialize it on the model first).
    """

    def __init__(self, input_features, output_features, bias=True, device=None):
        super().__init__(input_features, output_features, bias, device)
        self.outlier_dim = None
        self.is_quantized = False

    def forward_with_outliers(self, x, outlier_idx):
        raise NotImplementedError("Please override the `forward_with_outliers(self, x, outlier_idx)` function")

    def quantize_weight(self, w, outlier_idx):
        raise NotImplementedError("Please override the `quantize_weight(self, w, outlier_idx)` function")

    def forward(self, x):
        if self.outlier_dim is None:
            tracer = OutlierTracer.get_instance()
            if not tracer.is_initialized():
                logger.warning("Please use OutlierTracer.initialize(model) before using the OutlierAwareLinear layer")
            self.outlier_dim = tracer.get_outliers(self.weight)
        if not self.is_quantized:
            w = self.quantize_weight(self.weight, self.outlier_dim)
            with torch.no_grad():
                self.weight.data.copy_(w)
            self.is_quantized = True
        return self.forward_with_outliers(x, self.outlier_dim)
