"""The optimizer base classes: ``Optimizer8bit`` and its one- and two-state forms.

Every step goes through ``bitsandbytes.functional`` (``optimizer_update_32bit`` or
``optimizer_update_8bit_blockwise``), so it runs on any device with a kernel for those ops.

State of one parameter (the keys upstream uses, so state dicts load across the two):

* ``step`` (int), ``state1`` and, for two-state optimizers, ``state2``: fp32 like the parameter for 32-bit
  state; uint8 codes for 8-bit state, with ``qmap1``/``qmap2`` (256 fp32 values: the signed/unsigned dynamic
  map) and ``absmax1``/``absmax2`` (fp32, one per block of 256). AdEMAMix stacks its two EMAs in ``state1``
  (``[2, *p.shape]``, ``absmax1`` ``[2, blocks]``).
* ``unorm_vec`` (one fp32) when ``max_unorm > 0``; ``gnorm_vec`` (100 fp32) when ``percentile_clipping < 100``.

``state_dict()`` moves all of these but ``step`` under ``"__bnb_optimizer_quant_state__"`` in each parameter's
entry (as upstream, so that FSDP does not try to gather them as if shaped like the parameter).

Sharded (DTensor) parameters, as FSDP2 gives them, step on their local shard with state for that shard only;
their ``state_dict()`` entries hold ``state1``/``state2`` in a portable form instead (fp32 DTensors laid out
like the parameter, see ``_portable`` and ``load_state_dict``), which torch.distributed.checkpoint can gather
and reshard.
"""

from __future__ import annotations

import copy
import math
import warnings
from collections import defaultdict
from typing import Any

import torch

from .. import _checks
from .. import functional as F
from .._functional.optim import record_squared_gnorm
from .._functional.paged import has_paged_memory
from .._ops import OPTIMIZER_BLOCKSIZE
from . import _args, _dtensor, _portable
from .manager import GlobalOptimManager

__all__ = ["MockArgs", "Optimizer1State", "Optimizer2State", "Optimizer8bit"]

# Parameters at least this large get paged state when paging is available (upstream's threshold).
_PAGED_MIN_NUMEL = 100_000
_GNORM_HISTORY = 100


def _check_grad_shape(p: torch.Tensor, gindex: int, pindex: int) -> None:
    """``p.grad`` has ``p``'s shape; checked before any state is created or changed.

    torch's ``.grad`` setter enforces this, but ``p.grad.data = ...`` (or a hook) does not, and a
    gradient with the same element count would otherwise step every value with the wrong one.
    """
    if tuple(p.grad.shape) != tuple(p.shape):
        raise ValueError(
            f"the gradient (p.grad) of parameter {pindex} in param group {gindex} has shape "
            f"{tuple(p.grad.shape)}; it must have the parameter's shape {tuple(p.shape)}"
        )


class MockArgs:
    """Attribute access to a dict of optimizer arguments (upstream's ``optimizer.args``)."""

    def __init__(self, initial_data: dict[str, Any]):
        for key, value in initial_data.items():
            setattr(self, key, value)


def _blocks(n: int) -> int:
    return -(-n // OPTIMIZER_BLOCKSIZE)


_STATE_KEYS = ("state1", "state2")
# Per-block data of 8-bit state: meaningful only for the tensor (shard) it was computed on.
_BLOCK_KEYS = ("qmap1", "qmap2", "absmax1", "absmax2")


class Optimizer8bit(torch.optim.Optimizer):
    """Base of all bitsandbytes optimizers: config lookup, state buffers, state_dict layout and ``step``."""

    _FSDP_WRAPPED_QUANT_STATE_KEY = "__bnb_optimizer_quant_state__"

    def __init__(self, params, defaults: dict[str, Any], optim_bits: int = 32, is_paged: bool = False):
        _args.optim_bits(optim_bits)
        super().__init__(params, defaults)
        self.initialized = False
        self.name2qmap: dict[str, torch.Tensor] = {}
        self.is_paged = bool(is_paged)
        self.page_mng = F.GlobalPageManager.get_instance()
        self.mng = GlobalOptimManager.get_instance()
        self._unpaged_warned: set[str] = set()
        # State entries that are not cast to the parameter's dtype on load (and go under the wrapper key).
        self.non_castable_tensor_keys = {
            "qmap1", "qmap2", "max1", "max2", "new_max1", "new_max2", "state1", "state2", "gnorm_vec",
            "absmax1", "absmax2", "unorm_vec",
        }  # fmt: skip
        if optim_bits == 8:
            self.fill_qmap()

    def fill_qmap(self) -> None:
        self.name2qmap["dynamic"] = F.create_dynamic_map(signed=True)
        self.name2qmap["udynamic"] = F.create_dynamic_map(signed=False)

    # ---- config -------------------------------------------------------------------------------------

    def get_config(self, gindex: int, pindex: int, group: dict[str, Any]) -> dict[str, Any]:
        """Hyperparameters for parameter ``pindex`` of group ``gindex``: the group's, then its overrides."""
        args = self.args
        config = {
            "betas": group["betas"],
            "eps": group["eps"],
            "weight_decay": group["weight_decay"],
            "lr": group["lr"],
            "alpha": group.get("alpha", 0.0),
            "t_alpha": group.get("t_alpha"),
            "t_beta3": group.get("t_beta3"),
            "optim_bits": args.optim_bits,
            "min_8bit_size": args.min_8bit_size,
            "max_unorm": args.max_unorm,
            "skip_zeros": args.skip_zeros,
            "percentile_clipping": getattr(args, "percentile_clipping", 100),
        }
        groups = [g["params"] for g in self.param_groups]
        config.update(self.mng.config_for(groups[gindex][pindex], groups, (gindex, pindex)))
        return config

    def check_overrides(self) -> None:
        """Kept for upstream compatibility: overrides are now looked up per parameter when needed."""

    # ---- state buffers ------------------------------------------------------------------------------

    def _paged(self, p: torch.Tensor) -> bool:
        """Whether ``p``'s state goes to paged memory; warns once per device type when paging is unavailable."""
        p = _dtensor.local(p)
        if not self.is_paged:
            return False
        if not has_paged_memory(p.device):
            if p.device.type not in self._unpaged_warned:
                self._unpaged_warned.add(p.device.type)
                warnings.warn(
                    f"{type(self).__name__}: device '{p.device.type}' has no paged (managed) memory in this "
                    "installation, so the optimizer state is allocated as ordinary memory (unpaged).",
                    stacklevel=5,  # the caller of step()
                )
            return False
        return p.numel() >= _PAGED_MIN_NUMEL

    def get_state_buffer(self, p: torch.Tensor, dtype: torch.dtype = torch.float32, stack: int = 1) -> torch.Tensor:
        """A zeroed state buffer shaped like ``p`` (``stack`` > 1: ``[stack, *p.shape]``), paged if asked.

        For a sharded (DTensor) ``p`` the buffer is a plain tensor shaped like its local shard.
        """
        p = _dtensor.local(p)
        shape = (stack, *p.shape) if stack > 1 else tuple(p.shape)
        if self._paged(p):
            buf = F.get_paged(*shape, dtype=dtype, device=p.device)
            self.page_mng.paged_tensors.append(buf)
            return buf
        return torch.zeros(shape, dtype=dtype, device=p.device)

    def prefetch_state(self, p: torch.Tensor) -> None:
        if self.is_paged:
            state = self.state[p]
            for key in ("state1", "state2"):
                if getattr(state.get(key), "is_paged", False):
                    F.prefetch_tensor(state[key])

    def to_gpu(self) -> None:
        """Move state tensors to their parameter's device (needed after loading state saved elsewhere)."""
        for group in self.param_groups:
            for p in group["params"]:
                for k, v in self.state.get(p, {}).items():
                    if isinstance(v, torch.Tensor) and v.device != p.device and not getattr(v, "is_paged", False):
                        self.state[p][k] = v.to(p.device)

    # ---- the step -----------------------------------------------------------------------------------

    @torch.no_grad()
    def step(self, closure=None):
        """One optimization step over every parameter that has a gradient."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if not self.initialized:
            self.to_gpu()
            self.initialized = True
        for gindex, group in enumerate(self.param_groups):
            for pindex, p in enumerate(group["params"]):
                if p.grad is None:
                    continue
                _check_grad_shape(p, gindex, pindex)
                if len(self.state[p]) == 0:
                    self.init_state(group, p, gindex, pindex)
                self.prefetch_state(p)
                self.update_step(group, p, gindex, pindex)
        return loss

    def _state_bits(self, config: dict[str, Any], p: torch.Tensor) -> int:
        # p.numel() of a DTensor is the whole parameter's: every rank (and an unsharded run) picks the same.
        bits = _args.optim_bits(config["optim_bits"])
        return 32 if p.numel() < config["min_8bit_size"] else bits

    def init_state(self, group, p, gindex, pindex):
        raise NotImplementedError("init_state must be overridden")

    def update_step(self, group, p, gindex, pindex):
        raise NotImplementedError("update_step must be overridden")

    def _gnorm_scale(self, config: dict[str, Any], state: dict[str, Any], grad: torch.Tensor, step: int):
        # bitsandbytes 0.49's percentile_clipping: scale the gradient down to a percentile of its norm history.
        if config["percentile_clipping"] >= 100:
            return 1.0
        if "gnorm_vec" not in state:
            state["gnorm_vec"] = torch.zeros(_GNORM_HISTORY, dtype=torch.float32, device=_dtensor.local(grad).device)
        if _dtensor.is_dtensor(grad):
            # The norm of the whole gradient, not of this rank's shard (every rank gets the same scale).
            squared = _dtensor.global_squared_norm(grad)
            return record_squared_gnorm(state["gnorm_vec"], squared, step, config["percentile_clipping"])[2]
        return F.percentile_clipping(grad, state["gnorm_vec"], step, config["percentile_clipping"])[2]

    # ---- state_dict ---------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """torch's state dict with each parameter's tensors but ``step`` wrapped under one key (see module doc).

        The state of a sharded (DTensor) parameter is given in portable form instead: ``state1``/``state2`` as
        fp32 DTensors laid out like the parameter (8-bit state decoded), without block data, so that
        torch.distributed.checkpoint can gather or reshard them (see ``load_state_dict``).
        """
        sd = super().state_dict()
        params = [p for group in self.param_groups for p in group["params"]]
        wrapped = {}
        for index, param_state in sd["state"].items():
            if not isinstance(param_state, dict):
                wrapped[index] = param_state
                continue
            portable = {}
            if isinstance(index, int) and index < len(params) and _dtensor.is_dtensor(params[index]):
                param_state, portable = self._portable_state(params[index], param_state)
            entry = {k: v for k, v in param_state.items() if k not in self.non_castable_tensor_keys}
            quant = {k: v for k, v in param_state.items() if k in self.non_castable_tensor_keys}
            if quant:
                entry[self._FSDP_WRAPPED_QUANT_STATE_KEY] = quant
            entry.update(portable)
            wrapped[index] = entry
        sd["state"] = wrapped
        return sd

    def _portable_state(self, p: torch.Tensor, param_state: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """(the rest, {state1, state2} as fp32 DTensors like ``p``) of the state of sharded parameter ``p``."""
        rest = {k: v for k, v in param_state.items() if k not in _STATE_KEYS and k not in _BLOCK_KEYS}
        portable = {}
        for n, key in enumerate(_STATE_KEYS, start=1):
            if key not in param_state:
                continue
            value = param_state[key]
            stack = self._state1_stack() if n == 1 else 1
            if value.dtype == torch.uint8:
                value = _portable.decode(value, param_state[f"absmax{n}"], param_state[f"qmap{n}"], stack)
            portable[key] = _dtensor.as_dtensor(value, p, stack)
        return rest, portable

    def load_state_dict(self, state_dict: dict[str, Any], move_to_device: bool = True) -> None:
        """Load a state dict from ``state_dict()`` (ours or upstream's), checked in full before anything changes.

        State tensors keep their dtype; ``move_to_device`` puts them on their parameter's device. Other
        floating-point tensors are cast to the parameter's dtype, as torch does.

        A parameter's state comes in one of two forms: native (``state1``/``state2`` with their ``qmap``/``absmax``
        under the wrapper key, upstream's layout, used by plain parameters; uint8 codes at the top level are
        read as native too) or portable (fp32 ``state1``/``state2`` at the entry's top level, whole or as
        DTensors, used by sharded parameters). Portable state is cut to the parameter's local shard and
        encoded to the precision the optimizer uses for it (8-bit or 32-bit); native state of a sharded
        parameter is decoded and treated the same way. When an entry holds both forms, the one the parameter
        does *not* use is loaded: torch.distributed.checkpoint merges a checkpoint of the other form into the
        optimizer's own state dict, so that one is the checkpoint. With sharded parameters this is a
        collective (every rank of their mesh checks that all ranks load the same form), as DCP calls it.
        """
        if not isinstance(state_dict, dict) or "state" not in state_dict or "param_groups" not in state_dict:
            raise ValueError("state_dict must be a dict with 'state' and 'param_groups' (from state_dict())")
        state_dict = copy.deepcopy(state_dict)
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(
                f"state_dict has {len(saved_groups)} parameter groups, the optimizer {len(self.param_groups)}"
            )
        for i, (group, saved) in enumerate(zip(self.param_groups, saved_groups, strict=True)):
            if len(group["params"]) != len(saved["params"]):
                raise ValueError(
                    f"state_dict['param_groups'][{i}] has {len(saved['params'])} parameters, "
                    f"the optimizer's group {i} has {len(group['params'])}"
                )
        id_map = {
            saved_id: (p, gindex, pindex)
            for gindex, (saved, group) in enumerate(zip(saved_groups, self.param_groups, strict=True))
            for pindex, (saved_id, p) in enumerate(zip(saved["params"], group["params"], strict=True))
        }
        state: defaultdict = defaultdict(dict)
        some_sharded, native_for_sharded = None, False
        for key, entry in state_dict["state"].items():
            if key not in id_map:
                state[key] = entry  # kept as is, as torch does for state of unknown parameters
                continue
            p, gindex, pindex = id_map[key]
            where = f"state_dict['state'][{key!r}]"
            if not isinstance(entry, dict):
                raise ValueError(f"{where} must be a dict, got {type(entry).__name__}")
            entry = dict(entry)
            quant = entry.pop(self._FSDP_WRAPPED_QUANT_STATE_KEY, {})
            if not isinstance(quant, dict):
                raise ValueError(f"{where}[{self._FSDP_WRAPPED_QUANT_STATE_KEY!r}] must be a dict")
            portable = {k: entry.pop(k) for k in _STATE_KEYS if k in entry}
            if any(getattr(v, "dtype", None) == torch.uint8 for v in portable.values()):
                # Codes at the top level: native state saved without the wrapper (a plain torch layout).
                unwrapped = {**portable, **{k: entry.pop(k) for k in _BLOCK_KEYS if k in entry}}
                quant, portable = {**unwrapped, **quant}, {}
            sharded = _dtensor.is_dtensor(p)
            use_portable = bool(portable) and (not sharded or "state1" not in quant)
            if sharded:
                some_sharded = p
                native_for_sharded |= not use_portable
            if use_portable or sharded:
                native = {k: quant.pop(k) for k in (*_STATE_KEYS, *_BLOCK_KEYS) if k in quant}
                entry.update(quant)
                whole = portable if use_portable else native
                self._check_loaded_state(where, p, {**entry, **whole})
                entry.update(self._encode_loaded(where, p, self.param_groups[gindex], gindex, pindex, whole))
            else:
                entry.update(quant)
                self._check_loaded_state(where, p, entry)
            if isinstance(entry.get("step"), torch.Tensor):
                entry["step"] = int(entry["step"].item())
            state[p] = {k: self._cast_loaded(p, k, v, move_to_device) for k, v in entry.items()}
        if some_sharded is not None and not _dtensor.agree(native_for_sharded, some_sharded):
            # DCP's broadcast_from_rank0 delivers keys the receiving state dict lacks to rank 0 only: rank 0
            # would load the checkpoint and the other ranks keep their state. Refuse before anything changes.
            raise ValueError(
                "state_dict holds single-process (upstream layout) state for sharded parameters on some ranks "
                "only; with set_optimizer_state_dict(..., broadcast_from_rank0=True) give a full state dict taken "
                "from sharded parameters, or load the single-process one on every rank without broadcasting"
            )
        for group, saved in zip(self.param_groups, saved_groups, strict=True):
            saved["params"] = group["params"]
        self.__setstate__({"state": state, "param_groups": saved_groups})

    def _encode_loaded(self, where, p, group, gindex, pindex, whole: dict[str, Any]) -> dict[str, Any]:
        """``p``'s own state from whole-parameter state ``whole`` (portable, or native of the whole parameter)."""
        if "state1" not in whole:
            return {}
        config = self.get_config(gindex, pindex, group)
        bits = self._state_bits(config, p)
        if bits == 8 and "dynamic" not in self.name2qmap:
            self.fill_qmap()
        out = {}
        for n, (key, map_name) in enumerate(zip(_STATE_KEYS, ("dynamic", "udynamic"), strict=True), start=1):
            if key not in whole:
                continue
            stack = self._state1_stack() if n == 1 else 1
            value = whole[key]
            if value.dtype == torch.uint8:
                value = _portable.decode(value, whole[f"absmax{n}"], whole[f"qmap{n}"], stack)
            value = self._local_state(where, key, p, value, stack)
            if bits == 8:
                qmap = self.name2qmap[map_name]
                out[key], out[f"absmax{n}"] = _portable.encode(value, qmap, stack)
                out[f"qmap{n}"] = qmap
            else:
                out[key] = value.float().contiguous().clone()
        return out

    @staticmethod
    def _local_state(where: str, key: str, p: torch.Tensor, value: torch.Tensor, stack: int) -> torch.Tensor:
        """This rank's part of whole-parameter state ``value`` (a DTensor, or a plain tensor shaped like ``p``)."""
        if _dtensor.is_dtensor(value):
            if not _dtensor.is_dtensor(p):
                raise ValueError(
                    f"{where}[{key!r}] is a DTensor but its parameter is not sharded; load a full state dict "
                    "(get_optimizer_state_dict(..., options=StateDictOptions(full_state_dict=True)))"
                )
            expected = _dtensor.stacked_placements(p, stack)
            if value.device_mesh != p.device_mesh or tuple(value.placements) != expected:
                raise ValueError(
                    f"{where}[{key!r}] is laid out as {tuple(value.placements)} on {value.device_mesh}, expected "
                    f"{expected} on {p.device_mesh} like its parameter"
                )
            return value.to_local()
        return _dtensor.local_part(value, p, stack) if _dtensor.is_dtensor(p) else value

    def _cast_loaded(self, p: torch.Tensor, key: str, value: Any, move_to_device: bool) -> Any:
        if key in self.non_castable_tensor_keys:
            return value.to(p.device) if move_to_device and isinstance(value, torch.Tensor) else value
        if isinstance(value, torch.Tensor):
            if p.is_floating_point() and value.is_floating_point():
                value = value.to(p.dtype)
            return value.to(p.device) if move_to_device else value
        if isinstance(value, dict):
            return {k: self._cast_loaded(p, k, v, move_to_device) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(self._cast_loaded(p, "", v, move_to_device) for v in value)
        return value

    def _state1_stack(self) -> int:
        return 1

    def _check_loaded_state(self, where: str, p: torch.Tensor, entry: dict[str, Any]) -> None:
        """Raise if ``entry`` cannot be the state of ``p`` for this optimizer (shapes, dtypes, companions)."""

        def tensor(key: str, shape: tuple[int, ...], dtypes: tuple[torch.dtype, ...]) -> torch.Tensor:
            t = entry.get(key)
            if not isinstance(t, torch.Tensor):
                raise ValueError(f"{where}[{key!r}] must be a tensor, got {type(t).__name__}")
            if tuple(t.shape) != tuple(shape):
                raise ValueError(f"{where}[{key!r}] has shape {tuple(t.shape)}, expected {tuple(shape)}")
            if t.dtype not in dtypes:
                names = " or ".join(str(d).removeprefix("torch.") for d in dtypes)
                raise ValueError(f"{where}[{key!r}] has dtype {str(t.dtype).removeprefix('torch.')}, expected {names}")
            return t

        if not entry:
            return
        step = entry.get("step")
        if isinstance(step, torch.Tensor) and step.numel() == 1:
            step = step.item()
        # isfinite first: int() of NaN or Inf raises its own unclear error (found by ci/fuzz/fuzz_optimizer_state.py).
        bad = isinstance(step, bool) or not isinstance(step, (int, float)) or not math.isfinite(step)
        # The ops take the step as int64, and the next step adds one.
        if bad or step < 0 or step != int(step) or step >= 2**63 - 1:
            raise ValueError(f"{where}['step'] must be an int >= 0 and < 2**63 - 1, got {entry.get('step')!r}")
        stack = self._state1_stack()
        shape = (stack, *p.shape) if stack > 1 else tuple(p.shape)
        keys = ("state1", "state2") if isinstance(self, Optimizer2State) else ("state1",)
        s1 = tensor("state1", shape, (torch.float32, torch.uint8))
        for n, key in enumerate(keys, start=1):
            t = tensor(key, shape if n == 1 else tuple(p.shape), (s1.dtype,))
            if t.dtype == torch.uint8:
                tensor(f"qmap{n}", (256,), (torch.float32,))
                blocks = _blocks(p.numel())
                tensor(f"absmax{n}", (stack, blocks) if n == 1 and stack > 1 else (blocks,), (torch.float32,))
        if "unorm_vec" in entry:
            tensor("unorm_vec", (1,), (torch.float32,))
        if "gnorm_vec" in entry:
            tensor("gnorm_vec", (_GNORM_HISTORY,), (torch.float32,))


class _StatefulBase(Optimizer8bit):
    """Shared constructor of the one- and two-state optimizers."""

    _n_states = 1

    def __init__(
        self, optimizer_name, params, defaults, optim_bits, args, min_8bit_size, max_unorm, skip_zeros, is_paged,
        percentile_clipping, block_wise,
    ):  # fmt: skip
        _args.min_8bit_size(min_8bit_size)
        _args.non_negative("max_unorm", max_unorm)
        _args.percentile_clipping(percentile_clipping)
        # Fail at construction, not at the first step (after the states were already allocated).
        if optimizer_name not in _checks.OPTIMIZER_NAMES:
            raise ValueError(
                f"optimizer_name must be one of {', '.join(_checks.OPTIMIZER_NAMES)}; got {optimizer_name!r}"
            )
        # A missing beta2 would otherwise step silently with beta2 = 0 (upstream fails at the first step).
        if optimizer_name in ("adam", "lamb", "lion", "ademamix") and len(defaults.get("betas", ())) < 2:
            raise ValueError(f"betas must hold (beta1, beta2) for {optimizer_name}; got {defaults.get('betas')!r}")
        super().__init__(params, defaults, optim_bits, is_paged)
        if args is None:
            # block_wise (bitsandbytes 0.49) is recorded but has no effect: 8-bit state is always blockwise.
            args = MockArgs(dict(
                optim_bits=optim_bits, min_8bit_size=min_8bit_size, max_unorm=max_unorm, skip_zeros=skip_zeros,
                percentile_clipping=percentile_clipping, block_wise=block_wise,
            ))  # fmt: skip
        self.args = args
        self.optimizer_name = optimizer_name

    @torch.no_grad()
    def init_state(self, group, p, gindex, pindex):
        config = self.get_config(gindex, pindex, group)
        bits = self._state_bits(config, p)
        stack = self._state1_stack()
        if bits == 32 and config["max_unorm"] > 0.0 and _dtensor.is_split(p):
            # The trust ratio compares norms of the whole update and parameter inside one kernel call; per
            # shard it would be a different (wrong) optimizer, so refuse rather than run it silently.
            raise NotImplementedError(
                f"{type(self).__name__}: max_unorm > 0 (the LAMB/LARS trust ratio of 32-bit state) is not supported "
                f"for parameters sharded across ranks (DTensor with placements {tuple(p.placements)}); use "
                "max_unorm=0 or 8-bit state for them"
            )
        state = self.state[p]
        state["step"] = 0
        dtype = torch.uint8 if bits == 8 else torch.float32
        state["state1"] = self.get_state_buffer(p, dtype, stack)
        if self._n_states == 2:
            state["state2"] = self.get_state_buffer(p, dtype)
        if bits == 8:
            if "dynamic" not in self.name2qmap:
                self.fill_qmap()
            blocks = _blocks(_dtensor.local(p).numel())
            for n, name in ((1, "dynamic"), (2, "udynamic"))[: self._n_states]:
                self.name2qmap[name] = self.name2qmap[name].to(p.device)
                state[f"qmap{n}"] = self.name2qmap[name]
                shape = (stack, blocks) if n == 1 and stack > 1 else (blocks,)
                state[f"absmax{n}"] = torch.zeros(shape, dtype=torch.float32, device=p.device)
        if config["max_unorm"] > 0.0:
            state["unorm_vec"] = torch.zeros((1,), dtype=torch.float32, device=p.device)
        if config["percentile_clipping"] < 100:
            state["gnorm_vec"] = torch.zeros((_GNORM_HISTORY,), dtype=torch.float32, device=p.device)

    def _schedule(self, config: dict[str, Any], step: int) -> tuple[float, float]:
        """(beta3, alpha) for this step; AdEMAMix schedules them."""
        betas = config["betas"]
        return (betas[2] if len(betas) >= 3 else 0.0), config.get("alpha", 0.0)

    @torch.no_grad()
    def update_step(self, group, p, gindex, pindex):
        # The kernels need dense, contiguous tensors.
        if _dtensor.is_dtensor(p):
            # A sharded parameter steps on its local shard (which may hold no elements at all).
            _dtensor.check_reduced(p.grad)
            grad, target = p.grad, _dtensor.local(p)
            work = target if target.is_contiguous() else target.contiguous()
        else:
            if not p.is_contiguous():
                p.data = p.data.contiguous()
            if not p.grad.is_contiguous():
                p.grad = p.grad.contiguous()
            target = work = p
            grad = p.grad
        state = self.state[p]
        config = self.get_config(gindex, pindex, group)
        betas = config["betas"] = _args.parse_betas(config["betas"])
        # The counter and the clipping history commit only once the update has succeeded, so a step that
        # raises leaves this parameter's value and state all old (the per-parameter atomicity policy).
        step = state["step"] + 1
        beta3, alpha = self._schedule(config, step)
        beta2 = betas[1] if len(betas) >= 2 else 0.0
        history = state["gnorm_vec"].clone() if "gnorm_vec" in state else None
        try:
            # Before the kernel, and on every rank: clipping a sharded gradient is a collective.
            gnorm_scale = self._gnorm_scale(config, state, grad, step)
            local_grad = _dtensor.local(grad)
            if work.numel() > 0:
                if not local_grad.is_contiguous():
                    local_grad = local_grad.contiguous()
                self._apply_update(config, state, local_grad, work, step, betas, beta2, beta3, alpha, gnorm_scale)
                if work is not target:
                    target.copy_(work)
        except BaseException:
            if history is not None:
                state["gnorm_vec"].copy_(history)
            raise
        state["step"] = step

    def _apply_update(self, config, state, grad, p, step, betas, beta2, beta3, alpha, gnorm_scale):
        two = self._n_states == 2
        if state["state1"].dtype == torch.float32:
            F.optimizer_update_32bit(
                self.optimizer_name, grad, p, state["state1"], betas[0], config["eps"], step, config["lr"],
                state["state2"] if two else None, beta2, beta3 if two else 0.0, alpha if two else 0.0,
                config["weight_decay"], gnorm_scale, state["unorm_vec"] if config["max_unorm"] > 0.0 else None,
                max_unorm=config["max_unorm"], skip_zeros=config["skip_zeros"],
            )  # fmt: skip
        else:
            F.optimizer_update_8bit_blockwise(
                self.optimizer_name, grad, p, state["state1"], state["state2"] if two else None, betas[0], beta2,
                beta3 if two else 0.0, alpha if two else 0.0, config["eps"], step, config["lr"], state["qmap1"],
                state["qmap2"] if two else None, state["absmax1"], state["absmax2"] if two else None,
                config["weight_decay"], gnorm_scale=gnorm_scale, skip_zeros=config["skip_zeros"],
            )  # fmt: skip


class Optimizer2State(_StatefulBase):
    """Base of the optimizers with two states (Adam, AdamW, LAMB, AdEMAMix)."""

    _n_states = 2

    def __init__(
        self,
        optimizer_name,
        params,
        lr=1e-3,
        betas=(0.9, 0.999),
        eps=1e-8,
        weight_decay=0.0,
        optim_bits=32,
        args=None,
        min_8bit_size=4096,
        max_unorm=0.0,
        skip_zeros=False,
        is_paged=False,
        alpha=0.0,
        t_alpha: int | None = None,
        t_beta3: int | None = None,
        percentile_clipping=100,
        block_wise=True,
    ):
        lr, eps, weight_decay, betas = _args.hyperparameters(lr, eps, weight_decay, betas)
        _args.number("alpha", alpha)
        defaults = dict(
            lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, alpha=alpha, t_alpha=t_alpha, t_beta3=t_beta3
        )
        super().__init__(
            optimizer_name, params, defaults, optim_bits, args, min_8bit_size, max_unorm, skip_zeros, is_paged,
            percentile_clipping, block_wise,
        )  # fmt: skip


class Optimizer1State(_StatefulBase):
    """Base of the optimizers with one state (SGD, RMSprop, Adagrad, Lion, LARS)."""

    def __init__(
        self,
        optimizer_name,
        params,
        lr=1e-3,
        betas=(0.9, 0.0),
        eps=1e-8,
        weight_decay=0.0,
        optim_bits=32,
        args=None,
        min_8bit_size=4096,
        max_unorm=0.0,
        skip_zeros=False,
        is_paged=False,
        percentile_clipping=100,
        block_wise=True,
    ):
        lr, eps, weight_decay, betas = _args.hyperparameters(lr, eps, weight_decay, betas)
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        super().__init__(
            optimizer_name, params, defaults, optim_bits, args, min_8bit_size, max_unorm, skip_zeros, is_paged,
            percentile_clipping, block_wise,
        )  # fmt: skip
