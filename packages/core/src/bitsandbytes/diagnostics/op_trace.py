"""Which ``bitsandbytes::`` ops ran, on which device, and whether a backend's native kernel or the
reference kernel served them.

``trace_ops()`` is a context manager around any code (a forward pass, a training step, ``generate``)::

    with trace_ops() as trace:
        model(inputs)
    print(trace.format())

It watches the torch dispatcher through a ``TorchDispatchMode``, so it sees every op call that reaches
the dispatcher from nn, functional, optim or a client library, whatever the call path. Only the
outermost bitsandbytes op of a call is counted (a kernel that calls another op runs below the mode).
Who served the call is read from the dispatcher (``backends.dispatch``), the same source as
``python -m bitsandbytes``'s coverage matrix.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from .._ops import LIB
from ..backends import dispatch


@dataclass(frozen=True)
class OpCall:
    """One row of a trace: an op (``"gemv_4bit"``, ``"dequantize_blockwise.out"``) on a device type."""

    op: str
    device: str
    calls: int
    kernel: str  # see kernel_kind()


def _op_name(func) -> str:
    overload = func._overloadname
    return func._opname if overload == "default" else f"{func._opname}.{overload}"


def _device_type(args, kwargs) -> str:
    # The dispatcher picks the kernel from the tensors' devices; the first tensor argument decides here.
    for leaf in tree_leaves((args, kwargs)):
        if isinstance(leaf, torch.Tensor):
            return leaf.device.type
    return "cpu"


# Meta tensors (shape propagation, models built on the meta device) run the op's fake kernel.
FAKE = "fake"


def kernel_kind(op: str, device_type: str) -> str:
    """Who runs ``op`` on ``device_type``: "native", "reference", "fake" (meta) or "missing"."""
    if device_type == "meta":
        return FAKE
    try:
        native = dispatch.has_kernel(op, dispatch.dispatch_key(device_type))
    except RuntimeError:  # a device type without a dispatch key of its own
        native = False
    if native:
        return dispatch.NATIVE
    return dispatch.REFERENCE if dispatch.has_kernel(op, dispatch.DEFAULT_KEY) else dispatch.MISSING


@dataclass
class OpTrace:
    """Counts of ``(op, device type)`` calls seen while the trace was active."""

    counts: Counter = field(default_factory=Counter)

    def rows(self) -> list[OpCall]:
        """One row per (op, device), ordered by op name then device."""
        return [OpCall(op, dev, n, kernel_kind(op, dev)) for (op, dev), n in sorted(self.counts.items())]

    def ops(self) -> set[str]:
        return {op for op, _ in self.counts}

    def format(self, indent: str = "  ") -> str:
        """An aligned table: op, device, calls, native/reference."""
        from .report import table

        rows = [(r.op, r.device, str(r.calls), r.kernel) for r in self.rows()]
        if not rows:
            return indent + "(no bitsandbytes op ran)"
        return "\n".join(table(("op", "device", "calls", "kernel"), rows, indent=indent))


class _Mode(TorchDispatchMode):
    def __init__(self, trace: OpTrace):
        super().__init__()
        self.trace = trace

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace == LIB:
            self.trace.counts[(_op_name(func), _device_type(args, kwargs))] += 1
        return func(*args, **kwargs)


@contextmanager
def trace_ops() -> Iterator[OpTrace]:
    """Record every ``bitsandbytes::`` op call made inside the block; yields the :class:`OpTrace`.

    Traces may nest: each records the calls made while it is active. Costs a Python call per torch op
    while active, so trace a representative step rather than a whole long run.
    """
    trace = OpTrace()
    with _Mode(trace):
        yield trace
