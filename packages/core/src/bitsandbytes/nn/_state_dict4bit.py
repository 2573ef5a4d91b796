"""Saving and loading a module's 4-bit weight in upstream's state_dict layout.

A quantized ``weight`` is saved as the packed codes under ``<prefix>weight`` plus the items of
``QuantState.as_dict(packed=True)`` under ``<prefix>weight.<item>`` (``absmax``, ``quant_map``, the
``nested_*`` items for double quantization and the JSON blob ``quant_state.bitsandbytes__<type>``).
Loading accepts that layout into any module of the right shape, a freshly built one included, and a
dense float weight of shape ``expected_shape`` as well.
"""

from __future__ import annotations

import torch

from ..functional import QuantState
from .params4bit import Params4bit

_ITEMS = tuple(k for k in QuantState.valid_qs_keys if k != "quant_state")


def save_4bit_weight(module: torch.nn.Module, destination: dict, prefix: str, keep_vars: bool) -> None:
    qs = getattr(module.weight, "quant_state", None)
    if qs is None:
        return
    for k, v in qs.as_dict(packed=True).items():
        destination[prefix + "weight." + k] = v if keep_vars else v.detach()


def _is_quant_key(key: str, wkey: str) -> bool:
    if not key.startswith(wkey + "."):
        return False
    rest = key[len(wkey) + 1 :]
    return rest in _ITEMS or rest.startswith("quant_state.")


def load_4bit_weight(
    module: torch.nn.Module,
    state_dict: dict,
    prefix: str,
    expected_shape: tuple[int, ...],
    error_msgs: list[str],
    assign: bool = False,
) -> bool:
    """Replace ``module.weight`` from ``state_dict`` and remove the keys it used.

    Called before ``nn.Module._load_from_state_dict`` so that the default handling sees only the
    other parameters (bias). Returns whether the weight was handled here (the caller then drops it
    from ``missing_keys``). Problems go to ``error_msgs`` (torch raises them together), naming keys.
    """
    wkey = prefix + "weight"
    quant_keys = [k for k in state_dict if _is_quant_key(k, wkey)]
    if wkey not in state_dict:
        if quant_keys:
            error_msgs.append(f"{wkey} is missing but its quantization items are present ({', '.join(quant_keys)})")
            for k in quant_keys:
                state_dict.pop(k)
            return True
        return False  # the default loader reports the missing key
    current = module.weight
    device = current.device
    data = state_dict[wkey]
    if not isinstance(data, torch.Tensor):
        return False  # the default loader reports the wrong type
    if device.type == "meta":
        device = data.device

    if not quant_keys:
        if tuple(data.shape) == tuple(expected_shape) and data.is_floating_point():
            if getattr(current, "bnb_quantized", False):
                # A dense checkpoint into a quantized module: quantize it with the module's settings.
                state_dict.pop(wkey)
                new = Params4bit(data.detach().clone(), requires_grad=False, **_settings(current, module))
                module._parameters["weight"] = new.to(device)
                return True
            if assign and isinstance(current, Params4bit):
                # torch's assign would wrap the tensor in a plain Parameter, which never quantizes.
                state_dict.pop(wkey)
                new = Params4bit(data.detach(), requires_grad=False, **_settings(current, module))
                module._parameters["weight"] = new
                return True
            return False  # not quantized yet: the default loader copies the dense values
        error_msgs.append(
            f"{wkey} has shape {tuple(data.shape)} and dtype {data.dtype}, which is neither the dense weight "
            f"{tuple(expected_shape)} nor packed 4-bit codes with their quantization items: missing "
            f"{wkey}.absmax, {wkey}.quant_map and {wkey}.quant_state.bitsandbytes__nf4 (or __fp4)"
        )
        state_dict.pop(wkey)
        return True

    stats = {k[len(wkey) + 1 :]: state_dict.pop(k) for k in quant_keys}
    state_dict.pop(wkey)
    try:
        new = Params4bit.from_prequantized(data.detach(), stats, requires_grad=False, device=device, module=module)
    except (TypeError, ValueError) as e:
        error_msgs.append(f"while loading {wkey} and its quantization items: {e}")
        return True
    if tuple(new.quant_state.shape) != tuple(expected_shape):
        error_msgs.append(
            f"{wkey}: the checkpoint's quant_state has shape {list(new.quant_state.shape)}, "
            f"but this {type(module).__name__} expects {list(expected_shape)}"
        )
        return True
    module._parameters["weight"] = new
    module.quant_state = new.quant_state
    module.quant_storage = new.quant_storage
    return True


def _settings(weight: torch.Tensor, module: torch.nn.Module) -> dict:
    return {
        "blocksize": weight.blocksize,
        "compress_statistics": weight.compress_statistics,
        "quant_type": weight.quant_type,
        "quant_storage": weight.quant_storage,
        "module": module,
    }
