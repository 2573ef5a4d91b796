"""Upstream's ctypes-facing names in ``bitsandbytes.functional``: ``lib``, ``get_ptr``, ``is_on_gpu``,
``has_avx512bf16``. Nothing in this package calls native code through them; they exist for tools that
call upstream's C entry points themselves (see ``bitsandbytes.cextension``)."""

from __future__ import annotations

import ctypes
import functools
import sys
from collections.abc import Iterable

import torch

from ..cextension import lib

__all__ = ["get_ptr", "has_avx512bf16", "is_on_gpu", "lib"]


def get_ptr(A: torch.Tensor | None) -> ctypes.c_void_p | None:
    """The address of ``A``'s first element as a ``ctypes.c_void_p``; None (a null pointer) for None."""
    if A is None:
        return None
    if not isinstance(A, torch.Tensor):
        raise TypeError(f"get_ptr: A must be a torch.Tensor or None, got {type(A).__name__}")
    return ctypes.c_void_p(A.data_ptr())


def is_on_gpu(tensors: Iterable[torch.Tensor | None]) -> bool:
    """True when every tensor (None and paged tensors aside) is on one accelerator device; RuntimeError otherwise.

    Upstream's check before handing pointers to a device kernel: a CPU tensor, or tensors on two devices,
    would be read as device memory.
    """
    tensors = list(tensors)
    on_gpu, devices = True, set()
    for t in tensors:
        if t is not None and not getattr(t, "is_paged", False):
            on_gpu &= t.device.type != "cpu"
            devices.add((t.device.type, t.device.index))
    found = [(tuple(t.shape), str(t.device)) for t in tensors if t is not None]
    if not on_gpu:
        raise RuntimeError(f"All input tensors need to be on the same GPU, but some are not on a GPU: {found}")
    if len(devices) > 1:
        raise RuntimeError(f"Input tensors need to be on the same GPU, but they are on several devices: {found}")
    return on_gpu


@functools.cache
def _cpu_has_flag(flag: str) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and flag in line.split() for line in f)
    except OSError:
        return False


def has_avx512bf16() -> bool:
    """Whether this CPU has the AVX512-BF16 instructions: the native library's answer where one serves
    ``lib.has_avx512bf16_cpu``, else the kernel's CPU flags (Linux; False elsewhere)."""
    probe = lib.has_avx512bf16_cpu
    if hasattr(probe, "restype"):  # a real native function
        try:
            return bool(probe())
        except Exception:
            pass
    return _cpu_has_flag("avx512_bf16")
