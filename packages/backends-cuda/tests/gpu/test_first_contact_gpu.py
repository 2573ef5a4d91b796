"""On a real GPU: the first-contact behaviours the CPU tests can only fake.

A failure this library handled (a refused prefetch) is not reported again by the next launch; the
prefetch follows cudaDevAttrConcurrentManagedAccess; the load-time architecture decision agrees with the
library's own probe on this GPU.
"""

from __future__ import annotations

import ctypes

import pytest
import torch

from bitsandbytes_cuda import archs, launch
from bitsandbytes_cuda.ops import int8 as int8_ops

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")


def _lib():
    lib = launch.library()
    lib.bnb_cuda_managed_prefetch.restype = ctypes.c_int
    lib.bnb_cuda_managed_prefetch.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    lib.bnb_cuda_concurrent_managed_access.restype = ctypes.c_int
    lib.bnb_cuda_concurrent_managed_access.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
    return lib


def test_a_refused_prefetch_is_not_reported_by_the_next_launch():
    lib = _lib()
    A = torch.randn(16, 64, device="cuda", dtype=torch.float16)
    torch.cuda.synchronize()
    # Device memory from torch's allocator is not managed: cudaMemPrefetchAsync refuses it.
    rc = lib.bnb_cuda_managed_prefetch(A.data_ptr(), A.numel() * 2, torch.cuda.current_device(), None)
    if rc == 0:
        pytest.skip("this driver prefetched device memory: no handled failure to follow")
    int8_ops.int8_vectorwise_quant(A, 0.0)  # raised the prefetch's error before the launchers cleared it
    torch.cuda.synchronize()


def test_concurrent_managed_access_is_read_per_device():
    lib = _lib()
    for i in range(torch.cuda.device_count()):
        value = ctypes.c_int(-1)
        assert lib.bnb_cuda_concurrent_managed_access(i, ctypes.pointer(value)) == 0
        assert value.value in (0, 1)


def test_paged_prefetch_works_whatever_the_attribute():
    import bitsandbytes.functional as F

    t = F.get_paged(1024, dtype=torch.float32, device="cuda")
    F.prefetch_tensor(t)
    F.prefetch_tensor(t, to_cpu=True)
    t.add_(1)
    torch.cuda.synchronize()
    assert t.sum().item() == 1024


def test_the_arch_decision_agrees_with_the_librarys_probe():
    held = launch.library().bnb_cuda_archs().decode()
    index = torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(index)
    assert archs.covers(held, major, minor) == (launch.library().bnb_cuda_check_device() == 0)
