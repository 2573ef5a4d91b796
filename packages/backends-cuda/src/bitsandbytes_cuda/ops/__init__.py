"""The op implementations for device ``cuda``: one module per kernel family, each with an ``OPS`` dict.

``OPS`` maps an op name of the ``bitsandbytes`` library (``"int8_vectorwise_quant"``, or an overload such
as ``"int8_linear_matmul.out"``) to its function. The functions validate with the core's ``_ops.check_*``,
allocate outputs on the input's device, compute the launch geometry and call ``launch.launch``; they
never look at the device type, so the emulated test plugin registers the very same functions for ``cpu``.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable

__all__ = ["REGISTERED", "all_ops", "register_all"]

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


def register_all(device_type: str = "cuda") -> dict[str, Callable]:
    """Register every op for ``device_type`` (``"cpu"`` only for emulation); idempotent. Returns the ops."""
    import torch

    ops = all_ops()
    for op, fn in ops.items():
        if (op, device_type) not in REGISTERED:
            torch.library.register_kernel(f"bitsandbytes::{op}", device_type)(fn)
            REGISTERED[(op, device_type)] = fn
    return ops
