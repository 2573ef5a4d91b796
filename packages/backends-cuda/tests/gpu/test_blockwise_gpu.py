"""The blockwise and fourbit kernels on a real GPU (``nox -s tests-cuda``): what the emulator cannot show. Unaligned
tensors take the scalar load/store paths (the emulator's buffers are always aligned), and hardware
arithmetic (IEEE division and reciprocal, no FMA contraction, no flushed subnormals) must give the
reference's codes bit for bit, also for subnormal absmax and tiny blocks."""

from __future__ import annotations

import pytest
import torch

from bitsandbytes import functional
from bitsandbytes._reference import REFERENCE
from bitsandbytes_cuda.ops import blockwise, fourbit

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _data(n, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * torch.logspace(-40, 3, n)[torch.randperm(n, generator=g)]
    return x.to(dtype)


def _bits(t):
    t = t.cpu()
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("offset", [0, 1])
@pytest.mark.parametrize("blocksize", [32, 64, 4096])
def test_blockwise_and_4bit_equal_the_reference(monkeypatch, dtype, offset, blocksize):
    monkeypatch.setattr(blockwise, "MAX_GRID", 7)  # the grid-stride loops too
    n = 50 * blocksize + 13
    buf = _data(n + offset, dtype, seed=blocksize + offset)
    A_cpu = buf[offset:]
    A = buf.cuda()[offset:]  # offset 1: not 16-byte aligned, so the scalar paths run
    code = functional.create_dynamic_map(signed=True).float()
    q, absmax = blockwise.quantize_blockwise(A, code.cuda(), blocksize)
    rq, rabsmax = REFERENCE["quantize_blockwise"](A_cpu, code, blocksize)
    assert torch.equal(q.cpu(), rq) and torch.equal(_bits(absmax), _bits(rabsmax))
    out = torch.empty(n + offset, dtype=dtype, device="cuda")[offset:]
    blockwise.dequantize_blockwise_out(q, absmax, code.cuda(), blocksize, dtype, out)
    ref = REFERENCE["dequantize_blockwise"](rq, rabsmax, code, blocksize, dtype)
    assert torch.equal(_bits(out), _bits(ref))
    for quant_type in ("nf4", "fp4"):
        packed, absmax = fourbit.quantize_4bit(A, blocksize, quant_type, torch.uint8)
        rpacked, rabsmax = REFERENCE["quantize_4bit"](A_cpu, blocksize, quant_type, torch.uint8)
        assert torch.equal(packed.cpu(), rpacked) and torch.equal(_bits(absmax), _bits(rabsmax))
        got = fourbit.dequantize_4bit(packed[offset:], absmax, blocksize, quant_type, [n - 2 * offset], dtype)
        ref = REFERENCE["dequantize_4bit"](rpacked[offset:], rabsmax, blocksize, quant_type, [n - 2 * offset], dtype)
        assert torch.equal(_bits(got), _bits(ref))
