"""Upstream's ``bitsandbytes.cextension``: ``lib``, the native library that ctypes callers use directly.

Upstream loads one shared library (``libbitsandbytes_cuda*.so``) and some tools call its C entry points
themselves: unsloth and axolotl read ``bitsandbytes.functional.lib.cdequantize_blockwise_fp32`` and the
like at import and call them with pointers from ``get_ptr``. Here native code lives in backend plugins,
so ``lib`` is the ``ctypes.CDLL`` that a loaded backend offers through ``Backend.native_library()``
(the CUDA backend's kernel library exports upstream's entry points; no backend is named here).

``lib.<name>`` always resolves, as upstream's: to the library's function when it exports ``name``,
otherwise to a plain Python function that raises ``RuntimeError`` when called, saying why no native
code serves it and what does. Tools tell the two apart the way unsloth does: a real entry point is a
ctypes function (it has ``restype``), the stand-in is not.
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from .consts import DYNAMIC_LIBRARY_SUFFIX, PACKAGE_DIR
from .cuda_specs import CUDASpecs, get_cuda_specs, get_cuda_version_string, get_rocm_gpu_arch

__all__ = [
    "BNB_BACKEND",
    "HIP_ENVIRONMENT",
    "ROCM_GPU_ARCH",
    "BNBNativeLibrary",
    "NativeLibrary",
    "get_cuda_bnb_library_path",
    "get_native_library",
    "lib",
    "provide_native_library",
]

HIP_ENVIRONMENT = bool(torch.version.hip)
if HIP_ENVIRONMENT:
    BNB_BACKEND = "ROCm"
elif torch.cuda.is_available():
    BNB_BACKEND = "CUDA"
elif getattr(torch._C, "_has_xpu", False):
    BNB_BACKEND = "XPU"
else:
    BNB_BACKEND = "CPU"
ROCM_GPU_ARCH = get_rocm_gpu_arch()

# Which op does what an upstream entry point does, for the error message (checked in order).
_OP_OF_SYMBOL = (
    (re.compile(r"^cdequantize_blockwise_\w+_(nf4|fp4)$"), "dequantize_4bit"),
    (re.compile(r"^cdequantize_blockwise_(cpu_)?\w+$"), "dequantize_blockwise"),
    (re.compile(r"^cquantize_blockwise_\w+_(nf4|fp4)$"), "quantize_4bit"),
    (re.compile(r"^cquantize_blockwise_\w+$"), "quantize_blockwise"),
    (re.compile(r"^cgem[mv]_4bit_inference"), "gemv_4bit"),
)
_SERVED_BY = (
    "Upstream's C entry points are served by the native library of the CUDA backend (bitsandbytes-cuda: "
    "pip install 'bitsandbytes[cuda]') on a machine with an NVIDIA GPU"
)


@dataclass(frozen=True)
class _State:
    library: Any  # a ctypes.CDLL, or None
    origin: str  # who provided it, or why there is none
    final: bool  # False before the backends have loaded: look again next time


def _instead(name: str) -> str:
    for pattern, op in _OP_OF_SYMBOL:
        if pattern.match(name):
            return f"torch.ops.bitsandbytes.{op} (bitsandbytes.functional.{op}), the same computation on every device"
    return "the functional API (bitsandbytes.functional) or torch.ops.bitsandbytes, which run on every device"


def _library_path(library: Any) -> str:
    return str(getattr(library, "_name", None) or library)


_provided: tuple[Any, str] | None = None


def provide_native_library(library: ctypes.CDLL | Callable[[], ctypes.CDLL] | None, origin: str = "") -> tuple:
    """Serve ``lib`` from ``library`` (a CDLL, or a callable returning one at first use) instead of the
    backends'; None goes back to the backends. Returns the previous setting, to restore it.

    For test harnesses: the CUDA backend's emulated test plugin serves the emulated kernel library this way.
    """
    global _provided
    previous = _provided
    _provided = None if library is None else (library, origin or repr(library))
    lib._reset()
    return previous if previous is not None else (None, "")


def _from_backends() -> _State:
    from .backends import discovery

    final = discovery._loaded
    loaded, others, broken = [], [], []
    for record in discovery.RECORDS:
        if record.status != discovery.LOADED:
            others.append(f"{record.name} ({record.summary()})")
            continue
        loaded.append(record.name)
        if record.backend is None:
            continue
        try:
            library = record.backend.native_library()
        except Exception as exc:
            broken.append(f"backend {record.name!r} could not open its native library: {type(exc).__name__}: {exc}")
            continue
        if library is not None:
            return _State(library, f"backend {record.name!r} ({_library_path(library)})", final)
    why = "; ".join(broken) or "no loaded backend provides a native library"
    why += f" (loaded backends: {', '.join(loaded) or 'none'}"
    why += f"; not loaded: {', '.join(others)})" if others else ")"
    return _State(None, why, final)


class NativeLibrary:
    """What upstream's ``BNBNativeLibrary`` is to its callers: ``lib.<name>`` is the native function, or a
    stand-in that raises when called. ``_lib`` is the ``ctypes.CDLL`` behind it (None when there is none)."""

    def __init__(self) -> None:
        self._state: _State | None = None
        self._stand_ins: dict[str, tuple[str, Callable]] = {}  # name -> (the state's origin, stand-in)

    def _reset(self) -> None:
        self._state = None
        self._stand_ins.clear()

    def _resolve(self) -> _State:
        state = self._state
        if state is None:
            if _provided is not None:
                library, origin = _provided
                try:
                    if not isinstance(library, ctypes.CDLL) and callable(library):
                        library = library()
                    state = _State(library, origin, True)
                except Exception as exc:
                    state = _State(None, f"{origin} could not open its library: {type(exc).__name__}: {exc}", True)
            else:
                state = _from_backends()
            # "None" is not kept: a backend's load() may look at lib before the records are complete.
            if state.final and state.library is not None:
                self._state = state
        return state

    @property
    def _lib(self) -> ctypes.CDLL | None:
        return self._resolve().library

    @property
    def compiled_with_cuda(self) -> bool:
        """Whether a native library serves ``lib`` (upstream: whether it is the CUDA build)."""
        return self._lib is not None

    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)  # keeps copy, pickle and hasattr probes of dunders honest
        state = self._resolve()
        if state.library is not None:
            try:
                return getattr(state.library, name)
            except AttributeError:
                pass
        # The same object for every read while nothing changes, as upstream's cached lookup.
        cached = self._stand_ins.get(name)
        if cached is None or cached[0] != state.origin:
            cached = self._stand_ins[name] = (state.origin, _stand_in(name, state))
        return cached[1]

    def __getitem__(self, name: str):
        return self.__getattr__(name)

    def __repr__(self) -> str:
        state = self._resolve()
        if state.library is None:
            return f"<bitsandbytes native library: none ({state.origin})>"
        return f"<bitsandbytes native library from {state.origin}>"


BNBNativeLibrary = NativeLibrary  # upstream's name for the class


def _stand_in(name: str, state: _State) -> Callable:
    if state.library is None:
        reason = f"no native library is loaded here: {state.origin}. {_SERVED_BY}"
    else:
        reason = (
            f"the native library of {state.origin} does not export {name}; it exports upstream's 8-bit and 4-bit "
            "dequantize and 4-bit inference entry points"
        )

    def unavailable(*args, **kwargs):
        raise RuntimeError(f"bitsandbytes.functional.lib.{name}() was called, but {reason}. Use {_instead(name)}.")

    unavailable.__name__ = unavailable.__qualname__ = name
    return unavailable


lib = NativeLibrary()


def get_native_library() -> NativeLibrary:
    """``lib`` (upstream loads it here; here the backends provide it)."""
    return lib


def get_cuda_bnb_library_path(cuda_specs: CUDASpecs | None = None) -> Path:
    """The CUDA kernel library: the one serving ``lib``, else the file bitsandbytes-cuda installed, else
    (as upstream, when none is there) a path under this package that does not exist. ``cuda_specs`` is
    accepted for upstream's signature; one library serves every CUDA version here."""
    library = lib._lib
    if library is not None and getattr(library, "_name", None):
        return Path(library._name)
    try:
        files = metadata.distribution("bitsandbytes-cuda").files or []
    except metadata.PackageNotFoundError:
        files = []
    for file in files:
        if Path(str(file)).name.split(".")[0] in ("libbnb_cuda", "bnb_cuda"):
            return Path(str(file.locate())).resolve()
    specs = cuda_specs if cuda_specs is not None else get_cuda_specs()
    version = specs.cuda_version_string if specs is not None else (get_cuda_version_string() or "")
    return PACKAGE_DIR / f"libbitsandbytes_cuda{version}{DYNAMIC_LIBRARY_SUFFIX}"
