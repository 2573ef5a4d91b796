"""Paged (CUDA managed) memory for the paged optimizers, through csrc/paged.cu.

``register(lib)`` (called by the plugin's load with the kernel library) hands the core
``bitsandbytes._functional.paged.register_paged_memory("cuda", allocate, prefetch)``; from then on
``get_paged(..., device="cuda")`` returns zero-filled tensors in managed memory that the driver pages
between host and GPU on demand, and ``prefetch_tensor`` migrates them ahead of use.

A managed allocation becomes a CUDA tensor through ``__cuda_array_interface__`` (zero copy; torch keeps
the owning ``ManagedBuffer`` alive as long as any view of it and frees the memory after the last one).

A prefetch is skipped where a device involved (the target, and the device whose stream orders it) has
``cudaDevAttrConcurrentManagedAccess == 0``: every GPU under Windows (WDDM) and WSL2, some Jetsons. There
``cudaMemPrefetchAsync`` fails, and the driver migrates the pages itself at each launch (upstream's
``cprefetch`` skips the same way). The attribute is read once per device.
"""

from __future__ import annotations

import ctypes
from math import prod

import torch

from bitsandbytes._functional.paged import register_paged_memory

__all__ = ["ManagedBuffer", "register"]


def _check(lib, rc: int, what: str) -> None:
    if rc:
        raise RuntimeError(f"{what} failed: {lib.bnb_cuda_error_string(rc).decode(errors='replace')} (CUDA error {rc})")


class ManagedBuffer:
    """Owns ``nbytes`` of managed memory at ``ptr`` (freed when the object dies); a CUDA array of bytes."""

    def __init__(self, lib, ptr: int, nbytes: int) -> None:
        self._lib, self.ptr, self.nbytes = lib, ptr, nbytes

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": (self.nbytes,), "typestr": "|u1", "data": (self.ptr, False), "version": 2}

    def __del__(self) -> None:
        ptr, self.ptr = self.ptr, None
        if ptr:
            self._lib.bnb_cuda_managed_free(ptr)  # nothing sensible to do with an error while collecting


def _device_bytes(buffer: ManagedBuffer, device: torch.device) -> torch.Tensor:
    """A uint8 CUDA tensor over ``buffer`` (no copy)."""
    return torch.as_tensor(buffer, device=device)


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def _on_device(index: int):
    """Context in which ``index`` is the current CUDA device (allocations land there)."""
    return torch.cuda.device(index)


def _stream(device: torch.device) -> int:
    """The raw handle of the current stream of ``device``."""
    return torch.cuda.current_stream(device).cuda_stream


def _device_of(tensor: torch.Tensor) -> torch.device:
    return tensor.device


def _typed(lib) -> None:
    for name, res, args in (
        ("bnb_cuda_managed_alloc", ctypes.c_int, [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]),
        ("bnb_cuda_managed_free", ctypes.c_int, [ctypes.c_void_p]),
        ("bnb_cuda_managed_prefetch", ctypes.c_int, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]),
        ("bnb_cuda_concurrent_managed_access", ctypes.c_int, [ctypes.c_int, ctypes.POINTER(ctypes.c_int)]),
        ("bnb_cuda_error_string", ctypes.c_char_p, [ctypes.c_int]),
    ):
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args


def register(lib) -> None:
    """Make ``get_paged`` on cuda devices return managed memory from ``lib`` (the kernel library)."""
    _typed(lib)

    def allocate(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        nbytes = prod(shape) * torch.empty((), dtype=dtype).element_size()
        with _on_device(_index(device)):
            ptr = ctypes.c_void_p()
            rc = lib.bnb_cuda_managed_alloc(ctypes.pointer(ptr), max(nbytes, 1))  # 0 bytes is an error
            _check(lib, rc, f"allocating {nbytes} bytes of managed memory on {device}")
            raw = _device_bytes(ManagedBuffer(lib, ptr.value, nbytes), device)
        return raw.view(dtype).view(shape).zero_()

    concurrent: dict[int, bool] = {}  # device index -> cudaDevAttrConcurrentManagedAccess != 0

    def can_prefetch(index: int) -> bool:
        known = concurrent.get(index)
        if known is None:
            value = ctypes.c_int(0)
            rc = lib.bnb_cuda_concurrent_managed_access(index, ctypes.pointer(value))
            _check(lib, rc, f"reading cudaDevAttrConcurrentManagedAccess of CUDA device {index}")
            known = concurrent[index] = value.value != 0
        return known

    def prefetch(tensor: torch.Tensor, device: torch.device | None) -> None:
        nbytes = tensor.numel() * tensor.element_size()
        if nbytes == 0:
            return
        source = _device_of(tensor)
        index = _index(source)
        target = -1 if device is None else _index(device)
        if not can_prefetch(index) or (target >= 0 and target != index and not can_prefetch(target)):
            return
        # The stream is the tensor's device's current one; stream 0 means the legacy stream of the current
        # device, so that device is made current too.
        with _on_device(index):
            rc = lib.bnb_cuda_managed_prefetch(tensor.data_ptr(), nbytes, target, _stream(source))
        _check(lib, rc, f"prefetching {nbytes} bytes of managed memory to {'the host' if target < 0 else device}")

    register_paged_memory("cuda", allocate, prefetch)
