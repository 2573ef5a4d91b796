"""On a real GPU: the tensor-core kernel of gemm_4bit (WMMA on the hardware, not the emulator's) at a
decoder shape, with the device's own split of K, against the reference on the CPU within the bound of
tests/test_matmul_4bit_tc.py (same rounded weight; fp32 sums in another order; one rounding each)."""

from __future__ import annotations

from functools import lru_cache

import pytest
import torch

from bitsandbytes._reference import REFERENCE
from bitsandbytes_cuda.ops import matmul_4bit as ops

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")

EPS = {torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}


def _tensor_cores(dtype) -> bool:
    return torch.cuda.get_device_capability() >= ops.TC_DTYPE_CAPABILITY[dtype]


def _bound(ref, A, Wt, bias):
    mag = A.double().abs() @ Wt.abs().T + bias.double().abs()
    return 2 * (A.shape[-1] + 1) * 2.0**-24 * mag + EPS[A.dtype] * ref.double().abs()


@lru_cache(maxsize=2)
def _weight(N, K):
    g = torch.Generator().manual_seed(N + K)
    return REFERENCE["quantize_4bit"](torch.randn(N, K, generator=g), 64, "nf4", torch.uint8)


@lru_cache(maxsize=4)
def _rounded(N, K, dtype):
    """The weight rounded to A's dtype, as both the kernel and the reference multiply by it."""
    packed, absmax = _weight(N, K)
    return REFERENCE["dequantize_4bit"](packed, absmax, 64, "nf4", [N, K], dtype).double()


# Small enough for the device check's time box (the reference runs on the CPU): a partial block of
# features and 17 chunks; the 4096 x 4096 projection at 16 and 64 rows, split over the device's SMs.
SHAPES = [(9, 300, 1088), (32, 300, 1088), (16, 4096, 4096), (64, 4096, 4096)]


@pytest.mark.parametrize(("M", "N", "K"), SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_tensor_core_route_on_gpu(monkeypatch, dtype, M, N, K):
    if not _tensor_cores(dtype):
        pytest.skip(f"no {dtype} tensor cores (WMMA) on sm_{''.join(map(str, torch.cuda.get_device_capability()))}")
    g = torch.Generator().manual_seed(M)
    packed, absmax = _weight(N, K)
    Wt = _rounded(N, K, dtype)
    A = torch.randn(M, K, generator=g).to(dtype)
    bias = torch.randn(N, generator=g).to(dtype)
    # Forced: the kernel on hardware whatever TC_MAX_ROWS says for this device and shape (the route itself
    # is tested in emulation, tests/test_matmul_4bit_tc.py).
    monkeypatch.setattr(ops, "matmul_route", lambda *a: "tc")
    names = []
    real = ops.launch
    monkeypatch.setattr(ops, "launch", lambda name, *a: (names.append(name), real(name, *a))[1])
    args = (packed.cuda(), [N, K], absmax.cuda(), 64, "nf4")
    out = ops.gemm_4bit(A.cuda(), *args, bias=bias.cuda())
    assert names[0].startswith("gemm_4bit_tc_"), names
    ref = REFERENCE["gemm_4bit"](A, packed, [N, K], absmax, 64, "nf4", bias=bias)
    bound = _bound(ref, A, Wt, bias)
    diff = (out.cpu().double() - ref.double()).abs()
    assert (diff <= bound).all(), diff.max()
    # One split gives the same result within the bound too (and the same bytes on a rerun).
    chunks = -(-K // ops.TC_CHUNK)
    monkeypatch.setattr(ops, "tc_splits", lambda *a: (1, chunks))
    single = ops.gemm_4bit(A.cuda(), *args, bias=bias.cuda())
    assert ((single.cpu().double() - ref.double()).abs() <= bound).all()
    assert torch.equal(single, ops.gemm_4bit(A.cuda(), *args, bias=bias.cuda()))
