"""Helpers shared by the op modules: kernel-name suffixes per dtype (the kit's), launch sizes, placeholder buffers."""

from __future__ import annotations

import torch

from bitsandbytes.backends import kit

from .. import library

__all__ = ["GROUP", "elementwise", "native", "placeholder", "suffix"]

GROUP = 256  # threads per threadgroup for the elementwise kernels: 8 SIMD-groups
# Kernels index with a 32-bit thread position: larger launches stay on the reference.
MAX_THREADS = 2**32 - 1


def suffix(dtype: torch.dtype) -> str:
    """The tables' name suffix of a kernel instantiated for ``dtype``; ``TypeError`` for other dtypes."""
    return kit.dtype_suffix(dtype, "Metal")


def native(name: str, threads: int = 0) -> bool:
    """Whether kernel ``name`` is loaded (a bfloat kernel is not where MSL < 3.1) and ``threads`` fits."""
    return threads <= MAX_THREADS and library.has(name)


def elementwise(n: int) -> tuple[int, int]:
    """(threads, group_size) for one lane per element of ``n`` (n > 0); the short last group is Metal's."""
    return n, min(n, GROUP)


_placeholders: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}


def placeholder(device: torch.device, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A one-element buffer for an optional argument that is absent (Metal cannot bind nothing). Kernels
    only read it when told it is there, so one per device and dtype serves every call: no allocation
    (and no fill kernel) in the hot path."""
    key = (torch.device(device), dtype)
    buf = _placeholders.get(key)
    if buf is None:
        buf = _placeholders[key] = torch.zeros(1, dtype=dtype, device=device)
    return buf
