"""Int8Params, the LLM.int8() weight, and the state_dict reading/writing shared by the 8-bit modules.

The quantized form is row-major int8 codes (the parameter's data, also exposed as ``CB``) plus one
float32 absmax per row (``SCB``); ``code * SCB[row] / 127`` is the weight. Checkpoints store them as
``weight`` (int8) and ``SCB``, and Linear8bitLt adds ``weight_format`` (uint8 0 = row-major), the keys
upstream writes and transformers reads.
"""

from __future__ import annotations

import copy

import torch

from .. import functional as F
from ..utils import INVERSE_LINEAR_8BIT_WEIGHTS_FORMAT_MAPPING, LINEAR_8BIT_WEIGHTS_FORMAT_MAPPING

__all__ = ["Int8Params"]


class Int8Params(torch.nn.Parameter):
    """A weight that becomes int8 codes plus row scales on its first move to a device.

    With ``has_fp16_weights=False`` the first ``.to(device)``/``.cuda()``/``.cpu()`` to a real device
    (CPU -> CPU included) quantizes the floating-point data; later moves carry the codes and scales.
    With ``has_fp16_weights=True`` the data stays floating point (the matmul quantizes it per call).

    Every attribute kept in ``__dict__`` (``CB``, ``SCB``, ``has_fp16_weights``) is also a constructor
    keyword and unknown keywords are ignored, so ``Int8Params(t, requires_grad=False, **old.__dict__)``
    rebuilds a parameter the way transformers does.
    """

    def __new__(
        cls,
        data: torch.Tensor | None = None,
        requires_grad: bool = True,
        has_fp16_weights: bool = False,
        CB: torch.Tensor | None = None,
        SCB: torch.Tensor | None = None,
        **kwargs,
    ):
        if data is None:
            data = torch.empty(0)
        if not isinstance(data, torch.Tensor):
            raise TypeError(f"data must be a torch.Tensor or None, got {type(data).__name__}")
        obj = torch.Tensor._make_subclass(cls, data, requires_grad)
        obj.CB = CB
        obj.SCB = SCB
        obj.has_fp16_weights = has_fp16_weights
        return obj

    # Not a property named is_quantized: that would override torch.Tensor.is_quantized (torch's quantized
    # qint8 tensors), and torch.compile's fake tensors then refuse the weight ("quantized nyi in meta tensors").
    def _holds_codes(self) -> bool:
        return self.dtype == torch.int8

    def _quantize(self, device) -> Int8Params:
        if self.has_fp16_weights:
            return super().to(device)
        # Quantized from fp16 as upstream does, so both give the same codes for the same weights.
        B = self.data.contiguous().to(device=device, dtype=torch.float16)
        CB, SCB, _ = F.int8_vectorwise_quant(B)
        self.data = CB
        self.CB = CB
        self.SCB = SCB
        self.requires_grad_(False)  # integer tensors cannot carry gradients
        return self

    def cpu(self):
        return self.to(device="cpu")

    def cuda(self, device=None, non_blocking: bool = False):
        return self.to(device="cuda" if device is None else device, non_blocking=non_blocking)

    def xpu(self, device=None, non_blocking: bool = False):
        return self.to(device="xpu" if device is None else device, non_blocking=non_blocking)

    def to(self, *args, **kwargs):
        device, dtype, non_blocking, _ = torch._C._nn._parse_to(*args, **kwargs)
        if (
            not self._holds_codes()
            and not self.has_fp16_weights
            and device is not None
            and device.type != "meta"
            and self.device.type != "meta"
        ):
            return self._quantize(device)

        quantized = self._holds_codes()
        if quantized:
            dtype = None  # codes stay int8: a floating dtype here means the module's compute dtype
        moved = super().to(device=device, dtype=dtype, non_blocking=non_blocking)
        scb = self.SCB
        if quantized and scb is not None and device is not None and scb.device.type != "meta":
            scb = scb.to(device, non_blocking=non_blocking)
        return Int8Params(
            moved,
            requires_grad=self.requires_grad,
            has_fp16_weights=self.has_fp16_weights,
            CB=moved if quantized else None,
            SCB=scb if quantized else None,
        )

    def _cb_is_data(self) -> bool:
        return self.CB is not None and self.CB.data_ptr() == self.data.data_ptr() and self.CB.shape == self.shape

    def __deepcopy__(self, memo):
        data = copy.deepcopy(self.data, memo)
        new = type(self)(
            data,
            requires_grad=self.requires_grad,
            has_fp16_weights=self.has_fp16_weights,
            CB=data if self._cb_is_data() else copy.deepcopy(self.CB, memo),
            SCB=copy.deepcopy(self.SCB, memo),
        )
        memo[id(self)] = new
        return new

    def __copy__(self):
        return type(self)(
            self.data,
            requires_grad=self.requires_grad,
            has_fp16_weights=self.has_fp16_weights,
            CB=self.CB,
            SCB=self.SCB,
        )

    def __reduce_ex__(self, protocol):
        # torch.nn.Parameter pickles as a plain Parameter; keep the class and the scales.
        cb_is_data = self._cb_is_data()
        return (
            _rebuild_int8params,
            (
                type(self),
                self.data,
                self.requires_grad,
                self.has_fp16_weights,
                None if cb_is_data else self.CB,
                self.SCB,
                cb_is_data,
            ),
        )

    def __repr__(self):
        return f"Int8Params(has_fp16_weights={self.has_fp16_weights}):\n{super().__repr__()}"


def _rebuild_int8params(cls, data, requires_grad, has_fp16_weights, CB, SCB, cb_is_data):
    return cls(
        data, requires_grad=requires_grad, has_fp16_weights=has_fp16_weights, CB=data if cb_is_data else CB, SCB=SCB
    )


def weight_format_name(value, key: str) -> str:
    """The layout named by a ``weight_format`` entry (uint8 tensor, int or str); only ``'row'`` is supported."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.is_floating_point() or value.is_complex():
            raise ValueError(
                f"state dict key {key!r} must be a single integer (0 = 'row'); got a tensor of shape "
                f"{tuple(value.shape)} and dtype {value.dtype}"
            )
        value = int(value.item())
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TypeError(
            f"state dict key {key!r} must be an integer tensor, an int or a str; got {type(value).__name__}"
        )
    name = INVERSE_LINEAR_8BIT_WEIGHTS_FORMAT_MAPPING.get(value) if isinstance(value, int) else value
    if name not in LINEAR_8BIT_WEIGHTS_FORMAT_MAPPING:
        known = ", ".join(f"{v} ({k!r})" for k, v in LINEAR_8BIT_WEIGHTS_FORMAT_MAPPING.items())
        raise ValueError(f"state dict key {key!r} holds an unknown weight format {value!r}; known: {known}")
    if name != "row":
        raise ValueError(
            f"state dict key {key!r} is {value!r} ({name!r}): only the row-major format 'row' (0) is supported; "
            "re-save the checkpoint with bitsandbytes >= 0.45"
        )
    return name


class Int8WeightIO:
    """state_dict saving/loading for a module whose ``weight`` is an Int8Params.

    Saving is a pure read. Loading accepts a floating-point weight (as saved by the unquantized module,
    quantized again if this module already was) or an int8 ``weight`` with its ``SCB``, into a module
    in any state, including one just built and never moved. A bad entry is reported as torch reports
    its own: ``load_state_dict`` raises ``RuntimeError`` naming the key, and this module keeps its weight.
    """

    _int8_write_format = False  # Linear8bitLt also writes the legacy ``weight_format`` key

    def _int8_scb(self):
        scb = getattr(self.weight, "SCB", None)
        if scb is None:
            state = getattr(self, "state", None)
            scb = getattr(state, "SCB", None)
        return scb

    def _int8_holds_fp16(self) -> bool:
        return bool(getattr(self.weight, "has_fp16_weights", False))

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        scb = self._int8_scb()
        if self.weight.dtype == torch.int8 and scb is not None:
            destination[prefix + "SCB"] = scb if keep_vars else scb.detach()
            if self._int8_write_format:
                destination[prefix + "weight_format"] = torch.tensor(
                    LINEAR_8BIT_WEIGHTS_FORMAT_MAPPING["row"], dtype=torch.uint8
                )

    def _check_int8_entries(self, state_dict, prefix):
        wkey, skey, fkey = prefix + "weight", prefix + "SCB", prefix + "weight_format"
        if fkey in state_dict:
            weight_format_name(state_dict[fkey], fkey)
        weight, scb = state_dict.get(wkey), state_dict.get(skey)
        if weight is None:
            if scb is not None:
                raise ValueError(f"state dict has {skey!r} (row scales) but no {wkey!r} (the int8 codes)")
            return None, None
        if not isinstance(weight, torch.Tensor):
            raise TypeError(f"state dict key {wkey!r} must be a torch.Tensor; got {type(weight).__name__}")
        if weight.dtype == torch.int8:
            if scb is None:
                raise ValueError(f"state dict has an int8 {wkey!r} but no {skey!r}: int8 codes need their row scales")
            if not isinstance(scb, torch.Tensor):
                raise TypeError(f"state dict key {skey!r} must be a torch.Tensor; got {type(scb).__name__}")
            if scb.dtype != torch.float32:
                raise TypeError(f"state dict key {skey!r} must have dtype float32; got {scb.dtype}")
            if weight.dim() != 2 or tuple(scb.shape) != (weight.shape[0],):
                raise ValueError(
                    f"state dict key {skey!r} must hold one scale per row of {wkey!r} (shape "
                    f"{(weight.shape[0],) if weight.dim() else '?'}); got shape {tuple(scb.shape)}"
                )
            if self._int8_holds_fp16():
                raise ValueError(
                    f"state dict key {wkey!r} is int8 but this module keeps floating-point weights "
                    "(has_fp16_weights=True); build it with has_fp16_weights=False to load a quantized checkpoint"
                )
        elif weight.is_floating_point():
            if scb is not None:
                raise ValueError(f"state dict has {skey!r} but {wkey!r} is {weight.dtype}, not int8 codes")
        else:
            raise TypeError(f"state dict key {wkey!r} must be int8 codes or floating point; got {weight.dtype}")
        return weight, scb

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ):
        try:
            weight_in, scb_in = self._check_int8_entries(state_dict, prefix)
        except (TypeError, ValueError) as e:
            # Reported the way torch reports its own problems (a RuntimeError from load_state_dict,
            # which clients catch), and before anything is copied.
            error_msgs.append(str(e))
            return
        if weight_in is not None and weight_in.dtype == torch.int8 and not isinstance(self.weight, Int8Params):
            error_msgs.append(
                f"cannot load the int8 {prefix}weight and its {prefix}SCB: this module's weight is a plain "
                f"{type(self.weight).__name__} ({self.weight.dtype}), not an Int8Params (tied to another "
                "module's weight?); loading would overwrite that tensor with int8 codes"
            )
            return
        before = self.weight
        n_errors = len(error_msgs)
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )
        for extra in ("SCB", "weight_format"):
            if prefix + extra in unexpected_keys:
                unexpected_keys.remove(prefix + extra)
        if weight_in is None or len(error_msgs) > n_errors:
            return
        assigned = self.weight is not before  # load_state_dict(assign=True)
        device = weight_in.device if assigned or before.device.type == "meta" else before.device
        if weight_in.dtype == torch.int8:
            data = weight_in if assigned else weight_in.detach().to(device, copy=True)
            scb = scb_in if assigned else scb_in.detach().to(device, copy=True)
            new = Int8Params(data, requires_grad=False, has_fp16_weights=False, CB=data, SCB=scb)
        else:
            was_quantized = before.dtype == torch.int8
            if not assigned and not was_quantized and isinstance(self.weight, Int8Params):
                self._int8_reset_state()
                return  # the floating-point values were copied into the weight in place
            dtype = weight_in.dtype if was_quantized or assigned else before.dtype
            data = weight_in.detach().to(device=device, dtype=dtype, copy=not assigned)
            holds_fp16 = self._int8_holds_fp16()
            new = Int8Params(data, requires_grad=holds_fp16 and before.requires_grad, has_fp16_weights=holds_fp16)
            if was_quantized and not holds_fp16 and device.type != "meta":
                new._quantize(device)
        self.weight = new
        self._int8_reset_state()

    def _apply(self, fn, recurse=True):
        # Module.to()/cuda()/to_empty() may copy only the data into the parameter, or replace it by a
        # plain Parameter: keep an Int8Params, with its scales on the weight's device.
        before = self.weight
        scb = self._int8_scb()
        super()._apply(fn, recurse)
        weight = self.weight
        if not isinstance(weight, Int8Params):
            weight = Int8Params(
                weight.data, requires_grad=weight.requires_grad, has_fp16_weights=self._int8_holds_fp16()
            )
            self.weight = weight
        if weight.dtype == torch.int8:
            weight.CB = weight.data
            scb = weight.SCB if weight.SCB is not None else scb
            if scb is not None and scb.device != weight.device:
                if scb.device.type == "meta" or weight.device.type == "meta":
                    scb = torch.empty_like(scb, device=weight.device)
                else:
                    scb = scb.to(weight.device)
            weight.SCB = scb
        elif weight is not before:
            weight.SCB = weight.CB = None
        self._int8_reset_state()
        return self

    def _int8_reset_state(self):
        state = getattr(self, "state", None)
        if state is not None:
            state.reset_grads()
