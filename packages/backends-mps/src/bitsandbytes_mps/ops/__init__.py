"""The op implementations for device ``mps``: one module per kernel family, each with ``OPS`` and ``SOURCES``.

``OPS`` maps an op name of the ``bitsandbytes`` library (``"int8_vectorwise_quant"``, or an overload such
as ``"int8_linear_matmul.out"``) to its function; ``SOURCES`` names the Metal sources its kernels come
from. A module's ops are registered only when all its sources loaded (``library.status()``); otherwise
the core's reference kernels keep serving them. The functions validate with the core's ``_ops.check_*``,
allocate outputs on the input's device, compute the launch sizes and call ``library.dispatch``; they never
look at the device type, so the emulated test plugin registers the very same functions for ``cpu``.

What is registered is each function behind ``falling_back``: a kernel that turns out unusable in the
middle of a call (``library.KernelUnavailable``: dropped after its dispatch raised) sends that call to
the core's reference kernel. This is sound because every op writes its in-place arguments (optimizer
state, ``out=``) only in its last kernel or in kernels whose writes the reference repeats identically
from the same inputs, so a failed call leaves nothing half-updated.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType

from bitsandbytes.backends import kit

__all__ = ["all_ops", "falling_back", "modules", "native_ops", "register_all"]


def modules() -> list[ModuleType]:
    """The family modules, by name."""
    return kit.family_modules(__name__)


def all_ops() -> dict[str, Callable]:
    """Every family module's ``OPS``, merged; a name in two modules is an error."""
    return kit.collect(__name__)


def native_ops() -> dict[str, Callable]:
    """The ops whose module's Metal sources all loaded (loading them if needed)."""
    from .. import library

    loaded = set(library.load().native_sources)
    ops: dict[str, Callable] = {}
    for module in modules():
        if set(getattr(module, "SOURCES", ())) <= loaded:
            ops.update(getattr(module, "OPS", {}))
    return ops


def falling_back(op: str, fn: Callable) -> Callable:
    """``fn`` for op ``op``, rerunning a call on the reference kernel when a Metal kernel fails under it."""
    from bitsandbytes._reference import REFERENCE

    from .. import library

    reference = REFERENCE[op]

    @functools.wraps(fn)
    def run(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except library.KernelUnavailable:
            return reference(*args, **kwargs)

    return run


def register_all(device_type: str = "mps") -> dict[str, Callable]:
    """Register the native ops for ``device_type`` (``"cpu"`` only for emulation), each behind
    ``falling_back`` (``kit.register``: idempotent, and what is registered reads back from the
    dispatcher). Returns the native functions."""
    ops = native_ops()
    kit.register({op: falling_back(op, fn) for op, fn in ops.items()}, device_type)
    return ops
