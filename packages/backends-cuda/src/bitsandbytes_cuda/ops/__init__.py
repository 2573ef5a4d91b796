"""The op implementations for device ``cuda``: one module per kernel family, each with an ``OPS`` dict.

``OPS`` maps an op name of the ``bitsandbytes`` library (``"int8_vectorwise_quant"``, or an overload such
as ``"int8_linear_matmul.out"``) to its function. The functions validate with the core's ``_ops.check_*``,
allocate outputs on the input's device, compute the launch geometry and call ``launch.launch``; they
never look at the device type, so the emulated test plugin registers the very same functions for ``cpu``.

torch.library registers a kernel per device *type*, so on a machine whose GPUs the library cannot all
serve (a new GPU next to an old one) each function is registered behind ``routed``: a call on a device
the library holds no code for runs the op's reference kernel instead, before anything is launched.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Callable, Collection

__all__ = ["REGISTERED", "all_ops", "register_all", "routed"]

# (op, device type) -> function, as registered in this process.
REGISTERED: dict[tuple[str, str], Callable] = {}


def all_ops() -> dict[str, Callable]:
    """Every family module's ``OPS``, merged; a name in two modules is an error."""
    found: dict[str, Callable] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        for op, fn in getattr(module, "OPS", {}).items():
            if op in found:
                raise ValueError(f"op {op!r} is implemented in two modules of bitsandbytes_cuda.ops")
            found[op] = fn
    return found


def routed(op: str, fn: Callable, unusable: Collection) -> Callable:
    """``fn``, except that a call whose tensors are on a device in ``unusable`` (``torch.device``s) runs
    the reference kernel of ``op``. An op's tensors share one device, so its first tensor decides."""
    import torch

    from bitsandbytes._reference import REFERENCE

    reference = REFERENCE[op]
    unusable = frozenset(unusable)

    @functools.wraps(fn)
    def run(*args, **kwargs):
        for a in (*args, *kwargs.values()):
            if isinstance(a, torch.Tensor):
                if a.device in unusable:
                    return reference(*args, **kwargs)
                break
        return fn(*args, **kwargs)

    return run


def register_all(device_type: str = "cuda", unusable: Collection = ()) -> dict[str, Callable]:
    """Register every op for ``device_type`` (``"cpu"`` only for emulation); idempotent. Returns the ops.

    ``unusable``: devices (``torch.device``) the library cannot serve; calls there take the reference."""
    import torch

    ops = all_ops()
    for op, fn in ops.items():
        if (op, device_type) not in REGISTERED:
            kernel = routed(op, fn, unusable) if unusable else fn
            torch.library.register_kernel(f"bitsandbytes::{op}", device_type)(kernel)
            REGISTERED[(op, device_type)] = kernel
    return ops
