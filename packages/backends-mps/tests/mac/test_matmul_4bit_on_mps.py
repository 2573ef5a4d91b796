"""On an Apple Silicon Mac: matmul_4bit.metal's gemv kernel (and gemm_4bit through it and fourbit.metal),
compiled by Apple's compiler and run on the GPU, within the conformance suite's matmul bound of the
reference on cpu."""

from __future__ import annotations

import pytest
import torch
from on_mps_checks import DTYPES

from bitsandbytes import _formats
from bitsandbytes._reference import REFERENCE
from bitsandbytes.testing.conformance.test_fourbit import matmul_tolerance
from bitsandbytes_mps.ops import matmul_4bit

pytestmark = pytest.mark.skipif(not torch.backends.mps.is_available(), reason="needs an Apple Silicon GPU (MPS)")


@pytest.mark.parametrize(("M", "N", "K"), [(1, 4096, 4096), (3, 11, 333), (8, 7, 64)])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gemv_and_gemm_on_mps(dtype, M, N, K):
    g = torch.Generator().manual_seed(1)
    W = torch.randn(N, K, generator=g)
    A = torch.randn(M, K, generator=g).to(dtype)
    packed, absmax = REFERENCE["quantize_4bit"](W, 64, "nf4", torch.uint8)
    W64 = REFERENCE["dequantize_4bit"](packed, absmax, 64, "nf4", [N, K], torch.float32).double()
    code = _formats.code_table("nf4").float()
    ref = REFERENCE["gemv_4bit"](A, packed, [N, K], absmax, code, 64)
    dev = [t.to("mps") for t in (A, packed, absmax, code)]
    for got in (
        matmul_4bit.gemv_4bit(dev[0], dev[1], [N, K], dev[2], dev[3], 64),
        matmul_4bit.gemm_4bit(dev[0], dev[1], [N, K], dev[2], 64, "nf4"),
    ):
        diff = (got.cpu().double() - ref.double()).abs()
        assert not (diff > matmul_tolerance(A, W64, ref)).any(), diff.max().item()
