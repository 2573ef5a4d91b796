"""Linear4bit (QLoRA's 4-bit linear layer) and its NF4 / FP4 shorthands.

Build it (on any device, meta included), load dense weights, then move it to a device: the move
quantizes the weight. Or load a quantized state_dict, into a freshly built module too. Forward never
changes the weight, so train and eval mode give the same result and ``state_dict()`` is a pure read.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from .. import _checks as c
from ..autograd._matmul_4bit import linear_4bit
from ._state_dict4bit import load_4bit_weight, save_4bit_weight
from .params4bit import Keeps4bitWeightState, Params4bit, packed_weight_and_state

# Upstream's module path: users filter or silence bitsandbytes' module messages by this name.
logger = logging.getLogger("bitsandbytes.nn.modules")

_HALF_DTYPES = (torch.float16, torch.bfloat16)


def computes_half_input_in_fp32(compute_dtype: torch.dtype | None, x: torch.Tensor) -> bool:
    """Whether a 16-bit input takes the slow float32 path: ``compute_dtype=torch.float32`` (transformers'
    default ``bnb_4bit_compute_dtype``), or, as upstream warns, a float16 input with no compute_dtype."""
    if x.dtype not in _HALF_DTYPES:
        return False
    return compute_dtype == torch.float32 or (compute_dtype is None and x.dtype == torch.float16)


def slow_compute_message(x: torch.Tensor) -> str:
    what = "inference." if x.numel() == x.shape[-1] else "inference or training speed."
    return (
        f"Input type into Linear4bit is {x.dtype}, but bnb_4bit_compute_dtype=torch.float32 (default). "
        f"This will lead to slow {what}"
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

    def _warn_if_slow(self, x: torch.Tensor) -> None:
        # Once per module, and only in eager calls: neither logging nor warnings can be traced by
        # torch.compile (fullgraph=True would fail), and the condition is static for a compiled graph.
        if torch.compiler.is_compiling() or getattr(self, "_warned_slow_compute", False):
            return
        if computes_half_input_in_fp32(self.compute_dtype, x):
            self._warned_slow_compute = True
            logger.warning(slow_compute_message(x))

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
        self._warn_if_slow(x)
        inp_dtype = x.dtype
        if self.compute_dtype is not None:
            x = x.to(self.compute_dtype)
        # The bias goes in its own dtype (the parameter is never cast in place); linear_4bit rounds it
        # the same way eager and compiled.
        return linear_4bit(x, weight, qs, self.bias).to(inp_dtype)


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
