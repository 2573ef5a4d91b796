"""Params4bit: a weight that quantizes itself to packed 4-bit NF4/FP4 on its first move to a device.

Clients rebuild it from its own attributes (``Params4bit(t, requires_grad=..., **old.__dict__)``), so
every attribute stored in ``__dict__`` is an accepted keyword, unknown keywords are ignored, and
``__dict__`` never holds ``data`` or ``requires_grad``.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from .. import _checks as c
from ..functional import QuantState, quantize_4bit

_NOT_QUANTIZED = "no quant_state yet (the weight is quantized on its first .to(device))"


def _check_settings(blocksize: object, quant_type: object, quant_storage: object) -> None:
    c.blocksize(blocksize)
    c.quant_type(quant_type)
    c.dtype_arg("quant_storage", quant_storage, c.QUANT_STORAGE_DTYPES)


class Params4bit(torch.nn.Parameter):
    """A frozen 4-bit weight: float values until first moved to a (non-meta) device, packed codes after.

    Once quantized, ``data`` holds the packed codes (two per byte, viewed as ``quant_storage``) and
    ``quant_state`` what is needed to dequantize them; ``dequantize_4bit(p.data, p.quant_state)``
    gives the weight back at any moment.
    """

    def __new__(
        cls,
        data: torch.Tensor | None = None,
        requires_grad: bool = False,
        quant_state: QuantState | None = None,
        blocksize: int | None = None,
        compress_statistics: bool = True,
        quant_type: str = "fp4",
        quant_storage: torch.dtype = torch.uint8,
        module: torch.nn.Module | None = None,
        bnb_quantized: bool = False,
        **kwargs: Any,  # attributes other libraries add to __dict__ (e.g. "_is_hf_initialized")
    ) -> Params4bit:
        if data is None:
            data = torch.empty(0)
        c.tensor("data", data)
        if blocksize is None:
            blocksize = 64
        _check_settings(blocksize, quant_type, quant_storage)
        if quant_state is not None and not isinstance(quant_state, QuantState):
            raise TypeError(f"quant_state must be a QuantState or None; got {type(quant_state).__name__}")
        self = torch.Tensor._make_subclass(cls, data, requires_grad)
        self.blocksize = blocksize
        self.compress_statistics = compress_statistics
        self.quant_type = quant_type
        self.quant_state = quant_state
        self.quant_storage = quant_storage
        self.bnb_quantized = bool(bnb_quantized)
        self.module = module
        return self

    # --- copying and pickling -------------------------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["data"] = self.data
        state["requires_grad"] = self.requires_grad
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = dict(state)
        self.data = state.pop("data")
        self.requires_grad = state.pop("requires_grad")
        self.__dict__.update(state)

    def __reduce_ex__(self, protocol):
        # torch.nn.Parameter's own reduction rebuilds a plain Parameter and loses the class. This one
        # is the class called with (data, requires_grad) plus __setstate__, which upstream's class
        # also understands: pickles load under either implementation.
        state = self.__getstate__()
        return (type(self), (state["data"], state["requires_grad"]), state)

    def __deepcopy__(self, memo):
        if id(self) in memo:
            return memo[id(self)]
        state = self.__getstate__()
        module = state.pop("module")
        state = copy.deepcopy(state, memo)
        # A module being deep-copied maps to its copy; a lone weight keeps pointing at its module.
        state["module"] = memo.get(id(module), module) if module is not None else None
        new = type(self).__new__(type(self))
        new.__setstate__(state)
        memo[id(self)] = new
        return new

    def __copy__(self):
        new = type(self).__new__(type(self))
        new.__setstate__(self.__getstate__())
        return new

    # --- FSDP resolves state_dict keys such as "weight.absmax" with getattr on the weight --------

    def _qs(self, name: str, nested: bool = False) -> QuantState:
        qs = self.__dict__.get("quant_state")
        if qs is None or (nested and qs.state2 is None):
            raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")
        return qs

    absmax = property(lambda self: self._qs("absmax").absmax)
    code = property(lambda self: self._qs("code").code)
    quant_map = property(lambda self: self._qs("quant_map").code)
    offset = property(lambda self: self._qs("offset").offset)
    state2 = property(lambda self: self._qs("state2").state2)
    nested_absmax = property(lambda self: self._qs("nested_absmax", True).state2.absmax)
    nested_blocksize = property(lambda self: self._qs("nested_blocksize", True).state2.blocksize)
    nested_quant_map = property(lambda self: self._qs("nested_quant_map", True).state2.code)
    nested_dtype = property(lambda self: self._qs("nested_dtype", True).state2.dtype)
    nested_offset = property(lambda self: self._qs("nested_offset").offset)

    # --- building from a checkpoint -------------------------------------------------------------

    @classmethod
    def from_prequantized(
        cls,
        data: torch.Tensor,
        quantized_stats: dict[str, Any],
        requires_grad: bool = False,
        device="cuda",
        module: torch.nn.Module | None = None,
        **kwargs: Any,
    ) -> Params4bit:
        """A quantized weight from packed codes and their ``QuantState.as_dict()`` items (any key prefix)."""
        c.tensor("data", data)
        qs = QuantState.from_dict(qs_dict=quantized_stats, device=device)
        if qs.quant_type is None:
            raise ValueError("quantized_stats must describe a 4-bit quant_state (quant_type 'nf4' or 'fp4')")
        need = c.packed_4bit_bytes(int(torch.Size(qs.shape).numel()))
        have = data.numel() * data.element_size()
        if have != need:
            raise ValueError(
                f"data holds {have} bytes but a 4-bit weight of shape {list(qs.shape)} packs into {need} bytes"
            )
        self = cls(
            data.to(device),
            requires_grad=requires_grad,
            quant_state=qs,
            blocksize=qs.blocksize,
            compress_statistics=qs.nested,
            quant_type=qs.quant_type,
            quant_storage=data.dtype,
            module=module,
            bnb_quantized=True,
        )
        if module is not None:
            module.quant_state = qs
        return self

    # --- quantization on the first move ---------------------------------------------------------

    def _quantize(self, device: torch.device) -> Params4bit:
        if self.data.device.type == "meta":
            raise ValueError(
                "Params4bit is on the meta device (it holds no values) and cannot be quantized; "
                "load the real weight first (e.g. Params4bit(tensor, **old.__dict__))"
            )
        if self.dtype not in c.FLOAT_DTYPES:
            raise TypeError(
                f"Params4bit data must be float16, bfloat16 or float32 to be quantized; got {self.dtype} "
                "(for already packed codes use Params4bit.from_prequantized)"
            )
        w = self.data.contiguous().to(device)
        packed, qs = quantize_4bit(
            w,
            blocksize=self.blocksize,
            compress_statistics=bool(self.compress_statistics),
            quant_type=self.quant_type,
            quant_storage=self.quant_storage,
        )
        self.data = packed
        self.quant_state = qs
        self.bnb_quantized = True
        if self.module is not None:
            self.module.quant_state = qs
        return self

    def cpu(self):
        return self.to(device="cpu")

    def cuda(self, device=None, non_blocking: bool = False):
        return self.to(device="cuda" if device is None else device, non_blocking=non_blocking)

    def xpu(self, device=None, non_blocking: bool = False):
        return self.to(device="xpu" if device is None else device, non_blocking=non_blocking)

    def to(self, *args, **kwargs):
        device, dtype, non_blocking, _ = torch._C._nn._parse_to(*args, **kwargs)
        if device is not None and device.type != "meta" and not self.bnb_quantized:
            if dtype is not None:
                self.data = self.data.to(dtype)
            return self._quantize(device)
        if self.bnb_quantized:
            # Packed codes are not numbers: a dtype change (model.half(), bf16 quant_storage) must not
            # convert them. The quant_state follows the data, in place, as upstream does.
            dtype = None
            if self.quant_state is not None and device is not None:
                self.quant_state.to(device)
        moved = super().to(device=device, dtype=dtype, non_blocking=non_blocking)
        return type(self)(
            moved,
            requires_grad=self.requires_grad,
            quant_state=self.quant_state,
            blocksize=self.blocksize,
            compress_statistics=self.compress_statistics,
            quant_type=self.quant_type,
            quant_storage=self.quant_storage,
            module=self.module,
            bnb_quantized=self.bnb_quantized,
        )

    # nn.Module.half() / .float() / .bfloat16() / .double() call these on every floating parameter.
    def half(self, *args, **kwargs):
        return self if self.bnb_quantized else super().half(*args, **kwargs)

    def float(self, *args, **kwargs):
        return self if self.bnb_quantized else super().float(*args, **kwargs)

    def bfloat16(self, *args, **kwargs):
        return self if self.bnb_quantized else super().bfloat16(*args, **kwargs)

    def double(self, *args, **kwargs):
        return self if self.bnb_quantized else super().double(*args, **kwargs)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if kwargs is None:
            kwargs = {}
        result = super().__torch_function__(func, types, args, kwargs)
        if func not in (torch.chunk, torch.split, torch.Tensor.chunk, torch.Tensor.split):
            return result
        # FSDP shards the packed weight with chunk/split; each piece keeps the quantization metadata.
        src = args[0]

        def wrap(t: torch.Tensor) -> Params4bit:
            return cls(
                t,
                requires_grad=src.requires_grad,
                quant_state=src.quant_state,
                blocksize=src.blocksize,
                compress_statistics=src.compress_statistics,
                quant_type=src.quant_type,
                quant_storage=src.quant_storage,
                module=src.module,
                bnb_quantized=src.bnb_quantized,
            )

        return tuple(wrap(t) for t in result) if isinstance(result, (tuple, list)) else wrap(result)

    def __repr__(self) -> str:
        if self.bnb_quantized and self.quant_state is not None:
            return f"Params4bit(packed {tuple(self.shape)} {self.dtype}, {self.quant_state!r})"
        return f"Params4bit(not quantized, {self.quant_type}) containing:\n{super().__repr__()}"


def fix_4bit_weight_quant_state_from_module(module: torch.nn.Module) -> None:
    """Give ``module.weight`` back the quant_state kept on the module when a wrapper dropped it (FSDP)."""
    weight = module.weight
    if getattr(weight, "quant_state", None) is not None:
        return
    qs = getattr(module, "quant_state", None)
    if qs is None:
        raise RuntimeError(
            f"{type(module).__name__}.weight is not quantized yet: move the module to a device first "
            "(module.to(device) quantizes it), or load a quantized state_dict"
        )
    if weight.dim() != 2 or weight.shape[1] != 1:
        raise RuntimeError(
            f"{type(module).__name__}.weight has lost its quant_state and is not packed 4-bit data "
            f"(shape {tuple(weight.shape)}, expected [bytes, 1])"
        )
    if not isinstance(weight, Params4bit):
        module.weight = Params4bit(
            weight.data, requires_grad=False, quant_storage=weight.dtype, module=module, bnb_quantized=True
        )
    module.weight.quant_state = qs


def is_dtensor(t: object) -> bool:
    """Whether ``t`` is a torch.distributed DTensor (without importing torch.distributed when unused)."""
    return any(k.__name__ == "DTensor" and k.__module__.startswith("torch.distributed") for k in type(t).__mro__)


def weight_quant_state(module: torch.nn.Module) -> QuantState | None:
    """The QuantState of ``module.weight``, also when a wrapper (FSDP) has swapped the weight tensor.

    A quantized ``Params4bit`` carries its own state, and the module keeps a reference to it (refreshed
    here), because FSDP replaces the parameter by a plain tensor or a DTensor of the same packed bytes.
    Attributes are read with getattr, never through ``__dict__``: forward runs this, and torch.compile
    cannot trace ``__dict__`` of a tensor subclass (it graph-breaks, or fails with fullgraph=True).
    """
    weight = module._parameters.get("weight")
    qs = getattr(weight, "quant_state", None) if isinstance(weight, Params4bit) else None
    if qs is not None:
        if getattr(module, "quant_state", None) is not qs:
            module.quant_state = qs
        if getattr(module, "quant_storage", None) is not weight.dtype:
            module.quant_storage = weight.dtype
        return qs
    return getattr(module, "quant_state", None)


class Keeps4bitWeightState:
    """Mixin for modules with a 4-bit ``weight``: whatever Params4bit is assigned, the module learns its state.

    The module must hold its own reference to the QuantState before a wrapper such as FSDP swaps the
    weight for a plain tensor, also when the weight was quantized on its own (without ``module=``).
    """

    def register_parameter(self, name: str, param) -> None:
        super().register_parameter(name, param)
        if name == "weight" and isinstance(param, Params4bit):
            if param.__dict__.get("module") is None:
                param.module = self
            weight_quant_state(self)


def packed_weight_and_state(module: torch.nn.Module) -> tuple[torch.Tensor, QuantState]:
    """``module.weight``'s packed codes and their QuantState, ready for a 4-bit kernel; never mutates the module.

    Works for a ``Params4bit`` and for the plain tensor a sharding wrapper puts in its place for the
    forward (FSDP's all-gathered parameter), which must then still hold the exact packed bytes.
    """
    name = type(module).__name__
    weight = module.weight
    qs = weight_quant_state(module)
    if qs is None:
        raise RuntimeError(
            f"{name}.weight is not quantized yet: move the module to a device first "
            "(module.to(device) quantizes it), or load a quantized state_dict"
        )
    if isinstance(weight, Params4bit) and weight.quant_state is qs:
        return weight, qs
    if is_dtensor(weight):
        raise RuntimeError(
            f"{name}.weight is a sharded DTensor: the 4-bit kernels need the whole packed weight. Call the "
            "forward of the FSDP-wrapped root module (it all-gathers the weight first), or unshard() the module"
        )
    storage = getattr(module, "quant_storage", None)
    if storage is not None and weight.dtype != storage:
        raise RuntimeError(
            f"{name}.weight holds {weight.dtype} but its packed 4-bit codes are stored as quant_storage={storage}: "
            "something cast the codes as if they were numbers, which destroys them. Under FSDP, give this "
            f"module MixedPrecisionPolicy(param_dtype={storage}) or param_dtype=None (fully_shard the 4-bit "
            "modules with their own policy), or build the model with quant_storage equal to param_dtype"
        )
    # quantize_4bit's packed length: (n + 1) // 2 bytes, in whole quant_storage elements.
    need = (int(torch.Size(qs.shape).numel()) + 1) // (2 * weight.element_size())
    if weight.numel() != need:
        raise RuntimeError(
            f"{name}.weight holds {weight.numel()} {weight.dtype} elements but its quant_state (shape "
            f"{list(qs.shape)}) needs {need} elements of packed 4-bit codes"
        )
    return weight, qs


# Upstream's location (pickles of modules that hold the class refer to it by this path).
Params4bit.__module__ = "bitsandbytes.nn.modules"
