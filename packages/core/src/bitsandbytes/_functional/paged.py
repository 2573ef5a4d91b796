"""Paged (managed) memory for optimizer state: upstream's ``get_paged``, ``prefetch_tensor`` and ``GlobalPageManager``.

The core has no managed memory of its own. A backend whose device has it (e.g. CUDA unified memory) makes it
available with ``register_paged_memory(device_type, allocate, prefetch)``; until one does, ``get_paged``
returns an ordinary zero-filled tensor marked ``is_paged = False`` and prefetching it does nothing, so callers
(the paged optimizers) run unchanged, just without paging.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from math import prod

import torch

# Upstream's names, re-exported by bitsandbytes.functional; the two registry functions are for backends.
__all__ = ["GlobalPageManager", "get_paged", "prefetch_tensor"]


@dataclass(frozen=True)
class _PagedMemory:
    # allocate(shape, dtype, device) -> a tensor in managed memory, usable on `device`.
    allocate: Callable[[tuple[int, ...], torch.dtype, torch.device], torch.Tensor]
    # prefetch(tensor, device) moves the pages to `device`, or to the host when `device` is None.
    prefetch: Callable[[torch.Tensor, torch.device | None], None]


_PAGED_MEMORY: dict[str, _PagedMemory] = {}


def register_paged_memory(
    device_type: str,
    allocate: Callable[[tuple[int, ...], torch.dtype, torch.device], torch.Tensor],
    prefetch: Callable[[torch.Tensor, torch.device | None], None],
) -> None:
    """Give ``device_type`` real paged memory (called by a backend plugin when it loads).

    ``allocate(shape, dtype, device)`` returns a zero-filled tensor in managed memory; ``prefetch(tensor,
    device)`` migrates its pages to ``device`` (``None``: to the host). Registering again replaces the pair.
    """
    if not isinstance(device_type, str) or not device_type:
        raise TypeError(f"device_type must be a non-empty str such as 'cuda'; got {device_type!r}")
    if not callable(allocate) or not callable(prefetch):
        raise TypeError("allocate and prefetch must be callables")
    _PAGED_MEMORY[device_type] = _PagedMemory(allocate, prefetch)


def has_paged_memory(device: torch.device | str) -> bool:
    """Whether ``get_paged`` gives real managed memory on ``device`` (a device or a device type)."""
    return torch.device(device).type in _PAGED_MEMORY


def _default_device() -> torch.device:
    # Upstream defaults to the first CUDA device; we take the first device of the current accelerator.
    accelerator = torch.accelerator.current_accelerator() if hasattr(torch, "accelerator") else None
    return torch.device(accelerator.type, 0) if accelerator is not None else torch.device("cpu")


def get_paged(
    *shape: int, dtype: torch.dtype = torch.float32, device: torch.device | str | None = None
) -> torch.Tensor:
    """A zero-filled tensor of ``shape`` in paged memory on ``device`` when the device has it.

    The result carries ``is_paged`` (whether it really is paged) and ``page_deviceid`` (the device index) as
    upstream's does. Without managed memory it is an ordinary tensor with ``is_paged = False``.
    """
    if any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in shape):
        raise ValueError(f"shape must be non-negative ints; got {shape}")
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype; got {type(dtype).__name__}")
    device = _default_device() if device is None else torch.device(device)
    memory = _PAGED_MEMORY.get(device.type)
    if memory is None:
        out = torch.zeros(shape, dtype=dtype, device=device)
        out.is_paged = False
    else:
        out = memory.allocate(tuple(shape), dtype, device)
        if out.shape != shape or out.dtype != dtype or out.numel() != prod(shape):
            raise RuntimeError(f"the paged allocator for {device.type!r} returned {tuple(out.shape)} {out.dtype}")
        out.is_paged = True
    out.page_deviceid = device.index
    return out


def prefetch_tensor(A: torch.Tensor, to_cpu: bool = False) -> None:
    """Start migrating a paged tensor's pages to its device (or to the host with ``to_cpu``).

    Tensors that are not paged (including ``get_paged``'s fallback) have nothing to migrate: a no-op.
    """
    if not isinstance(A, torch.Tensor):
        raise TypeError(f"A must be a torch.Tensor, got {type(A).__name__}")
    if not getattr(A, "is_paged", False):
        return
    memory = _PAGED_MEMORY.get(A.device.type)
    if memory is not None:
        memory.prefetch(A, None if to_cpu else A.device)


class GlobalPageManager:
    """Process-wide list of the paged tensors the paged optimizers allocated (upstream's singleton)."""

    _instance: GlobalPageManager | None = None

    def __init__(self):
        raise RuntimeError("Call get_instance() instead")

    def initialize(self) -> None:
        self.paged_tensors: list[torch.Tensor] = []

    @classmethod
    def get_instance(cls) -> GlobalPageManager:
        if cls._instance is None:
            cls._instance = cls.__new__(cls)
            cls._instance.initialize()
        return cls._instance

    def prefetch_all(self, to_cpu: bool = False) -> None:
        # The first tensors registered are used first, so bring them in last (least likely evicted again).
        for t in reversed(self.paged_tensors):
            prefetch_tensor(t, to_cpu)
