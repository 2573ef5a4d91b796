"""4-bit quantization of any module parameter through ``torch.nn.utils.parametrize``.

The parameter is replaced by its packed codes and a ``Bnb4bitParametrization`` that dequantizes it
whenever it is read (for instance expert weights of a mixture-of-experts layer, which are not
``nn.Linear``). Reads during one forward share one dequantization (parametrize's cache), and the
module's state_dict holds ``<name>`` (packed codes) plus ``<name>.<quant_state item>``, the same
layout as Linear4bit.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Literal

import torch
import torch.nn.utils.parametrize as P
from torch import nn

from .. import functional as F


class Bnb4bitParametrization(nn.Module):
    """Dequantizes the packed 4-bit parameter it is registered on, using its QuantState."""

    def __init__(self, quant_state: F.QuantState):
        super().__init__()
        if not isinstance(quant_state, F.QuantState):
            raise TypeError(f"quant_state must be a QuantState; got {type(quant_state).__name__}")
        self.quant_state = quant_state

    @torch.no_grad()
    def forward(self, quantized_param: torch.Tensor) -> torch.Tensor:
        return F.dequantize_4bit(quantized_param, self.quant_state)


def _original_parameter(module: nn.Module, param_name: str) -> nn.Parameter:
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be a torch.nn.Module; got {type(module).__name__}")
    if not hasattr(module, param_name):
        raise AttributeError(f"Module does not have parameter '{param_name}'")
    param = getattr(module, param_name)
    if not isinstance(param, nn.Parameter):
        raise TypeError(f"Parameter '{param_name}' is not an instance of nn.Parameter")
    return param


def replace_parameter_4bit(
    module: nn.Module,
    param_name: str,
    compress_statistics: bool = False,
    quant_type: Literal["nf4", "fp4"] = "nf4",
    blocksize: int | None = None,
) -> None:
    """Quantize ``module.<param_name>`` to 4 bits in place and dequantize it transparently on access.

    Raises AttributeError when the module has no such attribute and TypeError when it is not an
    ``nn.Parameter``. The quantized parameter is frozen.
    """
    param = _original_parameter(module, param_name)
    packed, qs = F.quantize_4bit(
        param.data, blocksize=blocksize, compress_statistics=compress_statistics, quant_type=quant_type
    )
    setattr(module, param_name, nn.Parameter(packed, requires_grad=False))
    del param
    P.register_parametrization(module, param_name, Bnb4bitParametrization(qs), unsafe=True)
    _register_hooks(module, param_name)


def replace_parameter_4bit_prequantized(
    module: nn.Module, param_name: str, qs_dict: dict[str, Any], device: torch.device
) -> None:
    """Attach a dequantizing parametrization to ``module.<param_name>``, which already holds packed codes.

    ``qs_dict`` holds the ``QuantState.as_dict()`` items (packed or not) of those codes.
    """
    _original_parameter(module, param_name)
    qs = F.QuantState.from_dict(qs_dict, device=device)
    P.register_parametrization(module, param_name, Bnb4bitParametrization(qs), unsafe=True)
    _register_hooks(module, param_name)


def _enable_cache(module: nn.Module, inputs: tuple[Any, ...]) -> None:
    P._cache_enabled += 1


def _disable_cache(module: nn.Module, inputs: tuple[Any, ...], output: Any) -> None:
    # Runs even when forward raised (always_call), possibly without the matching pre-hook: never go
    # below zero, or the cache would stay enabled (and grow) for good.
    P._cache_enabled = max(0, P._cache_enabled - 1)
    if not P._cache_enabled:
        P._cache = {}


def _register_hooks(module: nn.Module, param_name: str) -> None:
    module.register_state_dict_post_hook(partial(_state_dict_post_hook, param_name=param_name))
    module.register_forward_pre_hook(_enable_cache)
    module.register_forward_hook(_disable_cache, always_call=True)


def _state_dict_post_hook(
    module: nn.Module, state_dict: dict[str, Any], prefix: str, local_metadata: Any, *, param_name: str = "weight"
) -> None:
    """Store the packed codes as ``<name>`` (not ``parametrizations.<name>.original``) and the quant_state."""
    original_key = f"{prefix}parametrizations.{param_name}.original"
    if original_key not in state_dict:
        return
    state_dict[f"{prefix}{param_name}"] = state_dict.pop(original_key)
    parametrization = next(
        (p for p in module.parametrizations[param_name] if isinstance(p, Bnb4bitParametrization)), None
    )
    if parametrization is None:
        raise RuntimeError(f"{param_name} is parametrized but has no Bnb4bitParametrization")
    for k, v in parametrization.quant_state.as_dict(packed=True).items():
        state_dict[f"{prefix}{param_name}.{k}"] = v
