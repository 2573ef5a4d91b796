"""``GlobalOptimManager``: per-parameter hyperparameter overrides shared by every bitsandbytes optimizer.

Overrides are keyed by the parameter object itself (weakly), so one parameter's override can never reach
another parameter or another optimizer. Upstream also kept a table keyed by (group index, parameter index)
that it filled from module overrides and consulted for every optimizer in the process: a module override
(e.g. StableEmbedding or the Trainer asking for 32-bit embedding state) then changed the precision of
whatever parameter sat at the same position in any later optimizer. Here positions are used only for the
one case that needs them, ``register_parameters`` (see there), and only for an optimizer whose parameters
have exactly the registered layout.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch.utils.weak import WeakIdKeyDictionary

from ._args import check_override

__all__ = ["GlobalOptimManager"]


def _param_groups(params: Any) -> list[list[torch.Tensor]]:
    """The parameters of ``params`` (tensors or param-group dicts, as an optimizer takes them), by group."""
    if isinstance(params, torch.Tensor):
        raise TypeError("params must be an iterable of tensors or of param-group dicts, not a single tensor")
    items = list(params)
    if not items:
        return []
    if isinstance(items[0], Mapping):
        groups = []
        for i, group in enumerate(items):
            if not isinstance(group, Mapping) or "params" not in group:
                raise TypeError(f"params[{i}] must be a dict with a 'params' entry like its first element")
            ps = group["params"]
            groups.append([ps] if isinstance(ps, torch.Tensor) else list(ps))
    else:
        groups = [items]
    for g, group in enumerate(groups):
        for i, p in enumerate(group):
            if not isinstance(p, torch.Tensor):
                raise TypeError(f"parameter {i} of group {g} must be a torch.Tensor, got {type(p).__name__}")
    return groups


class GlobalOptimManager:
    """The process-wide registry of optimizer-config overrides (a singleton: use ``get_instance()``).

    * ``override_config(params, key, value)`` / ``key_value_dict=``: for those parameter objects.
    * ``register_module_override(module, "weight", config)``: for whatever tensor ``module.weight`` is when an
      optimizer first initializes that parameter's state, so it may be called after the optimizer was built.
    * ``register_parameters(params)``: snapshots the overrides of ``params`` by position, so they also reach
      the replacements of those tensors (``p = p.cuda()`` on plain tensors) in an optimizer over the same
      layout. Parameters moved with ``module.to()`` keep their identity and need no registration.

    Overrides are merged for a parameter in that order of increasing precedence: registered positions,
    module overrides, then ``override_config``.
    """

    _instance: GlobalOptimManager | None = None

    def __init__(self):
        raise RuntimeError("Call get_instance() instead")

    def initialize(self) -> None:
        """Forget every override."""
        self._param_config: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._module_overrides: list[tuple[weakref.ref, str, dict[str, Any]]] = []
        self._layouts: list[tuple[tuple[tuple[torch.Size, ...], ...], dict[tuple[int, int], dict[str, Any]]]] = []
        self.uses_config_override = False

    @classmethod
    def get_instance(cls) -> GlobalOptimManager:
        if cls._instance is None:
            cls._instance = cls.__new__(cls)
            cls._instance.initialize()
        return cls._instance

    def register_parameters(self, params: Iterable[Any]) -> None:
        groups = _param_groups(params)
        layout = tuple(tuple(p.shape for p in group) for group in groups)
        # The dicts are shared with _param_config, so later override_config calls on the same tensors show here.
        configs = {
            (g, i): self._param_config[p]
            for g, group in enumerate(groups)
            for i, p in enumerate(group)
            if p in self._param_config
        }
        if configs:
            self._layouts.append((layout, configs))

    def override_config(
        self,
        parameters: torch.Tensor | Iterable[torch.Tensor],
        key: str | None = None,
        value: Any = None,
        key_value_dict: Mapping[str, Any] | None = None,
    ) -> None:
        """Override config keys (``optim_bits``, ``lr``, ``betas``, ``eps``, ``weight_decay``, ``min_8bit_size``,
        ``max_unorm``, ``skip_zeros``, ...) for these parameters; the values are checked now."""
        if key is not None and key_value_dict is not None:
            raise ValueError("pass either key and value or key_value_dict, not both")
        if key is not None:
            if value is None:
                raise ValueError(f"value is required with key={key!r}")
            updates = {key: value}
        elif key_value_dict is not None:
            if not isinstance(key_value_dict, Mapping):
                raise TypeError(f"key_value_dict must be a dict, got {type(key_value_dict).__name__}")
            updates = dict(key_value_dict)
        else:
            return  # upstream ignores a call with nothing to override
        for k, v in updates.items():
            check_override(k, v)
        params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        for i, p in enumerate(params):
            if not isinstance(p, torch.Tensor):
                raise TypeError(f"parameters[{i}] must be a torch.Tensor, got {type(p).__name__}")
        self.uses_config_override = True
        for p in params:
            if p in self._param_config:
                self._param_config[p].update(updates)
            else:
                self._param_config[p] = dict(updates)

    def register_module_override(self, module: torch.nn.Module, param_name: str, config: Mapping[str, Any]) -> None:
        """Override ``config`` for ``getattr(module, param_name)``, looked up when its optimizer state is created."""
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
        if not isinstance(param_name, str):
            raise TypeError(f"param_name must be a str, got {type(param_name).__name__}")
        if not isinstance(config, Mapping):
            raise TypeError(f"config must be a dict, got {type(config).__name__}")
        for k, v in config.items():
            check_override(k, v)
        self.uses_config_override = True
        for ref, name, existing in self._module_overrides:
            # The Trainer registers again each time it builds an optimizer: merge rather than pile up.
            if ref() is module and name == param_name:
                existing.update(config)
                return
        # Weak, so registering an override does not keep a discarded model alive.
        self._module_overrides.append((weakref.ref(module), param_name, dict(config)))

    def config_for(self, p: torch.Tensor, groups: list[list[torch.Tensor]] | None = None, index=None) -> dict:
        """The overrides that apply to ``p``, found at ``index`` = (group, position) in ``groups``."""
        merged: dict[str, Any] = {}
        if groups is not None and index is not None and self._layouts:
            layout = tuple(tuple(q.shape for q in group) for group in groups)
            for registered, configs in self._layouts:
                if registered == layout and index in configs:
                    merged.update(configs[index])
        alive = []
        for ref, name, config in self._module_overrides:
            module = ref()
            if module is None:
                continue
            alive.append((ref, name, config))
            if getattr(module, name, None) is p:
                merged.update(config)
        self._module_overrides = alive
        if p in self._param_config:
            merged.update(self._param_config[p])
        return merged
