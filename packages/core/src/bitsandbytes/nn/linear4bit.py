"""Linear4bit (QLoRA's 4-bit linear layer) and its NF4 / FP4 shorthands.

Build it (on any device, meta included), load dense weights, then move it to a device: the move
quantizes the weight. Or load a quantized state_dict, into a freshly built module too. Forward never
changes the weight, so train and eval mode give the same result and ``state_dict()`` is a pure read.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from .. import _checks as c
from ..autograd._matmul_4bit import matmul_4bit
from ._state_dict4bit import load_4bit_weight, save_4bit_weight
from .params4bit import Keeps4bitWeightState, Params4bit, packed_weight_and_state

_warned_fp16_compute = False


def _warn_fp16_input_once(single_row: bool) -> None:
    global _warned_fp16_compute
    if _warned_fp16_compute:
        return
    _warned_fp16_compute = True
    what = "inference" if single_row else "inference or training"
    warnings.warn(
        "Input type into Linear4bit is torch.float16, but bnb_4bit_compute_dtype=torch.float32 (default). "
        f"This will lead to slow {what}; set compute_dtype=torch.float16.",
        UserWarning,
        stacklevel=3,
    )


class Linear4bit(Keeps4bitWeightState, nn.Linear):
    """A linear layer whose weight is stored as 4-bit NF4/FP4 codes (``Params4bit``).

    ``compute_dtype`` is the dtype the product is computed in; when None it is taken from the first
    input (float32 and bfloat16 inputs compute in their own dtype). The output has the input's dtype.
    """

    def __init__(
        self,
        input_features,
        output_features,
        bias=True,
        compute_dtype=None,
        compress_statistics=True,
        quant_type="fp4",
        quant_storage=torch.uint8,
        device=None,
    ):
        if compute_dtype is not None:
            c.dtype_arg("compute_dtype", compute_dtype, c.FLOAT_DTYPES)
        c.quant_type(quant_type)
        c.dtype_arg("quant_storage", quant_storage, c.QUANT_STORAGE_DTYPES)
        super().__init__(input_features, output_features, bias, device)
        self.weight = Params4bit(
            self.weight.data,
            requires_grad=False,
            compress_statistics=compress_statistics,
            quant_type=quant_type,
            quant_storage=quant_storage,
            module=self,
        )
        self.compute_dtype = compute_dtype
        self.compute_type_is_set = compute_dtype is not None
        self.quant_state = None
        self.quant_storage = quant_storage
        # Upstream's forward reads this to decide whether to repack the weight in place for its CPU
        # kernel. Ours never repacks; False keeps upstream from doing it to a module pickled here.
        self.support_avx512bf16_for_cpu = False

    def set_compute_type(self, x: torch.Tensor) -> None:
        if x.dtype in (torch.float32, torch.bfloat16):
            # The input's dtype is safe to compute in, and avoids casting every call.
            self.compute_dtype = x.dtype
        elif x.dtype == torch.float16 and self.compute_dtype in (None, torch.float32):
            _warn_fp16_input_once(x.numel() == x.shape[-1])

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        save_4bit_weight(self, destination, prefix, keep_vars)

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ):
        shape = (self.out_features, self.in_features)
        assign = bool(local_metadata.get("assign_to_params_buffers", False))
        handled = load_4bit_weight(self, state_dict, prefix, shape, error_msgs, assign)
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )
        if handled and prefix + "weight" in missing_keys:
            missing_keys.remove(prefix + "weight")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c.tensor("x", x)
        if not x.is_floating_point():
            raise TypeError(f"{type(self).__name__} input must be a floating point tensor; got {x.dtype}")
        # Under FSDP the weight is a plain tensor of the gathered packed bytes; the module holds its state.
        weight, qs = packed_weight_and_state(self)
        if x.device != weight.device:
            raise ValueError(
                f"{type(self).__name__} input is on {x.device} but the weight is on {weight.device}; "
                "move the input or the module"
            )
        if not self.compute_type_is_set:
            self.set_compute_type(x)
            self.compute_type_is_set = True
        inp_dtype = x.dtype
        if self.compute_dtype is not None:
            x = x.to(self.compute_dtype)
        bias = self.bias
        if bias is not None and bias.dtype != x.dtype:
            bias = bias.to(x.dtype)  # a differentiable cast: the parameter itself is left alone
        return matmul_4bit(x, weight, quant_state=qs, bias=bias).to(inp_dtype)


class LinearFP4(Linear4bit):
    """Linear4bit with the FP4 format."""

    def __init__(
        self,
        input_features,
        output_features,
        bias=True,
        compute_dtype=None,
        compress_statistics=True,
        quant_storage=torch.uint8,
        device=None,
    ):
        super().__init__(
            input_features, output_features, bias, compute_dtype, compress_statistics, "fp4", quant_storage, device
        )


class LinearNF4(Linear4bit):
    """Linear4bit with the NF4 format (levels at equal-probability quantiles of a normal distribution)."""

    def __init__(
        self,
        input_features,
        output_features,
        bias=True,
        compute_dtype=None,
        compress_statistics=True,
        quant_storage=torch.uint8,
        device=None,
    ):
        super().__init__(
            input_features, output_features, bias, compute_dtype, compress_statistics, "nf4", quant_storage, device
        )


# Pickled models name upstream's location, so they load under either implementation.
for _cls in (Linear4bit, LinearFP4, LinearNF4):
    _cls.__module__ = "bitsandbytes.nn.modules"
