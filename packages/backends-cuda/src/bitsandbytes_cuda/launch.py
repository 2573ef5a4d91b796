"""``launch(name, grid, block, shmem, *args)``: run a kernel from the tables, on a GPU or in the emulator.

The real path calls the generated ``extern "C"`` launcher ``bnb_cuda_<name>`` of the shared library with
ctypes, on the current stream of the tensors' device. The emulated path (``use_emulator()``; tests) compiles
the same kernel source with ``bitsandbytes_emu`` and runs it on CPU tensors. Both check arguments
against the table entry first, so both raise the same errors for the same mistakes.
"""

from __future__ import annotations

import ctypes
import numbers
import os
import sys
import threading
from pathlib import Path

from . import tables
from .tables import Kernel

__all__ = [
    "LibraryError",
    "emulating",
    "emulator",
    "kernel_dir",
    "launch",
    "library",
    "library_path",
    "normalize_dim",
    "use_emulator",
]

_PACKAGE = Path(__file__).parent
_MAX_GRID = (2**31 - 1, 65535, 65535)
_MAX_BLOCK = (1024, 1024, 64)

_emulate = os.environ.get("BNB_CUDA_EMULATE", "") not in ("", "0")


class LibraryError(RuntimeError):
    """The CUDA kernel library cannot be found, loaded or used on this machine."""


def emulator():
    """The kernel emulator module (``bitsandbytes_emu``). It is a test extra, not a dependency: without it,
    a ModuleNotFoundError that names the distribution and the extra that brings it (an emulator that is
    installed but misses something it imports raises that error itself)."""
    import importlib.util

    if importlib.util.find_spec("bitsandbytes_emu") is None:
        raise ModuleNotFoundError(
            "the CUDA kernels run in emulation only with the kernel emulator installed: "
            "pip install 'bitsandbytes-cuda[test]' (or bitsandbytes-emu, the same version)",
            name="bitsandbytes_emu",
        )
    import bitsandbytes_emu

    return bitsandbytes_emu


def use_emulator(enabled: bool = True) -> bool:
    """Route every ``launch`` to the emulator (CPU tensors) or back to the library; returns the old setting.
    Turning it on needs the kernel emulator (``emulator()`` raises, naming it, where it is missing)."""
    global _emulate
    if enabled:
        emulator()
    old, _emulate = _emulate, bool(enabled)
    return old


def emulating() -> bool:
    """Whether ``launch`` runs kernels in the emulator."""
    return _emulate


# ---------------------------------------------------------------------------------------- arguments


def normalize_dim(value, what: str, limits: tuple[int, int, int]) -> tuple[int, int, int]:
    """An int or a 1-3 tuple of ints -> (x, y, z), each within 1..limit; ValueError/TypeError naming ``what``."""
    if type(value) is tuple and 1 <= len(value) <= 3 and all(type(d) is int for d in value):  # cheap common case
        dims = value + (1,) * (3 - len(value))
        if 1 <= dims[0] <= limits[0] and 1 <= dims[1] <= limits[1] and 1 <= dims[2] <= limits[2]:
            return dims
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        dims = (int(value),)
    elif isinstance(value, (tuple, list)) and 1 <= len(value) <= 3:
        dims = tuple(value)
        if not all(isinstance(d, numbers.Integral) and not isinstance(d, bool) for d in dims):
            raise TypeError(f"{what} must be an int or a tuple of 1 to 3 ints, got {value!r}")
        dims = tuple(int(d) for d in dims)
    else:
        raise TypeError(f"{what} must be an int or a tuple of 1 to 3 ints, got {value!r}")
    dims = dims + (1,) * (3 - len(dims))
    for axis, d, limit in zip("xyz", dims, limits, strict=True):
        if not 1 <= d <= limit:
            raise ValueError(f"{what}.{axis} must be in 1..{limit}, got {d} ({what} = {value!r})")
    return dims


def _geometry(grid, block, shmem) -> tuple[tuple[int, int, int], tuple[int, int, int], int]:
    if type(grid) is int and type(block) is int and type(shmem) is int:  # the common case, checked cheaply
        if 1 <= grid <= _MAX_GRID[0] and 1 <= block <= 1024 and 0 <= shmem <= 227 * 1024:
            return (grid, 1, 1), (block, 1, 1), shmem
    g = normalize_dim(grid, "grid", _MAX_GRID)
    b = normalize_dim(block, "block", _MAX_BLOCK)
    if b[0] * b[1] * b[2] > 1024:
        raise ValueError(f"block has {b[0] * b[1] * b[2]} threads ({block!r}); at most 1024 are allowed")
    if not isinstance(shmem, numbers.Integral) or isinstance(shmem, bool):
        raise TypeError(f"shmem must be an int (bytes of dynamic shared memory), got {shmem!r}")
    if not 0 <= shmem <= 227 * 1024:
        raise ValueError(f"shmem must be in 0..{227 * 1024} bytes, got {shmem}")
    return g, b, int(shmem)


_FLOAT_DTYPES = {"float": "float32", "double": "float64", "half": "float16", "__half": "float16"}
_FLOAT_DTYPES.update({"__nv_bfloat16": "bfloat16", "nv_bfloat16": "bfloat16"})


def _check_pointer(k: Kernel, i: int, ctype: str, value, device_type: str):
    import torch

    where = f"{k.name}: argument {i} ({ctype})"
    if value is None:
        return None
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{where} must be a tensor or None, got {type(value).__name__}")
    if value.device.type != device_type:
        mode = "in the emulator (use_emulator() is on)" if device_type == "cpu" else "on the GPU"
        raise ValueError(f"{where} is on {value.device}; kernels run {mode} take {device_type} tensors")
    if not value.is_contiguous():
        raise ValueError(f"{where} must be contiguous (shape {tuple(value.shape)}, stride {value.stride()})")
    pointee, _ = tables.element_type(ctype)
    want = _FLOAT_DTYPES.get(pointee)
    if want is not None:
        if str(value.dtype) != f"torch.{want}":
            raise TypeError(f"{where} needs a torch.{want} tensor, got {value.dtype}")
    elif pointee != "void":
        size = tables.POINTEE_TYPES[pointee]
        item = value.element_size()
        integral = not (value.dtype.is_floating_point or value.dtype.is_complex)
        scalar_int = pointee in tables.SCALAR_TYPES
        if (scalar_int and (not integral or item != size)) or (not scalar_int and size % item):
            raise TypeError(f"{where} needs a tensor of {size}-byte elements for {pointee}, got {value.dtype}")
    return value


def _check_scalar(k: Kernel, i: int, ctype: str, value):
    kind, size, signed = tables.SCALAR_TYPES[" ".join(ctype.split())]
    where = f"{k.name}: argument {i} ({ctype})"
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"{where} must be a Python number, got {type(value).__name__}")
        return float(value)
    if ctype == "bool":
        if not isinstance(value, (bool, numbers.Integral)):
            raise TypeError(f"{where} must be a bool, got {type(value).__name__}")
        return bool(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{where} must be an int, got {type(value).__name__}")
    value = int(value)
    lo, hi = (-(2 ** (8 * size - 1)), 2 ** (8 * size - 1) - 1) if signed else (0, 2 ** (8 * size) - 1)
    if not lo <= value <= hi:
        raise ValueError(f"{where} must be in {lo}..{hi}, got {value}")
    return value


# Per kernel, what each parameter accepts without further thought: (True, dtypes or None for any) for a
# pointer, (False, lo, hi) for an integer, (False, None, None) for a floating-point number. The fast path
# below admits exactly a subset of what the full checks admit; anything else takes the full checks, which
# either accept the argument (converting it) or raise a message naming it.
_plans: dict[str, tuple] = {}
_INT_RANGES = {(size, True): (-(2 ** (8 * size - 1)), 2 ** (8 * size - 1) - 1) for size in (1, 2, 4, 8)}
_INT_RANGES |= {(size, False): (0, 2 ** (8 * size) - 1) for size in (1, 2, 4, 8)}


def _pointer_dtypes(ctype: str):
    import torch

    pointee, _ = tables.element_type(ctype)
    if pointee == "void":
        return None
    if pointee in _FLOAT_DTYPES:
        return frozenset([getattr(torch, _FLOAT_DTYPES[pointee])])
    names = ["float32", "float64", "float16", "bfloat16", "int8", "uint8", "int16", "int32", "int64", "bool"]
    names += ["uint16", "uint32", "uint64"]
    dtypes = [getattr(torch, n) for n in names if hasattr(torch, n)]
    size = tables.POINTEE_TYPES[pointee]
    if pointee in tables.SCALAR_TYPES:
        return frozenset(d for d in dtypes if not d.is_floating_point and d.itemsize == size)
    return frozenset(d for d in dtypes if size % d.itemsize == 0)


def _plan(k: Kernel) -> tuple:
    plan = _plans.get(k.name)
    if plan is None:
        steps = []
        for ctype in k.params:
            if tables.is_pointer(ctype):
                steps.append((True, _pointer_dtypes(ctype), None))
            else:
                kind, size, signed = tables.SCALAR_TYPES[" ".join(ctype.split())]
                if kind == "float":
                    steps.append((False, None, None))
                elif ctype.strip() == "bool":
                    steps.append((False, 0, 1))
                else:
                    steps.append((False, *_INT_RANGES[(size, signed)]))
        plan = _plans[k.name] = tuple(steps)
    return plan


def _fast_ok(plan: tuple, args: tuple, on_device: str) -> bool:
    import torch

    if len(args) != len(plan):
        return False
    for (pointer, a, b), v in zip(plan, args, strict=True):
        if pointer:
            if v is None:
                continue
            if not (isinstance(v, torch.Tensor) and getattr(v, on_device) and v.is_contiguous()):
                return False
            if a is not None and v.dtype not in a:
                return False
        elif a is None:
            if type(v) is not float and type(v) is not int:
                return False
        elif type(v) is not int or not a <= v <= b:
            return False
    return True


def _check_args(k: Kernel, args: tuple, device_type: str) -> list:
    if _fast_ok(_plan(k), args, "is_cpu" if device_type == "cpu" else "is_cuda"):
        return list(args)
    if len(args) != len(k.params):
        raise TypeError(f"{k.name} takes {len(k.params)} kernel arguments ({', '.join(k.params)}), got {len(args)}")
    out = []
    for i, (ctype, value) in enumerate(zip(k.params, args, strict=True)):
        if tables.is_pointer(ctype):
            out.append(_check_pointer(k, i, ctype, value, device_type))
        else:
            out.append(_check_scalar(k, i, ctype, value))
    return out


# ---------------------------------------------------------------------------------------- emulator


def kernel_dir() -> Path:
    """The directory of the kernel sources: the installed package's ``csrc``, else the source checkout's."""
    env = os.environ.get("BNB_CUDA_CSRC")
    for d in ([Path(env)] if env else []) + [_PACKAGE / "csrc", _PACKAGE.parents[1] / "csrc"]:
        if (d / "kernels").is_dir():
            return d
    raise LibraryError(
        f"the CUDA kernel sources are not found (looked for csrc/kernels in {_PACKAGE} and {_PACKAGE.parents[1]}); "
        "set BNB_CUDA_CSRC to the package's csrc directory"
    )


_emu_modules: dict[str, object] = {}
_emu_lock = threading.Lock()


def _emu_module(source: str):
    with _emu_lock:
        mod = _emu_modules.get(source)
        if mod is None:
            import bitsandbytes

            csrc = kernel_dir()
            exports = {k.name: k.expr for k in tables.by_source()[source]}
            include_dirs = [csrc, bitsandbytes.get_include()]
            mod = emulator().load_cuda(csrc / "kernels" / source, exports, include_dirs=include_dirs)
            _emu_modules[source] = mod
        return mod


def _launch_emulated(k: Kernel, grid, block, shmem: int, args: list) -> None:
    _emu_module(k.source)[k.name].launch(grid, block, *args, shared=shmem)


# ---------------------------------------------------------------------------------------- library

_LIB_NAMES = {"win32": "bnb_cuda.dll", "darwin": "libbnb_cuda.dylib"}


def library_path() -> Path:
    """Where the kernel library is: ``$BNB_CUDA_LIBRARY`` or next to this module."""
    env = os.environ.get("BNB_CUDA_LIBRARY")
    return Path(env) if env else _PACKAGE / _LIB_NAMES.get(sys.platform, "libbnb_cuda.so")


_CTYPES = {
    ("int", 1, True): ctypes.c_int8,
    ("int", 1, False): ctypes.c_uint8,
    ("int", 2, True): ctypes.c_int16,
    ("int", 2, False): ctypes.c_uint16,
    ("int", 4, True): ctypes.c_int32,
    ("int", 4, False): ctypes.c_uint32,
    ("int", 8, True): ctypes.c_int64,
    ("int", 8, False): ctypes.c_uint64,
    ("float", 4, True): ctypes.c_float,
    ("float", 8, True): ctypes.c_double,
}


def argtypes(k: Kernel) -> list:
    """The ctypes argument types of ``bnb_cuda_<name>``: grid xyz, block xyz, shmem, stream, then the params."""
    head = [ctypes.c_uint] * 7 + [ctypes.c_void_p]
    body = []
    for p in k.params:
        if tables.is_pointer(p):
            body.append(ctypes.c_void_p)
        elif " ".join(p.split()) == "bool":
            body.append(ctypes.c_bool)
        else:
            body.append(_CTYPES[tables.SCALAR_TYPES[" ".join(p.split())]])
    return head + body


_lib = None
_lib_lock = threading.Lock()
_fns: dict[str, object] = {}
_checked_devices: set[int] = set()
_INSUFFICIENT_DRIVER = 35  # cudaErrorInsufficientDriver


def library():
    """The loaded kernel library (``ctypes.CDLL``), its helper functions typed; LibraryError if unusable."""
    global _lib
    if _lib is not None:
        return _lib
    with _lib_lock:
        if _lib is None:
            path = library_path()
            if not path.is_file():
                raise LibraryError(f"the CUDA kernel library {path} does not exist (is bitsandbytes-cuda built?)")
            try:
                lib = ctypes.CDLL(str(path))
            except OSError as e:
                raise LibraryError(f"the CUDA kernel library {path} cannot be loaded: {e}") from None
            for fn, res, args in (
                ("bnb_cuda_error_string", ctypes.c_char_p, [ctypes.c_int]),
                ("bnb_cuda_runtime_version", ctypes.c_int, []),
                ("bnb_cuda_driver_version", ctypes.c_int, []),
                ("bnb_cuda_archs", ctypes.c_char_p, []),
                ("bnb_cuda_check_device", ctypes.c_int, []),
            ):
                f = getattr(lib, fn)
                f.restype, f.argtypes = res, args
            _lib = lib
    return _lib


def error_string(code: int) -> str:
    return library().bnb_cuda_error_string(code).decode(errors="replace")


def _function(k: Kernel):
    fn = _fns.get(k.name)
    if fn is None:
        try:
            fn = getattr(library(), k.symbol)
        except AttributeError:
            raise LibraryError(
                f"the CUDA kernel library {library_path()} has no {k.symbol}: it was built from other kernel "
                "tables than this Python package's; rebuild bitsandbytes-cuda"
            ) from None
        fn.restype, fn.argtypes = ctypes.c_int, argtypes(k)
        _fns[k.name] = fn
    return fn


def check_device(index: int) -> None:
    """Raise LibraryError if the library has no kernel image (SASS or PTX) usable on the current device."""
    if index in _checked_devices:
        return
    rc = library().bnb_cuda_check_device()
    if rc == _INSUFFICIENT_DRIVER:
        from .plugin import check_driver

        check_driver()  # raises, naming both versions
    if rc:
        import torch

        major, minor = torch.cuda.get_device_capability(index)
        name = torch.cuda.get_device_name(index)
        archs = library().bnb_cuda_archs().decode()
        raise LibraryError(
            f"CUDA device {index} ({name}, sm_{major}{minor}) cannot run the bitsandbytes-cuda kernels: "
            f"{error_string(rc)}. The library holds code for {archs}; build it for this device with "
            f"BNB_CUDA_ARCHS={major}{minor}."
        )
    _checked_devices.add(index)


_stream_of = None  # device index -> raw handle of its current stream; chosen at the first launch


def _current_stream_getter():
    """torch's cheapest current-stream query: ``torch._C._cuda_getCurrentRawStream(index)`` (an int, no
    ``Stream`` object; what torch's own generated code calls), else the public API."""
    import torch

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw
    return lambda index: torch.cuda.current_stream(index).cuda_stream


def _launch_real(k: Kernel, grid, block, shmem: int, args: list) -> None:
    global _stream_of
    import torch

    device = None
    raw = list(args)
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            d = a.get_device()  # an int: cheaper than a.device, which builds a torch.device
            if device is None:
                device = d
            elif d != device:
                raise ValueError(f"{k.name}: argument {i} is on {a.device}, the first tensor argument on cuda:{device}")
            raw[i] = a.data_ptr()
    fn = _fns.get(k.name) or _function(k)
    if _stream_of is None:
        _stream_of = _current_stream_getter()
    stream_of = _stream_of
    current = torch.cuda.current_device()
    index = current if device is None else device
    if index == current:
        if index not in _checked_devices:
            check_device(index)
        rc = fn(*grid, *block, shmem, stream_of(index), *raw)
    else:
        with torch.cuda.device(index):
            check_device(index)
            rc = fn(*grid, *block, shmem, stream_of(index), *raw)
    if rc:
        raise RuntimeError(f"CUDA kernel {k.name} (grid {grid}, block {block}, shmem {shmem}): {error_string(rc)}")


# ---------------------------------------------------------------------------------------- launch


def launch(name: str, grid, block, shmem: int, *args) -> None:
    """Run table kernel ``name`` as ``expr<<<grid, block, shmem, stream>>>(*args)``.

    ``grid``/``block`` are an int or a tuple of 1-3 ints; tensors pass as pointers (contiguous, on one
    device, the dtype the parameter type needs; None is a null pointer), numbers are converted to the
    parameter's C type with a range check. On a GPU the stream is the current stream of the tensors'
    device and nothing synchronizes; in emulation (``use_emulator()``) tensors are on the CPU.
    """
    k = tables.get(name)
    g, b, s = _geometry(grid, block, shmem)
    if _emulate:
        _launch_emulated(k, g, b, s, _check_args(k, args, "cpu"))
    else:
        _launch_real(k, g, b, s, _check_args(k, args, "cuda"))
