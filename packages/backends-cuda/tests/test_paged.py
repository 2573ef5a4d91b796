"""The Python side of paged (managed) memory, against a fake kernel library (no GPU needed).

What a GPU alone can tell (that cudaMallocManaged memory pages and prefetches, and that torch accepts
it through __cuda_array_interface__) is left to the hardware run; here: the core's get_paged /
prefetch_tensor reach our entry points with the right sizes, devices and streams, the memory is
zero-filled, typed and shaped, freed exactly once when the last view dies, CUDA errors surface
as exceptions naming the operation, and a device without concurrent managed access (Windows, WSL2) is
never asked to prefetch.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from bitsandbytes import functional
from bitsandbytes._functional import paged as core_paged
from bitsandbytes_cuda import paged

STREAM = 0x5EED


class FakeLib:
    """Stands in for the kernel library: host memory as "managed" memory, calls recorded."""

    def __init__(self, fail_alloc: int = 0, fail_prefetch: int = 0) -> None:
        self.memory: dict[int, ctypes.Array] = {}
        self.calls: list[tuple] = []
        self.fail_alloc, self.fail_prefetch = fail_alloc, fail_prefetch
        self.concurrent: dict[int, int] = {}  # cudaDevAttrConcurrentManagedAccess per device (default 1)
        self.fail_attribute = 0

        def alloc(out, nbytes):
            self.calls.append(("alloc", nbytes))
            if self.fail_alloc:
                return self.fail_alloc
            block = (ctypes.c_uint8 * nbytes)(*([0xAB] * nbytes))  # not zeroed, like cudaMallocManaged
            self.memory[ctypes.addressof(block)] = block
            out.contents.value = ctypes.addressof(block)
            return 0

        def free(ptr):
            self.calls.append(("free", ptr))
            del self.memory[ptr]
            return 0

        def prefetch(ptr, nbytes, device, stream):
            self.calls.append(("prefetch", ptr, nbytes, device, stream))
            return self.fail_prefetch

        def concurrent_access(device, out):
            self.calls.append(("attribute", device))
            if self.fail_attribute:
                return self.fail_attribute
            out.contents.value = self.concurrent.get(device, 1)
            return 0

        self.bnb_cuda_managed_alloc = alloc
        self.bnb_cuda_concurrent_managed_access = concurrent_access
        self.bnb_cuda_managed_free = free
        self.bnb_cuda_managed_prefetch = prefetch
        self.bnb_cuda_error_string = lambda rc: b"out of memory" if rc == 2 else b"invalid device"


def _host_bytes(buffer: paged.ManagedBuffer, device: torch.device) -> torch.Tensor:
    # What torch.as_tensor does with __cuda_array_interface__, on the host: a view that owns the buffer.
    iface = buffer.__cuda_array_interface__
    ptr, n = iface["data"][0], iface["shape"][0]
    assert iface["typestr"] == "|u1" and n == buffer.nbytes
    if n == 0:
        return torch.empty(0, dtype=torch.uint8)  # torch.frombuffer refuses empty buffers
    array = (ctypes.c_uint8 * n).from_address(ptr)
    array.owner = buffer
    return torch.frombuffer(array, dtype=torch.uint8)


@pytest.fixture
def lib(monkeypatch):
    fake = FakeLib()
    monkeypatch.setattr(core_paged, "_PAGED_MEMORY", {})  # the registry is restored after the test
    monkeypatch.setattr(paged, "_device_bytes", _host_bytes)
    monkeypatch.setattr(
        paged, "_on_device", lambda index: fake.calls.append(("current", index)) or contextlib.nullcontext()
    )
    monkeypatch.setattr(paged, "_stream", lambda device: STREAM + device.index)
    # The fake's tensors live on the host; each stands for the CUDA device it was allocated on.
    monkeypatch.setattr(paged, "_device_of", lambda t: torch.device("cuda", t.page_deviceid))
    paged.register(fake)
    return fake


def test_register_gives_cuda_paged_memory(lib):
    assert core_paged.has_paged_memory("cuda") and not core_paged.has_paged_memory("cpu")


def test_get_paged_allocates_zeroed_typed_managed_memory(lib):
    t = functional.get_paged(3, 5, dtype=torch.float16, device="cuda:0")
    assert lib.calls == [("current", 0), ("alloc", 30)]
    assert t.is_paged and t.page_deviceid == 0
    assert t.shape == (3, 5) and t.dtype == torch.float16 and not t.any()
    (ptr,) = lib.memory
    assert t.data_ptr() == ptr  # a view of the managed memory, not a copy
    t.fill_(1.0)
    assert bytes(lib.memory[ptr])[:2] == b"\x00\x3c"  # float16 1.0, written through


def test_memory_is_freed_once_after_the_last_view(lib):
    t = functional.get_paged(64, dtype=torch.float32, device="cuda:0")
    view = t[8:]
    (ptr,) = lib.memory
    del t
    gc.collect()
    assert ("free", ptr) not in lib.calls
    del view
    gc.collect()
    assert [c for c in lib.calls if c[0] == "free"] == [("free", ptr)] and not lib.memory


def _prefetch(t, to_cpu=False):
    # prefetch_tensor(t, to_cpu) on a real CUDA tensor; the fake's tensors live on the host, so call the
    # registered hook the way prefetch_tensor does.
    core_paged._PAGED_MEMORY["cuda"].prefetch(t, None if to_cpu else torch.device("cuda", t.page_deviceid))


def _prefetches(lib):
    return [c for c in lib.calls if c[0] == "prefetch"]


def test_prefetch_to_device_and_host(lib):
    t = functional.get_paged(4, 4, dtype=torch.float32, device="cuda:1")
    del lib.calls[:]
    _prefetch(t)
    _prefetch(t, to_cpu=True)
    # On the tensor's device's current stream, with that device current (stream 0 is per device).
    assert lib.calls == [
        ("attribute", 1), ("current", 1), ("prefetch", t.data_ptr(), 64, 1, STREAM + 1),
        ("current", 1), ("prefetch", t.data_ptr(), 64, -1, STREAM + 1),
    ]  # fmt: skip


def test_no_prefetch_without_concurrent_managed_access(lib):
    # Windows (WDDM), WSL2, some Jetsons: cudaMemPrefetchAsync fails there, so the core's prefetch_tensor
    # (called on every step of a paged optimizer) must do nothing rather than raise.
    lib.concurrent = {0: 0, 1: 1}
    t0 = functional.get_paged(8, dtype=torch.float32, device="cuda:0")
    t1 = functional.get_paged(8, dtype=torch.float32, device="cuda:1")
    for _ in range(3):
        _prefetch(t0)
        _prefetch(t0, to_cpu=True)  # the stream's device needs the attribute as well
        core_paged._PAGED_MEMORY["cuda"].prefetch(t1, torch.device("cuda", 0))  # so does the target
    assert _prefetches(lib) == []
    _prefetch(t1)
    assert _prefetches(lib) == [("prefetch", t1.data_ptr(), 32, 1, STREAM + 1)]
    # Read once per device, not per step.
    assert sorted(c for c in lib.calls if c[0] == "attribute") == [("attribute", 0), ("attribute", 1)]


def test_a_failed_attribute_query_names_the_device(lib):
    lib.fail_attribute = 101
    t = functional.get_paged(4, dtype=torch.float32, device="cuda:0")
    with pytest.raises(RuntimeError, match=r"cudaDevAttrConcurrentManagedAccess of CUDA device 0 failed"):
        _prefetch(t)
    assert _prefetches(lib) == []


def test_empty_tensor(lib):
    t = functional.get_paged(0, 7, dtype=torch.float32, device="cuda:0")
    _prefetch(t)
    assert t.shape == (0, 7) and lib.calls[:2] == [("current", 0), ("alloc", 1)]  # cudaMallocManaged rejects 0 bytes
    assert not any(c[0] == "prefetch" for c in lib.calls)


def test_cuda_errors_name_the_operation(lib):
    lib.fail_alloc = 2
    with pytest.raises(RuntimeError, match=r"allocating 16 bytes of managed memory on cuda:0 failed: out of memory"):
        functional.get_paged(4, dtype=torch.float32, device="cuda:0")
    lib.fail_alloc = 0
    t = functional.get_paged(4, dtype=torch.float32, device="cuda:0")
    lib.fail_prefetch = 101
    with pytest.raises(RuntimeError, match=r"prefetching 16 bytes .* to the host failed: invalid device"):
        _prefetch(t, to_cpu=True)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA toolkit)")
def test_paged_source_compiles_with_nvcc(tmp_path):
    src = Path(__file__).parents[1] / "csrc" / "paged.cu"
    run = subprocess.run(["nvcc", "-arch=sm_80", "-c", str(src), "-o", str(tmp_path / "paged.o")],
                         capture_output=True, text=True)  # fmt: skip
    assert run.returncode == 0, run.stderr
