"""The op implementations for device ``cuda``: one module per kernel family, each with an ``OPS`` dict.

``OPS`` maps an op name of the ``bitsandbytes`` library (``"int8_vectorwise_quant"``, or an overload such
as ``"int8_linear_matmul.out"``) to its function. The functions validate with the core's ``_ops.check_*``,
allocate outputs on the input's device, compute the launch geometry and call ``launch.launch``; they
never look at the device type, so the emulated test plugin registers the very same functions for ``cpu``.
Collection and registration are the core's plugin kit (``bitsandbytes.backends.kit``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection

__all__ = ["all_ops", "register_all"]


def all_ops() -> dict[str, Callable]:
    """Every family module's ``OPS``, merged; a name in two modules is an error."""
    from bitsandbytes.backends import kit

    return kit.collect(__name__)


def register_all(device_type: str = "cuda", unusable: Collection = ()) -> dict[str, Callable]:
    """Register every op for ``device_type`` (``"cpu"`` only for emulation); idempotent. Returns the ops.

    ``unusable``: devices (``torch.device``) the library cannot serve: torch.library registers a kernel per
    device *type*, so on a machine with GPUs the library holds no code for next to ones it does, calls on
    those run the op's reference kernel instead, before anything is launched (``kit.routed``)."""
    from bitsandbytes.backends import kit

    ops = all_ops()
    kit.register(ops, device_type, unusable=unusable)
    return ops
