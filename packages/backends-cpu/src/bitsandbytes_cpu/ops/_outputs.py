"""Large fresh outputs of the dequantize ops, reusing the memory of a result the caller has dropped.

torch's CPU allocator hands every large tensor new pages from the kernel (glibc maps allocations of
32 MiB and more afresh each time), and the kernel zeroes each page on the first write: for
``dequantize_4bit`` of a 4096x4096 bf16 weight that zeroing costs more than the dequantization itself,
huge pages or not. So the op keeps the buffer of its last large results and hands one out again once
nobody else references its storage (the storage's use count: a view, a numpy array or an autograd
graph holding the result all keep it from reuse). The caller gets a tensor of its own as always; what
changes is only that up to ``CACHE_BYTES`` of dropped results stay mapped in this process between calls.
Buffers whose storage was moved to shared memory (``share_memory_()``) are never reused.
"""

from __future__ import annotations

import math
import os
import threading
from collections import OrderedDict

import torch

MIN_BYTES = 4 << 20  # smaller tensors come from the allocator's free lists, already mapped


def _cache_mb() -> int:
    text = os.environ.get("BNB_CPU_OUTPUT_CACHE_MB", "256")
    try:
        mb = int(text)
    except ValueError:
        mb = -1
    if mb < 0:
        raise ValueError(f"BNB_CPU_OUTPUT_CACHE_MB must be a whole number of MiB >= 0 (0: no reuse); got {text!r}")
    return mb


CACHE_BYTES = _cache_mb() << 20  # 0 turns reuse off

_use_count = getattr(torch._C, "_storage_Use_Count", None)
_lock = threading.Lock()
_buffers: OrderedDict[int, torch.Tensor] = OrderedDict()  # id -> flat buffer, least recently used first
_held = 0


def _count_of_a_free_buffer() -> int | None:
    # What the query below answers for a tensor nothing else uses: 2 on torch 2.13 (the tensor and the
    # temporary storage object made to ask), 1 on 2.9. Measured, not assumed, so no version is misread.
    if _use_count is None:
        return None
    alone = torch.empty(16)
    return _use_count(alone.untyped_storage()._cdata)


_FREE_COUNT = _count_of_a_free_buffer()


def _free(buf: torch.Tensor) -> bool:
    return _use_count(buf.untyped_storage()._cdata) == _FREE_COUNT and not buf.is_shared()


def _handout(buf: torch.Tensor, shape) -> torch.Tensor:
    # A tensor of the caller's own on the buffer's storage (not a view of it): it counts as a user.
    return torch.empty(0, dtype=buf.dtype).set_(buf.untyped_storage(), 0, tuple(shape))


def empty(
    shape: tuple[int, ...] | list[int] | torch.Size, dtype: torch.dtype, device: torch.device | None = None
) -> torch.Tensor:
    """``torch.empty(shape, dtype=dtype)``, from a cached buffer when one of that size is free. ``device``
    (the allocator signature of ``kit.out_pair``) is the cpu."""
    global _held
    numel = math.prod(shape)
    nbytes = numel * dtype.itemsize
    if nbytes < MIN_BYTES or nbytes > CACHE_BYTES or _use_count is None:
        return torch.empty(shape, dtype=dtype)
    with _lock:
        for key, buf in _buffers.items():
            if buf.dtype == dtype and buf.numel() == numel and _free(buf):
                _buffers.move_to_end(key)
                return _handout(buf, shape)
        # Make room by dropping the least recently used free buffers; if the ones still in use leave no
        # room, this result is not cached (the cache never holds more than CACHE_BYTES).
        for key in list(_buffers):
            if _held + nbytes <= CACHE_BYTES:
                break
            old = _buffers[key]
            if _free(old) or old.is_shared():
                del _buffers[key]
                _held -= old.numel() * old.dtype.itemsize
        if _held + nbytes > CACHE_BYTES:
            return torch.empty(shape, dtype=dtype)
        buf = torch.empty(numel, dtype=dtype)
        _buffers[id(buf)] = buf
        _held += nbytes
        return _handout(buf, shape)
