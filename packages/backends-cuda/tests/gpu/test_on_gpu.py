"""On a real GPU (``nox -s tests-cuda``): the backend loads, launches honour streams and devices, and the
nn modules and optimizers give on cuda what they give on cpu. The op-level bytes are the conformance
suite's job (``python -m bitsandbytes.testing --device cuda``)."""

from __future__ import annotations

import pytest
import torch

import bitsandbytes as bnb
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


def _module(cls, device, **kwargs):
    torch.manual_seed(0)
    return cls(96, 40, bias=True, **kwargs).to(device)


@pytest.mark.parametrize("batch", [1, 8])
def test_linear8bitlt_on_cuda_is_the_cpu_result(batch):
    x = torch.randn(batch, 96, generator=torch.Generator().manual_seed(1)).half()
    x[:, 3] *= 20  # an outlier column
    outs = []
    for device in ("cpu", "cuda"):
        # Evaluation mode: LLM.int8() on both (in training mode CPU takes upstream's float route).
        m = _module(bnb.nn.Linear8bitLt, device, has_fp16_weights=False, threshold=6.0).half().eval()
        outs.append(m(x.to(device)).float().cpu())
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
@pytest.mark.parametrize("batch", [1, 8])
def test_linear4bit_on_cuda_is_the_cpu_result(quant_type, batch):
    x = torch.randn(batch, 96, generator=torch.Generator().manual_seed(2)).half()
    outs = []
    for device in ("cpu", "cuda"):
        m = _module(bnb.nn.Linear4bit, device, quant_type=quant_type, compute_dtype=torch.float16)
        with torch.no_grad():
            outs.append(m(x.to(device)).float().cpu())
    torch.testing.assert_close(outs[1], outs[0], rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("name", ["Adam8bit", "AdamW", "PagedAdamW8bit", "Lion8bit", "SGD8bit"])
def test_optimizer_steps_on_cuda_are_the_cpu_steps(name):
    results = []
    for device in ("cpu", "cuda"):
        torch.manual_seed(3)
        p = torch.nn.Parameter(torch.randn(64, 80, device=device))
        kwargs = {"momentum": 0.9} if name.startswith("SGD") else {}
        opt = getattr(bnb.optim, name)([p], lr=1e-2, **kwargs)
        g = torch.Generator().manual_seed(4)
        for _ in range(3):
            p.grad = torch.randn(64, 80, generator=g).to(device)
            opt.step()
        results.append(p.detach().cpu())
    torch.testing.assert_close(results[1], results[0], rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize(("M", "K", "N"), [(1, 64, 32), (16, 64, 32), (17, 64, 32), (40, 72, 24), (5, 12, 8)])
def test_int8_linear_matmul_every_path_is_exact(M, K, N):
    # 1-16 rows: padded for torch._int_mm; 17+: _int_mm as is; K or N not a multiple of 8: the reference.
    g = torch.Generator().manual_seed(M)
    A = torch.randint(-127, 128, (M, K), generator=g, dtype=torch.int8)
    B = torch.randint(-127, 128, (N, K), generator=g, dtype=torch.int8)
    got = int8_ops.int8_linear_matmul(A.cuda(), B.cuda())
    assert got.dtype == torch.int32 and torch.equal(got.cpu(), A.int() @ B.int().t())
