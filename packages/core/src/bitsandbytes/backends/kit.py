"""Helpers for backend authors: the parts every backend package would otherwise write for itself.

* :func:`register` binds a mapping ``{op: kernel}`` to a device type (the one registration idiom);
* :func:`collect` merges the ``OPS`` (or any other) dict of every family module of a package;
* :func:`out_pair` derives an op and its ``.out`` overload from one kernel that writes into ``out``;
* :func:`dtype_suffix` names a kernel's instantiation for a float dtype (``"f32"``, ``"f16"``, ``"bf16"``);
* :func:`emulated_plugin` builds the pytest plugin that runs a backend's kernels in an emulator on ``cpu``.

What is registered is never recorded here: ``bitsandbytes.backends.dispatch.snapshot()`` reads it back
from the dispatcher. Added in plugin API 1.2; a plugin using it declares ``api_version="1.2"``.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch

from .._ops import _INPUT_NAMES, LIB, OUTPUTS, check_out
from .dispatch import dispatch_key, has_kernel

__all__ = [
    "SUFFIX",
    "EmulatedPlugin",
    "collect",
    "dtype_suffix",
    "emulated_plugin",
    "family_modules",
    "out_pair",
    "register",
    "routed",
]

# (qualified op, device type) registered by register() in this process: its only state, for idempotence.
_DONE: set[tuple[str, str]] = set()


def _reference(op: str) -> Callable:
    from .._reference import REFERENCE

    return REFERENCE[op]


def routed(op: str, fn: Callable, unusable: Collection[torch.device]) -> Callable:
    """``fn``, except that a call whose tensors are on a device in ``unusable`` runs the core's reference
    kernel of ``op``. An op's tensors share one device, so its first tensor argument decides."""
    reference = _reference(op)
    unusable = frozenset(torch.device(d) for d in unusable)

    @functools.wraps(fn)
    def run(*args, **kwargs):
        for a in (*args, *kwargs.values()):
            if isinstance(a, torch.Tensor):
                if a.device in unusable:
                    return reference(*args, **kwargs)
                break
        return fn(*args, **kwargs)

    return run


def register(
    ops: Mapping[str, Callable], device_type: str, *, unusable: Collection[torch.device] = ()
) -> dict[str, Callable]:
    """Register each ``ops[op]`` as the ``device_type`` kernel of ``bitsandbytes::<op>``; ``op`` may carry an
    overload (``"gemv_4bit.out"``). Idempotent per process: an (op, device type) already registered here
    is left as it is. ``unusable``: devices of that type the backend cannot serve (a GPU too old for
    its kernels); calls there run the reference kernel (:func:`routed`).

    Returns ``{op: kernel}`` of what this call registered ({} when everything already was)."""
    done: dict[str, Callable] = {}
    for op, fn in ops.items():
        key = (f"{LIB}::{op}", device_type)
        # Also asks the dispatcher: a rejected plugin's registrations are undone by the core.
        if key in _DONE and has_kernel(op, dispatch_key(device_type)):
            continue
        kernel = routed(op, fn, unusable) if unusable else fn
        torch.library.register_kernel(key[0], device_type)(kernel)
        _DONE.add(key)
        done[op] = kernel
    return done


def family_modules(package: ModuleType | str) -> list[ModuleType]:
    """The submodules of ``package`` whose names do not start with ``_``, imported, by name."""
    if isinstance(package, str):
        package = importlib.import_module(package)
    names = sorted(info.name for info in pkgutil.iter_modules(package.__path__))
    return [importlib.import_module(f"{package.__name__}.{n}") for n in names if not n.startswith("_")]


def collect(
    package: ModuleType | str,
    attr: str = "OPS",
    *,
    key: Callable[[Any], str] | None = None,
    item_type: type | None = None,
) -> dict[str, Any]:
    """Every family module's ``attr``, merged into one dict; a name in two modules is a ``ValueError``
    naming both. ``attr`` is a dict ``{name: item}``; with ``key`` it is a list of items, each named by
    ``key(item)``, and required in every family module. ``item_type``: each item must be one."""
    found: dict[str, Any] = {}
    owner: dict[str, str] = {}
    for module in family_modules(package):
        where = f"{module.__name__}.{attr}"
        value = getattr(module, attr, None)
        if key is None:
            if value is None:
                continue
            if not isinstance(value, Mapping):
                raise TypeError(f"{where} must be a dict, got {type(value).__name__}")
            items = value.items()
        else:
            if not isinstance(value, (list, tuple)):
                raise TypeError(f"{where} must be a list, got {type(value).__name__}")
            items = ((key(v), v) for v in value)
        for name, item in items:
            if item_type is not None and not isinstance(item, item_type):
                raise TypeError(f"{where} holds {item!r}, not a {item_type.__name__}")
            if name in found:
                raise ValueError(f"{name!r} is in two modules: {owner[name]} and {module.__name__}")
            found[name] = item
            owner[name] = module.__name__
    return found


# torch dtype -> the suffix of a kernel instantiated for it (the CUDA and Metal tables' names)
SUFFIX = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}


def dtype_suffix(dtype: torch.dtype, kernels: str = "native") -> str:
    """``SUFFIX[dtype]``; a ``TypeError`` naming ``kernels`` (``"CUDA"``, ``"Metal"``) for any other dtype."""
    try:
        return SUFFIX[dtype]
    except KeyError:
        raise TypeError(
            f"no {kernels} kernel for dtype {dtype}; expected one of {', '.join(map(str, SUFFIX))}"
        ) from None


def _empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device=device)


def out_pair(
    op: str,
    into: Callable[..., None],
    *,
    empty: Callable[[tuple[int, ...], torch.dtype, torch.device], torch.Tensor] = _empty,
    native: Callable[..., bool] | None = None,
) -> dict[str, Callable]:
    """``{op: functional, op + ".out": overload}`` for an op with an ``.out`` overload, from one kernel
    ``into(*args, out)`` that writes the result of ``op(*args)`` into ``out``.

    Both run the op's check first (``bitsandbytes._ops.check_out`` for ``.out``: shape, dtype, device,
    contiguity and overlap of ``out`` as on every device). The functional op then allocates its result
    with ``empty(shape, dtype, device)`` (default ``torch.empty``). ``native(*args)``, when given and
    false for a call, sends that call (after the check) to the core's reference kernels instead.
    """
    if op not in OUTPUTS:
        raise KeyError(f"{op!r} has no .out overload; ops with one: {', '.join(OUTPUTS)}")
    output = OUTPUTS[op]
    names = _INPUT_NAMES[op]
    reference, reference_out = (None, None) if native is None else (_reference(op), _reference(f"{op}.out"))

    def positional(args: tuple, kwargs: dict) -> tuple:
        return (*args, *(kwargs[n] for n in names[len(args) :] if n in kwargs)) if kwargs else args

    def functional(*args, **kwargs) -> torch.Tensor:
        args = positional(args, kwargs)
        shape, dtype = output(*args)
        if native is not None and not native(*args):
            return reference(*args)
        out = empty(shape, dtype, args[0].device)
        into(*args, out)
        return out

    def overload(*args, **kwargs) -> None:
        if "out" in kwargs:
            out = kwargs.pop("out")
        else:
            *args, out = args  # out comes last in every .out schema
        args = positional(tuple(args), kwargs)
        check_out(op, args, out)
        if native is not None and not native(*args):
            return reference_out(*args, out)
        into(*args, out)
        return None

    functional.__name__ = functional.__qualname__ = op
    overload.__name__ = overload.__qualname__ = f"{op}_out"
    return {op: functional, f"{op}.out": overload}


@dataclass
class EmulatedPlugin:
    """A pytest plugin's hooks; a module exposes them as its own (``pytest -p <module>`` finds them)."""

    pytest_configure: Callable[[Any], None]
    pytest_report_header: Callable[[Any], str]
    registered: list[str] = field(default_factory=list)  # the op names registered, once configured


def emulated_plugin(
    module: str, device: str, kernels: str, *, unavailable_reason: Callable[[], str | None], enable: Callable
) -> EmulatedPlugin:
    """The pytest plugin that makes device ``cpu`` run a backend's kernels in an emulator::

        _plugin = kit.emulated_plugin(__name__, "cuda", "CUDA", unavailable_reason=..., enable=...)
        pytest_configure, pytest_report_header = _plugin.pytest_configure, _plugin.pytest_report_header

    At configure time ``unavailable_reason()`` (a string when the emulator cannot run here) makes the
    run fail naming ``module``; otherwise ``enable()`` switches the backend to the emulator, registers
    its ops for ``cpu`` and returns their names (an iterable), shown in the report header.
    """
    plugin: EmulatedPlugin

    def pytest_configure(config) -> None:
        reason = unavailable_reason()
        if reason:
            raise RuntimeError(f"{module} needs the kernel emulator: {reason}")
        names: Iterable[str] = enable()
        plugin.registered[:] = sorted(names)

    def pytest_report_header(config) -> str:
        ops = plugin.registered
        return f"emulated {device}: {len(ops)} ops on emulated {kernels} kernels ({', '.join(ops)})"

    plugin = EmulatedPlugin(pytest_configure, pytest_report_header)
    return plugin
