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
from .params4bit import Params4bit, is_dtensor, weight_quant_state

_ITEMS = tuple(k for k in QuantState.valid_qs_keys if k != "quant_state")


def save_4bit_weight(module: torch.nn.Module, destination: dict, prefix: str, keep_vars: bool) -> None:
    qs = weight_quant_state(module)
    if qs is None:
        return
    items = qs.as_dict(packed=True)
    for k, v in items.items():
        destination[prefix + "weight." + k] = v if keep_vars else v.detach()
    weight = module.weight
    if not isinstance(weight, Params4bit):
        _expose_items(weight, qs, items)


def _expose_items(weight: torch.Tensor, qs: QuantState, items: dict) -> None:
    """Let ``getattr(weight, item)`` resolve each saved item when FSDP has swapped the weight for a DTensor.

    torch.distributed.checkpoint checks every state_dict key by walking it with getattr from the root
    module ("layer.weight.absmax" -> module.weight.absmax). A Params4bit answers through properties; the
    tensor FSDP puts in its place gets the same names as plain attributes, refreshed on every save.
    """
    for k, v in items.items():
        if "." not in k:
            setattr(weight, k, v)
    weight.quant_state = qs  # "weight.quant_state.bitsandbytes__nf4" resolves through QuantState.__getattr__


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

    if is_dtensor(current):
        stats = {k[len(wkey) + 1 :]: state_dict.pop(k) for k in quant_keys}
        state_dict.pop(wkey)
        _load_into_sharded(module, current, data, stats, wkey, expected_shape, error_msgs)
        return True

    if is_dtensor(data):
        error_msgs.append(
            f"{wkey} is a sharded DTensor but this {type(module).__name__} is not sharded: load it into the "
            "FSDP-sharded model, or gather it first (get_model_state_dict with full_state_dict=True)"
        )
        for k in (wkey, *quant_keys):
            state_dict.pop(k)
        return True

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
    in_place = (
        not assign
        and current.device.type != "meta"
        and (getattr(current, "bnb_quantized", False) or not isinstance(current, Params4bit))
        and current.dtype == new.dtype
        and current.shape == new.shape
    )
    if in_place:
        # Keep the parameter object: optimizers and FSDP1's views into its flat parameter refer to it.
        with torch.no_grad():
            current.copy_(new.data)
        if isinstance(current, Params4bit):
            for k, v in _settings(new, module).items():
                setattr(current, k, v)
            current.quant_state = new.quant_state
            current.bnb_quantized = True
    else:
        module._parameters["weight"] = new
    module.quant_state = new.quant_state
    module.quant_storage = new.quant_storage
    return True


def _load_into_sharded(
    module: torch.nn.Module,
    current: torch.Tensor,
    data: torch.Tensor,
    stats: dict,
    wkey: str,
    expected_shape: tuple[int, ...],
    error_msgs: list[str],
) -> None:
    """Load packed codes into a weight that FSDP has sharded (a DTensor), in place; the module keeps the state.

    FSDP owns the parameter object (its optimizer and hooks refer to it), so it is never replaced here:
    the codes are copied into the local shard and the module's QuantState is swapped.
    """
    if not stats:
        error_msgs.append(
            f"{wkey} arrived without its quantization items ({wkey}.absmax, {wkey}.quant_map, "
            f"{wkey}.quant_state.bitsandbytes__nf4 or __fp4). set_model_state_dict(broadcast_from_rank0=True) "
            "drops them on every rank but 0 (torch broadcasts only parameters and buffers): give every rank the "
            "full state dict (full_state_dict=True without broadcast_from_rank0), or load a sharded checkpoint "
            "with torch.distributed.checkpoint.load"
        )
        return
    try:
        qs = QuantState.from_dict(qs_dict=stats, device=current.device)
    except (TypeError, ValueError) as e:
        error_msgs.append(f"while loading {wkey} and its quantization items: {e}")
        return
    if qs.quant_type is None or tuple(qs.shape) != tuple(expected_shape):
        error_msgs.append(
            f"{wkey}: the checkpoint's quant_state is not a 4-bit state of shape {list(expected_shape)} "
            f"(quant_type {qs.quant_type}, shape {list(qs.shape) if qs.shape is not None else None})"
        )
        return
    if data.dtype != current.dtype or tuple(data.shape) != tuple(current.shape):
        error_msgs.append(
            f"{wkey} holds packed codes of shape {tuple(data.shape)} as {data.dtype}, but this sharded weight was "
            f"built with shape {tuple(current.shape)} as {current.dtype}: shard a module that already holds the "
            "packed weight in the checkpoint's quant_storage (quantize it first, or, when building on the meta "
            "device, give it a packed Params4bit placeholder before fully_shard)"
        )
        return
    with torch.no_grad():
        if not is_dtensor(data):
            from torch.distributed.tensor import distribute_tensor

            # Every rank holds the full tensor: each keeps its own chunk, no communication.
            data = distribute_tensor(
                data.detach().to(current.device), current.device_mesh, current.placements, src_data_rank=None
            )
        current.copy_(data)
    module.quant_state = qs
    module.quant_storage = data.dtype


def _settings(weight: torch.Tensor, module: torch.nn.Module) -> dict:
    return {
        "blocksize": weight.blocksize,
        "compress_statistics": weight.compress_statistics,
        "quant_type": weight.quant_type,
        "quant_storage": weight.quant_storage,
        "module": module,
    }
