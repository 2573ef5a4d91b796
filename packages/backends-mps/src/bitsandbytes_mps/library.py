"""The Metal kernels of this package, loaded once per process, and ``dispatch`` to run one of them.

Load order, each step recording why it was passed over (``status()``, shown by ``python -m bitsandbytes``):

1. ``bitsandbytes.metallib`` next to this file (built by the wheel's CMake on macOS) through
   ``torch.mps.load_metallib``, when both exist, its manifest (``bitsandbytes.metallib.json``) says it was
   built from exactly the sources installed beside it, and it holds every kernel of the tables;
2. else each ``metal/<source>`` (as ``_assemble.assemble`` gives it) through ``torch.mps.compile_shader``,
   source by source, so one family that fails to compile leaves the others native;
3. else nothing: that source's ops are not registered and the core's reference kernels serve them.

Each loaded kernel is then held against its pipeline: a pipeline that allows fewer threads per threadgroup
than the host launches the kernel with (``Kernel.max_threads``), or whose SIMD width is not the 32 the
kernels assume, drops that kernel, and its op runs on the reference. A kernel whose dispatch raises is
dropped the same way, and the op that called it reruns on the reference (``ops.register_all`` wraps every
op for this), so a Metal failure never surfaces in the middle of a forward pass or an optimizer step. In
emulation such a failure is a kernel bug and is raised instead.

In emulation (``use_emulator``; the tests) step 2 uses ``bitsandbytes_emu.metal_library`` on the
same assembled text, and tensors are CPU tensors. Kernels run on PyTorch's current MPS stream: nothing
here synchronizes.
"""

from __future__ import annotations

import importlib
import json
import os
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import _assemble, tables
from .tables import FLOAT_ELEMENTS, SCALAR_TYPES, SIMD_WIDTH, Kernel

__all__ = [
    "METALLIB",
    "KernelFailed",
    "KernelUnavailable",
    "Status",
    "dispatch",
    "emulating",
    "emulator",
    "has",
    "load",
    "reset",
    "status",
    "use_emulator",
]

METALLIB = Path(__file__).parent / "bitsandbytes.metallib"


class KernelUnavailable(RuntimeError):
    """A kernel of the tables is not in the loaded library (its source failed, or bfloat is missing)."""


class KernelFailed(KernelUnavailable):
    """A kernel's dispatch raised; it is dropped (``Status.dropped``) and its op reruns on the reference."""


@dataclass
class Status:
    """How the kernels were loaded. ``sources`` maps each Metal source to the path that serves it
    (``"metallib"``, ``"source"``, ``"emulated"`` or ``"reference"``); ``reasons`` says why a path was
    passed over (key ``"metallib"`` or a source name); ``missing`` lists table kernels absent from a
    loaded library (bfloat kernels where MSL < 3.1); ``dropped`` maps each kernel that was loaded but
    taken out of service (its pipeline cannot run its launch size, or a dispatch raised) to the reason."""

    path: str = "not loaded"
    sources: dict[str, str] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    dropped: dict[str, str] = field(default_factory=dict)

    @property
    def native_sources(self) -> list[str]:
        return [s for s, how in self.sources.items() if how != "reference"]

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "sources": dict(self.sources), "reasons": dict(self.reasons),
                "missing": list(self.missing), "dropped": dict(self.dropped)}  # fmt: skip


_lock = threading.Lock()
_emulate = False
_status: Status | None = None
_kernels: dict[str, Any] = {}  # kernel name -> callable kernel of a loaded library


def emulator():
    """``bitsandbytes_emu``, the kernel emulator: this package's test extra, so a ModuleNotFoundError naming it
    where it is not installed (an error of something it imports is raised as it is: that is the news)."""
    try:
        return importlib.import_module("bitsandbytes_emu")
    except ModuleNotFoundError as e:
        if e.name != "bitsandbytes_emu":
            raise
        missing = e
    raise ModuleNotFoundError(
        "the Metal kernels run in emulation only with the kernel emulator installed: "
        "pip install 'bitsandbytes-mps[test]' (or bitsandbytes-emu, the same version)",
        name="bitsandbytes_emu",
    ) from missing


def use_emulator(enabled: bool = True) -> bool:
    """Load (and dispatch to) emulated kernels on CPU tensors instead of MPS; returns the old setting.
    Switching forgets what was loaded. Turning it on needs the kernel emulator (see ``emulator``)."""
    global _emulate
    if enabled:
        emulator()
    with _lock:
        old, _emulate = _emulate, bool(enabled)
        if old != _emulate:
            _forget()
    return old


def emulating() -> bool:
    return _emulate


def _forget() -> None:
    global _status
    _status = None
    _kernels.clear()


def reset() -> None:
    """Forget the loaded libraries, so that the next ``load()`` starts over (tests)."""
    with _lock:
        _forget()


def _describe(e: BaseException) -> str:
    text = " ".join(str(e).split())
    if len(text) > 400:
        text = text[:400] + " ..."
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _lookup(library: Any, name: str) -> Any | None:
    try:
        return getattr(library, name)
    except (AttributeError, RuntimeError, KeyError):
        return None


def _manifest_mismatch(wanted: dict[str, list[Kernel]]) -> str | None:
    """Why the metallib's manifest does not vouch for the installed sources, or None when it does."""
    path = METALLIB.with_name(_assemble.MANIFEST_NAME)
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        return f"{METALLIB.name} has no {path.name} beside it (another build made it): its signatures are unknown"
    except (OSError, ValueError) as e:
        return f"{path.name} cannot be read: {_describe(e)}"
    recorded = manifest.get("sources") if isinstance(manifest, dict) else None
    if not isinstance(recorded, dict) or manifest.get("format") != _assemble.MANIFEST_FORMAT:
        return f"{path.name} is not a format-{_assemble.MANIFEST_FORMAT} manifest"
    stale = []
    for source in wanted:
        try:
            if recorded.get(source) != _assemble.digest(source):
                stale.append(source)
        except (OSError, UnicodeError) as e:
            return f"the installed {source} cannot be read: {_describe(e)}"
    if stale:
        return f"{METALLIB.name} was built from other sources than those installed ({', '.join(stale)} differ)"
    return None


def _try_metallib(status: Status, wanted: dict[str, list[Kernel]]) -> bool:
    import torch

    loader = getattr(torch.mps, "load_metallib", None)
    if not METALLIB.is_file():
        status.reasons["metallib"] = f"no prebuilt {METALLIB.name} in the package (a source install)"
        return False
    stale = _manifest_mismatch(wanted)
    if stale:
        status.reasons["metallib"] = stale
        return False
    if loader is None:
        status.reasons["metallib"] = f"torch {torch.__version__} has no torch.mps.load_metallib"
        return False
    try:
        library = loader(str(METALLIB))
    except Exception as e:  # any failure means: try the source
        status.reasons["metallib"] = f"torch.mps.load_metallib failed: {_describe(e)}"
        return False
    found = {k.name: _lookup(library, k.name) for ks in wanted.values() for k in ks}
    absent = sorted(n for n, fn in found.items() if fn is None)
    if absent:
        # A stale or foreign metallib: the source is the truth.
        some = ", ".join(absent[:5])
        status.reasons["metallib"] = f"{METALLIB.name} lacks {len(absent)} kernels of the tables ({some})"
        return False
    for source, kernels in wanted.items():
        status.sources[source] = "metallib"
        for k in kernels:
            _admit(status, k, found[k.name])
    return True


def _admit(status: Status, k: Kernel, fn: Any) -> None:
    """Put a loaded kernel in service unless its pipeline cannot run it as the host launches it."""
    try:
        limit = int(fn.max_threads_per_threadgroup)
        width = int(fn.thread_execution_width)
    except AttributeError:  # a torch without pipeline properties: dispatch-time failures still fall back
        _kernels[k.name] = fn
        return
    except Exception as e:
        status.dropped[k.name] = f"its pipeline's properties cannot be read: {_describe(e)}"
        return
    if limit < k.max_threads:
        status.dropped[k.name] = (
            f"its pipeline allows {limit} threads per threadgroup, and the host launches it with up to {k.max_threads}"
        )
    elif width != SIMD_WIDTH:
        status.dropped[k.name] = f"its pipeline's SIMD width is {width}; the kernels assume {SIMD_WIDTH}"
    else:
        _kernels[k.name] = fn


def _compile_sources(status: Status, wanted: dict[str, list[Kernel]]) -> None:
    if _emulate:
        emu = emulator()

        def compile_one(source: str) -> Any:
            return emu.metal_library(_assemble.assemble(source, emulated=True), filename=source)

        how = "emulated"
    else:
        import torch

        compiler = getattr(torch.mps, "compile_shader", None)
        if compiler is None:
            for source in wanted:
                status.sources[source] = "reference"
                status.reasons[source] = f"torch {torch.__version__} has no torch.mps.compile_shader (needs >= 2.7)"
            return

        def compile_one(source: str) -> Any:
            return compiler(_assemble.assemble(source))

        how = "source"
    for source, kernels in wanted.items():
        try:
            library = compile_one(source)
        except Exception as e:  # a family that does not compile runs on the reference
            status.sources[source] = "reference"
            status.reasons[source] = f"compiling {source} failed: {_describe(e)}"
            continue
        status.sources[source] = how
        for k in kernels:
            fn = _lookup(library, k.name)
            if fn is None:
                status.missing.append(k.name)
            else:
                _admit(status, k, fn)


def load() -> Status:
    """Load every kernel source once per process (thread-safe); later calls return the same ``Status``."""
    global _status
    if _status is not None:
        return _status
    with _lock:
        if _status is not None:
            return _status
        status = Status()
        wanted = tables.by_source()
        if _emulate or not _try_metallib(status, wanted):
            _compile_sources(status, wanted)
        native = status.native_sources
        if not wanted:
            status.path = "reference (the tables name no kernels)"
        elif not native:
            status.path = "reference"
        elif len(native) < len(wanted):
            status.path = f"{status.sources[native[0]]} (partly reference)"
        else:
            status.path = status.sources[native[0]]
        _status = status
        return status


def status() -> Status:
    """What ``load()`` did (loading now if nothing was loaded yet)."""
    return load()


def _drop(name: str, reason: str) -> None:
    """Take a loaded kernel out of service for the rest of the process, once, saying so."""
    with _lock:
        if _kernels.pop(name, None) is None or _status is None:
            return
        _status.dropped[name] = reason
    warnings.warn(
        f"bitsandbytes-mps: the Metal kernel {name} failed and is dropped ({reason}); its op runs on the "
        "reference kernels from now on. `python -m bitsandbytes` shows this; please report it.",
        RuntimeWarning,
        stacklevel=4,
    )


def fast_math() -> str | None:
    """``$PYTORCH_MPS_FAST_MATH`` when set to something other than 0: torch then compiles the sources with
    fast math, under which Metal may assume no NaN or Inf (the kernels test NaN/Inf on bits for this)."""
    value = os.environ.get("PYTORCH_MPS_FAST_MATH")
    return value if value not in (None, "", "0") else None


def has(name: str) -> bool:
    """Whether kernel ``name`` of the tables is loaded (after ``load()``); ``KeyError`` for unknown names."""
    tables.get(name)
    load()
    return name in _kernels


# ------------------------------------------------------------------------------------------ dispatch


def _dims(value: Any, what: str, name: str) -> tuple[int, ...]:
    dims = (value,) if isinstance(value, int) and not isinstance(value, bool) else value
    if (
        not isinstance(dims, (tuple, list))
        or not 1 <= len(dims) <= 3
        or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in dims)
    ):
        raise ValueError(f"kernel {name}: {what} must be a positive int or 1-3 positive ints, got {value!r}")
    return tuple(dims)


def _check_args(k: Kernel, args: tuple) -> tuple[list, dict[int, str]]:
    """Check ``args`` against the table entry; returns the arguments to bind (ints given for float scalars
    become floats: torch would bind them as int64) and torch's ``arg_casts`` for narrow scalars."""
    import torch

    if len(args) != len(k.params):
        raise TypeError(f"kernel {k.name} takes {len(k.params)} arguments ({k.signature()}), got {len(args)}")
    casts: dict[int, str] = {}
    bound = list(args)
    device = None
    for i, (p, a) in enumerate(zip(k.params, args, strict=True)):
        if p.is_buffer and isinstance(a, (list, tuple)) and p.type in ("constant float*", "constant long*"):
            # torch binds a list of Python floats / ints as a float32 / int64 array (one constant buffer).
            kind = "float" if p.element == "float" else "int"
            if not a or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in a):
                raise TypeError(f"kernel {k.name}: argument {i} ({p}) must be a non-empty list of numbers, got {a!r}")
            if kind == "int" and any(isinstance(v, float) for v in a):
                raise TypeError(f"kernel {k.name}: argument {i} ({p}) must be a list of Python ints, got {a!r}")
            bound[i] = [float(v) for v in a] if kind == "float" else list(a)
        elif p.is_buffer:
            if not isinstance(a, torch.Tensor):
                raise TypeError(f"kernel {k.name}: argument {i} ({p}) must be a tensor, got {type(a).__name__}")
            size = tables.ELEMENT_TYPES[p.element]
            if p.element in FLOAT_ELEMENTS:
                ok = a.dtype == {"float": torch.float32, "half": torch.float16, "bfloat": torch.bfloat16}[p.element]
            else:
                ok = size % a.element_size() == 0
            if not ok:
                raise TypeError(f"kernel {k.name}: argument {i} ({p}) cannot take a {a.dtype} tensor")
            if not a.is_contiguous():
                raise ValueError(f"kernel {k.name}: argument {i} ({p.name}) must be contiguous")
            if a.numel() == 0:
                raise ValueError(f"kernel {k.name}: argument {i} ({p.name}) is empty; Metal cannot bind it")
            if device is None:
                device = a.device
            elif a.device != device:
                raise ValueError(f"kernel {k.name}: argument {i} ({p.name}) is on {a.device}, others on {device}")
        else:
            kind, _, cast = SCALAR_TYPES[p.element]
            if isinstance(a, bool) or not isinstance(a, (int, float)) or (kind == "int" and isinstance(a, float)):
                raise TypeError(f"kernel {k.name}: argument {i} ({p}) must be a Python {kind}, got {a!r}")
            if kind == "float":
                bound[i] = float(a)
            elif not _INT_RANGE[p.element][0] <= a <= _INT_RANGE[p.element][1]:
                raise ValueError(f"kernel {k.name}: argument {i} ({p}) is out of range: {a}")
            if cast is not None:
                casts[i] = cast
    return bound, casts


# Python ints bound to integer scalars: the range of the Metal type (bool as 0/1).
_INT_RANGE = {
    name: ((0, 1) if name == "bool" else (-(2 ** (8 * size - 1)), 2 ** (8 * size - 1) - 1))
    if name in ("long", "int", "short", "char", "bool")
    else (0, 2 ** (8 * size) - 1)
    for name, (kind, size, _) in SCALAR_TYPES.items()
    if kind == "int"
}


def dispatch(name: str, *args: Any, threads: int | tuple[int, ...], group_size: int | tuple[int, ...]) -> None:
    """Run kernel ``name`` of the tables with ``args`` (tensors, Python ints and floats, in the table's
    order) over ``threads`` threads in threadgroups of ``group_size`` (Metal's non-uniform dispatch: the
    last threadgroup of a dimension may be short). Checks the arguments against the table first; queues
    the kernel on the current MPS stream and returns without waiting.

    Raises ``KernelUnavailable`` when the kernel is not loaded (callers check ``has`` and use the
    reference), ``KernelFailed`` (one of those) when torch's call raised, after dropping the kernel, and
    ``TypeError`` / ``ValueError`` naming the argument for a call that does not fit the table (a bug of
    the calling op, which the emulated tests catch).
    """
    k = tables.get(name)
    fn = _kernels.get(name)
    if fn is None:
        st = load()
        fn = _kernels.get(name)
        if fn is None:
            why = st.reasons.get(k.source) or ("absent from the loaded library" if name in st.missing else st.path)
            raise KernelUnavailable(f"kernel {name} of {k.source} is not loaded: {why}")
    t = _dims(threads, "threads", name)
    g = _dims(group_size, "group_size", name)
    if len(t) != len(g):
        raise ValueError(f"kernel {name}: threads {t} and group_size {g} must have the same number of dimensions")
    total = 1
    for d in g:
        total *= d
    if total > k.max_threads:
        raise ValueError(
            f"kernel {name}: group_size {g} has {total} threads; it is declared for at most {k.max_threads}"
        )
    bound, casts = _check_args(k, args)
    threads_arg = t[0] if len(t) == 1 else list(t)
    group_arg = g[0] if len(g) == 1 else list(g)
    extra = {"arg_casts": casts} if casts else {}
    try:
        fn(*bound, threads=threads_arg, group_size=group_arg, **extra)
    except Exception as e:
        if _emulate:  # the emulator found a kernel bug (a bad access, a race): the tests must see it
            raise
        reason = f"dispatching it raised {_describe(e)}"
        _drop(name, reason)
        raise KernelFailed(f"kernel {name} of {k.source}: {reason}") from e
