"""Metal emulation: metal:: functions and vector helpers against torch."""

from pathlib import Path

import pytest
import torch

from bitsandbytes_emu.build import unavailable_reason

pytestmark = pytest.mark.skipif(unavailable_reason() is not None, reason=unavailable_reason() or "")


@pytest.fixture(scope="module")
def lib():
    import bitsandbytes_emu as emu

    return emu.metal_library(Path(__file__).parent / "kernels" / "metal_math.metal")


def test_float_functions(lib):
    gen = torch.Generator().manual_seed(0)
    x = torch.cat([torch.tensor([2.5, -2.5, 0.5, -0.5, 1.5, 0.0, -0.0]), torch.randn(57, generator=gen) * 4])
    y = torch.randn(64, generator=gen) * 4
    n = x.numel()
    out = torch.zeros(12, n)
    lib.float_functions(x, y, out, n)
    # sqrt is correctly rounded (torch's float32 CPU sqrt is not always: compare with the double result).
    assert torch.equal(out[0], x.abs().double().sqrt().float()) and torch.equal(out[1], y.abs().double().sqrt().float())
    assert torch.equal(out[2], torch.where(x.abs() % 1 == 0.5, x + x.sign() * 0.5, x.round()))  # half away from 0
    assert torch.equal(out[3], x.round())  # rint: half to even, like torch.round
    assert torch.equal(out[4], x.floor() + y.ceil() + x.trunc())
    assert torch.equal(out[5], (x - y).abs())
    assert torch.equal(out[6], x + y)  # fmin/fmax drop a NaN operand
    assert torch.equal(out[7], x.clamp(-1, 1))
    assert torch.equal(out[8], torch.where(x < y, y, x))
    torch.testing.assert_close(out[9], (x * 0.1).exp(), rtol=2e-7, atol=0)
    assert torch.equal(out[10], torch.where(y.signbit(), -2.0, 2.0) + x.sign())
    assert torch.equal(out[11], x - x.floor())


def test_fma_rounds_once(lib):
    out = torch.zeros(2)
    lib.fused(out, threads=1)
    assert out.tolist() == [2.0**-26, 0.0]


def test_integer_functions(lib):
    x = torch.tensor([0, 1, 0x80000000, 0xFFFFFFFF, 0x00F0F000, 12345678], dtype=torch.int64).to(torch.int32)
    out = torch.zeros(x.numel() * 4, dtype=torch.int32)
    lib.integer_functions(x, out)
    got = (out.view(-1, 4).long() & 0xFFFFFFFF).tolist()
    for v, (pop, lz, tz, hi) in zip((x.long() & 0xFFFFFFFF).tolist(), got, strict=True):
        assert pop == bin(v).count("1")
        assert lz == (32 - v.bit_length())
        assert tz == (32 if v == 0 else (v & -v).bit_length() - 1)
        assert hi == (v * 0x9E3779B9) >> 32


def test_vector_functions(lib):
    h = torch.tensor([[1.0, -3.0, 0.5, -2.0], [-0.25, 2.5, -7.0, 1.0]], dtype=torch.half)
    out = torch.zeros(2, 4)
    bits = torch.zeros(2, dtype=torch.int32)
    lib.vector_functions(h, out, bits, threads=2)
    f = h.abs().float()
    assert torch.equal(out, torch.where(f > 2, -1.0, f))
    assert torch.equal(bits, h[:, :2].contiguous().view(torch.int32).reshape(-1))
