"""On an Apple Silicon Mac: the quant family's kernels, compiled by Apple's compiler and run on the GPU,
give the bytes the reference gives on cpu. This is what the emulator cannot show: that fast math (if the
library was compiled with it) leaves the scaling, the NaN tests and the nearest-code compares alone."""

from __future__ import annotations

import pytest
import torch

from bitsandbytes import _formats, functional
from bitsandbytes._reference import REFERENCE
from bitsandbytes.testing.conformance.test_fourbit import matmul_tolerance
from bitsandbytes_mps.ops import quant

pytestmark = pytest.mark.skipif(not torch.backends.mps.is_available(), reason="needs an Apple Silicon GPU (MPS)")

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _input(dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    A = torch.randn(5, 1000, generator=g) * torch.logspace(-3, 2, 1000)
    A[0, 3], A[1, 700], A[2, 0] = float("nan"), float("inf"), 0.0
    A[3, :256] = 0  # an all-zero block
    return A.to(dtype)


def _same(got: torch.Tensor, want: torch.Tensor) -> None:
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("blocksize", [32, 64, 256, 4096])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_blockwise_bytes_on_mps(dtype, blocksize):
    A = _input(dtype)
    code = functional.create_dynamic_map(signed=True).float()
    q, absmax = quant.quantize_blockwise(A.to("mps"), code.to("mps"), blocksize)
    rq, rabsmax = REFERENCE["quantize_blockwise"](A, code, blocksize)
    _same(q, rq)
    _same(absmax, rabsmax)
    _same(quant.dequantize_blockwise(q, absmax, code.to("mps"), blocksize, dtype),
          REFERENCE["dequantize_blockwise"](rq, rabsmax, code, blocksize, dtype))  # fmt: skip


@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
@pytest.mark.parametrize("blocksize", [32, 64, 256, 4096])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_4bit_bytes_on_mps(dtype, blocksize, quant_type):
    A = _input(dtype)[:, :999]  # odd count: the padding nibble
    packed, absmax = quant.quantize_4bit(A.to("mps"), blocksize, quant_type, torch.uint8)
    rpacked, rabsmax = REFERENCE["quantize_4bit"](A, blocksize, quant_type, torch.uint8)
    _same(packed, rpacked)
    _same(absmax, rabsmax)
    got = quant.dequantize_4bit(packed, absmax, blocksize, quant_type, list(A.shape), dtype)
    _same(got, REFERENCE["dequantize_4bit"](rpacked, rabsmax, blocksize, quant_type, list(A.shape), dtype))


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
        quant.gemv_4bit(dev[0], dev[1], [N, K], dev[2], dev[3], 64),
        quant.gemm_4bit(dev[0], dev[1], [N, K], dev[2], 64, "nf4"),
    ):
        diff = (got.cpu().double() - ref.double()).abs()
        assert not (diff > matmul_tolerance(A, W64, ref)).any(), diff.max().item()
