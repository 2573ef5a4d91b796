"""On an Apple Silicon Mac (``nox -s tests-mps``): the backend loads its kernels natively, the pipelines run
them as launched, the int8 ops give on mps what the reference gives on cpu, and nothing waits for the GPU.
The op-level bytes of every family, and the nn modules and optimizers on mps against the reference, are
the conformance suite's job (``python -m bitsandbytes.testing --device mps``)."""

from __future__ import annotations

import pytest
import torch

import bitsandbytes.backends as backends
from bitsandbytes._reference import int8 as reference
from bitsandbytes.backends import dispatch
from bitsandbytes_mps import library, ops, plugin
from bitsandbytes_mps.ops import int8 as mps_int8

pytestmark = pytest.mark.skipif(not torch.backends.mps.is_available(), reason="needs an Apple Silicon GPU (MPS)")


def test_backend_loaded_natively():
    record = {r.name: r for r in backends.records()}.get("mps")
    assert record is not None and record.status == "loaded", record
    st = library.status()
    assert st.path in ("metallib", "source"), st.as_dict()  # never the reference on a supported Mac
    mps = dispatch.dispatch_key("mps")
    assert [op for op in ops.all_ops() if not dispatch.has_kernel(op, mps)] == []  # the dispatcher's word
    info = plugin.backend.diagnostics()
    assert info["ops on the reference"] == "none", info


def test_every_pipeline_runs_its_kernel_as_launched():
    """The real pipelines' limits against the host's launch sizes: a pipeline below its kernel's
    max_threads or of another SIMD width would have dropped the kernel at load (st.dropped says which)."""
    from bitsandbytes_mps import tables

    st = library.status()
    assert st.dropped == {}, st.dropped
    for name, k in tables.all_kernels().items():
        fn = library._kernels.get(name)
        if fn is None:  # absent from the library (st.missing), asserted elsewhere
            continue
        assert fn.max_threads_per_threadgroup >= k.max_threads, name
        assert fn.thread_execution_width == tables.SIMD_WIDTH, name


def test_bfloat_kernels_load_on_macos_14():
    import platform

    major = int(platform.mac_ver()[0].split(".")[0])
    if major >= 14:
        assert library.status().missing == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_int8_ops_on_mps_match_the_reference_on_cpu(dtype):
    A = (torch.randn(33, 300) * 2).to(dtype)
    got = mps_int8.int8_vectorwise_quant(A.to("mps"), 3.0)
    want = reference.int8_vectorwise_quant(A, 3.0)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g.cpu(), w, rtol=0, atol=0)
    codes, stats = want[0], want[1]
    torch.testing.assert_close(mps_int8.int8_vectorwise_dequant(codes.to("mps"), stats.to("mps")).cpu(),
                               reference.int8_vectorwise_dequant(codes, stats), rtol=0, atol=0)  # fmt: skip


def test_kernels_queue_without_waiting():
    """Many launches return before the GPU finishes them: nothing in dispatch synchronizes."""
    A = torch.randn(4096, 4096, device="mps", dtype=torch.float16)
    torch.mps.synchronize()
    for _ in range(20):
        mps_int8.int8_vectorwise_quant(A)
    torch.mps.synchronize()
