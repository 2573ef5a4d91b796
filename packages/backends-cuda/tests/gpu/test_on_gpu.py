"""On a real GPU (``nox -s tests-cuda``): the backend loads, launches honour streams and devices, and
int8_linear_matmul is exact on every path. The op-level bytes, and the nn modules and optimizers on cuda
against the same on the reference kernels, are the conformance suite's (``python -m bitsandbytes.testing
--device cuda``: test_modules.py)."""

from __future__ import annotations

import pytest
import torch

import bitsandbytes.backends as backends
from bitsandbytes.backends import dispatch
from bitsandbytes_cuda import launch, ops, plugin
from bitsandbytes_cuda.ops import int8 as int8_ops

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")


def test_backend_loaded_with_every_op():
    record = {r.name: r for r in backends.records()}.get("cuda")
    assert record is not None and record.status == "loaded", record
    assert all(dispatch.has_kernel(op, dispatch.dispatch_key("cuda")) for op in ops.all_ops())
    diag = plugin.backend.diagnostics()
    assert diag["archs in the library"] and diag["CUDA driver"] != "none"
    launch.check_device(torch.cuda.current_device())  # this GPU has SASS or PTX in the library


def test_launch_on_a_side_stream_matches_the_default_stream():
    A = torch.randn(64, 300, device="cuda", dtype=torch.float16)
    expected = int8_ops.int8_vectorwise_quant(A, 2.0)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got = int8_ops.int8_vectorwise_quant(A, 2.0)
    torch.cuda.current_stream().wait_stream(side)
    for g, e in zip(got, expected, strict=True):
        assert torch.equal(g, e)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_tensors_on_two_devices_are_refused_and_second_device_works():
    A = torch.zeros(2, 4, dtype=torch.int8, device="cuda:1")
    with pytest.raises(ValueError, match="is on cuda:0"):
        launch.launch(
            "int8_vectorwise_dequant",
            1,
            32,
            0,
            A,
            torch.ones(2, device="cuda:0"),
            torch.zeros(2, 4, device="cuda:1"),
            8,
            4,
        )
    out = int8_ops.int8_vectorwise_dequant(A, torch.ones(2, device="cuda:1"))  # current device is 0
    assert out.device == A.device and not out.any()


@pytest.mark.parametrize(("M", "K", "N"), [(1, 64, 32), (16, 64, 32), (17, 64, 32), (40, 72, 24), (5, 12, 8)])
def test_int8_linear_matmul_every_path_is_exact(M, K, N):
    # 1-16 rows: padded for torch._int_mm; 17+: _int_mm as is; K or N not a multiple of 8: the reference.
    g = torch.Generator().manual_seed(M)
    A = torch.randint(-127, 128, (M, K), generator=g, dtype=torch.int8)
    B = torch.randint(-127, 128, (N, K), generator=g, dtype=torch.int8)
    got = int8_ops.int8_linear_matmul(A.cuda(), B.cuda())
    assert got.dtype == torch.int32 and torch.equal(got.cpu(), A.int() @ B.int().t())
