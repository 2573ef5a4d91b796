"""Python glue of the CPU kernels: one module per kernel family, each with an ``OPS`` dict.

``OPS`` maps an op name of the ``bitsandbytes`` library (or an overload such as ``"gemv_4bit.out"``) to
its kernel. Every kernel validates its arguments with the core's contract (``bitsandbytes._ops.check_*``,
the same errors as the reference), makes inputs contiguous, allocates outputs with torch and then
calls into ``bitsandbytes_cpu._C``, which re-checks sizes and releases the GIL while it runs. What is
registered is read back from the dispatcher (``bitsandbytes.backends.dispatch``), not kept here.
"""

from __future__ import annotations

from collections.abc import Callable

from bitsandbytes.backends import kit

__all__ = ["all_ops", "register_all"]


def all_ops() -> dict[str, Callable]:
    """Every family module's ``OPS``, merged; a name in two modules is an error."""
    return kit.collect(__name__)


def register_all() -> dict[str, Callable]:
    """Register every op for ``cpu``; idempotent. Returns what this call registered."""
    return kit.register(all_ops(), "cpu")
