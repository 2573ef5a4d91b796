"""A compiled kernel module: its kernels, called with torch CPU tensors and Python scalars.

Each kernel knows its parameter types from the signature the module exports (see runtime.h), so every
argument is checked before the launch: a tensor for a pointer (CPU, contiguous, a dtype that matches the
element type), an int in range for an integer, a float for a floating-point parameter. Tensors are copied
into guarded memory for the launch and written back afterwards unless the parameter points to const.
"""

from __future__ import annotations

import ctypes
import operator
import re
from collections.abc import Mapping

import torch

from .errors import EmulationError

_c_uint3 = ctypes.c_uint * 3


class _Arg(ctypes.Structure):
    # Mirrors bnb_emu::Arg in runtime.h.
    _fields_ = [
        ("kind", ctypes.c_int32),
        ("readonly", ctypes.c_int32),
        ("nbytes", ctypes.c_int64),
        ("i", ctypes.c_int64),
        ("f", ctypes.c_double),
        ("ptr", ctypes.c_void_p),
        ("name", ctypes.c_char_p),
    ]


_BUFFER, _INT, _FLOAT, _BYTES = 0, 1, 2, 3
_EMPTY = ctypes.c_char()  # what an empty tensor's buffer is staged from (nothing is copied)

# Element codes a tensor dtype can be passed as (integers of one width go either way: kernels
# reinterpret signedness freely).
_DTYPE_CODES = {
    torch.float32: {"f32"},
    torch.float64: {"f64"},
    torch.float16: {"h", "i16", "u16"},
    torch.bfloat16: {"b", "i16", "u16"},
    torch.int8: {"i8", "u8"},
    torch.uint8: {"i8", "u8"},
    torch.bool: {"?", "i8", "u8"},
    torch.int16: {"i16", "u16"},
    torch.int32: {"i32", "u32"},
    torch.int64: {"i64", "u64"},
}
for _name, _codes in (("uint16", {"i16", "u16"}), ("uint32", {"i32", "u32"}), ("uint64", {"i64", "u64"})):
    if hasattr(torch, _name):
        _DTYPE_CODES[getattr(torch, _name)] = _codes

_CODE_NAMES = {"h": "__half", "b": "__nv_bfloat16 / bfloat", "?": "bool", "v": "void"}


def _describe(code: str) -> str:
    if code.startswith("p"):
        const = code.startswith("pc")
        inner = code[2:] if const else code[1:]
        return ("const " if const else "") + _describe(inner) + "*"
    if code in _CODE_NAMES:
        return _CODE_NAMES[code]
    kinds = {"i": "int", "u": "uint", "f": "float", "s": "struct of "}
    return kinds.get(code[0], "?") + code[1:] + ("" if code[0] != "s" else " bytes")


def _dim(value, what: str, minimum: int) -> tuple[int, int, int]:
    if isinstance(value, int):
        value = (value,)
    try:
        dims = tuple(operator.index(v) for v in value)
    except TypeError:
        raise TypeError(f"{what} must be an int or a tuple of 1 to 3 ints, got {value!r}") from None
    if not 1 <= len(dims) <= 3 or any(d < minimum or d >= 2**31 for d in dims):
        raise ValueError(f"{what} must be 1 to 3 ints >= {minimum}, got {value!r}")
    return dims + (1,) * (3 - len(dims))


class Kernel:
    """One exported kernel. ``kernel[grid, block]`` or ``kernel[grid, block, shared_bytes]`` gives a
    callable taking the kernel's arguments, like ``kernel<<<grid, block, shared_bytes>>>(...)``."""

    def __init__(self, module: Module, name: str, call, signature: str, param_names: list[str] | None) -> None:
        self.module = module
        self.name = name
        self._call = call
        self.codes = [c for c in signature.split(",") if c]
        names = param_names if param_names and len(param_names) == len(self.codes) else None
        self.param_names = names or [f"argument {i}" for i in range(len(self.codes))]

    def __repr__(self) -> str:
        params = ", ".join(f"{_describe(c)} {n}" for c, n in zip(self.codes, self.param_names, strict=True))
        return f"<emulated kernel {self.name}({params})>"

    def __getitem__(self, launch):
        if not isinstance(launch, tuple) or len(launch) not in (2, 3):
            raise TypeError(f"{self.name}[grid, block] or [grid, block, shared_bytes] expected, got {launch!r}")
        grid, block, *shared = launch
        return lambda *args: self.launch(grid, block, *args, shared=shared[0] if shared else 0)

    def launch(self, grid, block, *args, shared: int = 0) -> None:
        """Run the kernel over ``grid`` blocks of ``block`` threads with ``shared`` bytes of dynamic
        shared memory per block; raises EmulationError if the launch fails."""
        g, b = _dim(grid, "grid", 0), _dim(block, "block", 1)
        shared = operator.index(shared)
        if shared < 0:
            raise ValueError(f"shared must be >= 0 bytes, got {shared}")
        if len(args) != len(self.codes):
            raise TypeError(f"kernel {self.name} takes {len(self.codes)} arguments ({self._params()}), got {len(args)}")
        packed = (_Arg * max(1, len(args)))()
        keep = []  # names and bytes the C side points into, alive for the call
        for i, (code, value) in enumerate(zip(self.codes, args, strict=True)):
            self._pack(packed[i], i, code, value, keep)
        rc = self._call(_c_uint3(*g), _c_uint3(*b), ctypes.c_ulonglong(shared), packed, len(args))
        if rc != 0:
            raise EmulationError(self.module.last_error())

    def _params(self) -> str:
        return ", ".join(self.param_names)

    def _pack(self, slot: _Arg, i: int, code: str, value, keep: list) -> None:
        pname = self.param_names[i]
        where = f"kernel {self.name}: argument {i} ({pname}, {_describe(code)})"
        if code.startswith("p"):
            slot.kind = _BUFFER
            inner = code[2:] if code.startswith("pc") else code[1:]
            label = f"{pname}"
            if value is None:
                slot.nbytes, slot.ptr = 0, None
            else:
                if not isinstance(value, torch.Tensor):
                    raise TypeError(f"{where} must be a torch.Tensor (or None), got {type(value).__name__}")
                if value.device.type != "cpu":
                    raise ValueError(f"{where} must be a CPU tensor, got device {value.device}")
                if not value.is_contiguous():
                    raise ValueError(f"{where} must be contiguous")
                self._check_dtype(where, inner, value)
                slot.nbytes = value.numel() * value.element_size()
                # An empty tensor still gets a (zero-byte, guarded) buffer; only None is a null pointer.
                slot.ptr = value.data_ptr() if slot.nbytes else ctypes.addressof(_EMPTY)
                label = f"{pname}" + (f" ({str(value.dtype).removeprefix('torch.')}[{value.numel()}])")
            encoded = label.encode()[:63]
            keep.append(encoded)
            slot.name = encoded
        elif code[0] in "iu" or code == "?":
            if isinstance(value, float) or (isinstance(value, torch.Tensor) and value.is_floating_point()):
                raise TypeError(f"{where} must be an int, got {value!r}")
            try:
                v = operator.index(value)
            except TypeError:
                raise TypeError(f"{where} must be an int, got {type(value).__name__}") from None
            bits = 1 if code == "?" else int(code[1:])
            lo, hi = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if code[0] == "i" else (0, 2**bits - 1)
            if not lo <= v <= hi:
                raise ValueError(f"{where} must be in [{lo}, {hi}], got {v}")
            slot.kind, slot.i = _INT, v if code[0] != "u" or v < 2**63 else v - 2**64
        elif code[0] == "f" or code in ("h", "b"):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                try:
                    value = float(value)
                except (TypeError, ValueError):
                    raise TypeError(f"{where} must be a float, got {type(value).__name__}") from None
            slot.kind, slot.f = _FLOAT, float(value)
        elif code[0] == "s":
            size = int(code[1:])
            data = bytes(value) if isinstance(value, (bytes, bytearray, memoryview, ctypes.Structure)) else None
            if data is None or len(data) != size:
                raise TypeError(f"{where} must be {size} bytes (bytes or a ctypes.Structure), got {value!r}")
            buf = ctypes.create_string_buffer(data, size)
            keep.append(buf)
            slot.kind, slot.nbytes, slot.ptr = _BYTES, size, ctypes.addressof(buf)
        else:
            raise TypeError(f"{where}: parameter type code {code!r} is not supported from Python")

    @staticmethod
    def _check_dtype(where: str, inner: str, t: torch.Tensor) -> None:
        if inner == "v":
            return
        if inner.startswith("s"):  # vector types and structs: whole elements of the tensor's dtype
            if int(inner[1:]) % t.element_size() == 0:
                return
        elif inner in _DTYPE_CODES.get(t.dtype, ()):
            return
        raise TypeError(f"{where} cannot take a {t.dtype} tensor")


class Module:
    """A compiled kernel source; kernels are attributes (``module.my_kernel``) and ``module[name]``."""

    def __init__(self, path, source_name: str, source_text: str, exports: Mapping[str, str]) -> None:
        self.path = path
        self.source_name = source_name
        # PyDLL keeps the GIL for the call: launches install process-wide signal handlers.
        self._lib = ctypes.PyDLL(str(path))
        self._lib.bnb_emu_last_error.restype = ctypes.c_char_p
        self.kernels: dict[str, Kernel] = {}
        for name in exports:
            sig_fn = getattr(self._lib, f"bnb_emu_signature_{name}")
            sig_fn.restype = ctypes.c_char_p
            call = getattr(self._lib, f"bnb_emu_call_{name}")
            call.restype = ctypes.c_int
            call.argtypes = [_c_uint3, _c_uint3, ctypes.c_ulonglong, ctypes.POINTER(_Arg), ctypes.c_int]
            function = re.split(r"[<\s(]", exports[name].strip(), maxsplit=1)[0].split("::")[-1]
            from .source import parameter_names

            names = parameter_names(source_text, function)
            self.kernels[name] = Kernel(self, name, call, sig_fn().decode(), names)

    def last_error(self) -> str:
        return (self._lib.bnb_emu_last_error() or b"").decode(errors="replace")

    def __getitem__(self, name: str) -> Kernel:
        try:
            return self.kernels[name]
        except KeyError:
            raise KeyError(f"{self.source_name} exports no kernel {name!r}; it has {sorted(self.kernels)}") from None

    def __getattr__(self, name: str) -> Kernel:
        kernels = self.__dict__.get("kernels", {})
        if name in kernels:
            return kernels[name]
        raise AttributeError(f"{self.source_name} exports no kernel {name!r}; it has {sorted(kernels)}")

    def __repr__(self) -> str:
        return f"<emulated module {self.source_name}: {', '.join(self.kernels)}>"
