"""What the torch dispatcher knows about bitsandbytes' ops: which kernels exist for which device.

Everything here is read back from the dispatcher itself rather than from what backends claim, so the
coverage shown to users is what actually runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._ops import LIB, OPS, qualname

# The dispatch key the default (reference) kernels are registered under.
DEFAULT_KEY = "CompositeExplicitAutograd"
# Device columns always shown, whether or not this machine has the device.
DEFAULT_DEVICE_TYPES = ("cpu", "cuda", "mps", "xpu")
# Backend dispatch keys a plugin may register kernels under. Autograd/Meta keys are not devices.
_DEVICE_KEYS = ("CPU", "CUDA", "MPS", "XPU", "HPU", "MTIA", "PrivateUse1")


def _privateuse1_name() -> str:
    # Out-of-tree devices (Ascend "npu", ...) rename the PrivateUse1 key's device type.
    return torch._C._get_privateuse1_backend_name()


def dispatch_key(device_type: str) -> str:
    """``"cuda"`` -> ``"CUDA"``; the renamed PrivateUse1 device type -> ``"PrivateUse1"``."""
    if device_type in ("privateuseone", _privateuse1_name()):
        return "PrivateUse1"
    return device_type.upper()


def device_type(key: str) -> str:
    """Inverse of :func:`dispatch_key`."""
    return _privateuse1_name() if key == "PrivateUse1" else key.lower()


def has_kernel(op: str, key: str) -> bool:
    """Whether ``bitsandbytes::<op>`` (``op`` may carry an overload: ``"gemv_4bit.out"``) has a kernel for ``key``."""
    return torch._C._dispatch_has_kernel_for_dispatch_key(qualname(op), key)


@dataclass(frozen=True)
class Snapshot:
    """The bitsandbytes part of the dispatcher at one moment."""

    ops: frozenset[str]  # every op name (with overload) registered under bitsandbytes::
    kernels: frozenset[tuple[str, str]]  # (op name, dispatch key) for each device kernel


def snapshot() -> Snapshot:
    prefix = f"{LIB}::"
    ops = frozenset(n[len(prefix) :] for n in torch._C._dispatch_get_all_op_names() if n.startswith(prefix))
    kernels = frozenset(
        (n[len(prefix) :], key)
        for key in _DEVICE_KEYS
        for n in torch._C._dispatch_get_registrations_for_dispatch_key(key)
        if n.startswith(prefix)
    )
    return Snapshot(ops, kernels)


NATIVE = "native"
REFERENCE = "reference"
MISSING = "missing"


def coverage(device_types: tuple[str, ...] | None = None) -> dict[str, dict[str, str]]:
    """``{op: {device_type: "native" | "reference" | "missing"}}`` for every op in ``OPS``.

    "native" means a kernel is registered for that device's dispatch key (a backend's), "reference"
    that the device-agnostic default kernel runs, "missing" that nothing would run (never the case
    once the core's reference kernels are all registered).
    """
    types = device_types if device_types is not None else DEFAULT_DEVICE_TYPES
    table: dict[str, dict[str, str]] = {}
    for op in OPS:
        fallback = REFERENCE if has_kernel(op, DEFAULT_KEY) else MISSING
        table[op] = {t: NATIVE if has_kernel(op, dispatch_key(t)) else fallback for t in types}
    return table
