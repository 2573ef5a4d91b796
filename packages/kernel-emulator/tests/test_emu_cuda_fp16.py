"""__half and __nv_bfloat16 in emulation round bit for bit like the hardware (and torch): conversions
round to nearest even (or toward zero for the _rz forms), arithmetic rounds each operation once."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def elementwise(cuda_kernels):
    return cuda_kernels("elementwise.cu", ["to_16bit", "from_16bit", "half_math"])


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16).to(torch.int32) & 0xFFFF


def _inputs() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    # Every finite half, the midpoints between neighbours (ties) and values just off them, random bit
    # patterns over the whole float range, and the edges: overflow thresholds, subnormals, signed zeros.
    halves = torch.arange(0, 0x7C00, dtype=torch.int32).to(torch.int16).view(torch.float16).float()
    mids = (halves[:-1].double() + halves[1:].double()) / 2
    near = torch.cat([mids, torch.nextafter(mids.float(), torch.tensor(0.0)).double(), mids * (1 + 2**-30)])
    bf_ties = (torch.randint(0, 2**31, (4000,), generator=g) & ~0xFFFF | 0x8000).to(torch.int32).view(torch.float32)
    random = torch.randint(0, 2**32, (20000,), generator=g, dtype=torch.int64).to(torch.int32).view(torch.float32)
    edges = torch.tensor(
        [
            0.0,
            65504.0,
            65519.99,
            65520.0,
            65536.0,
            2.0**-24,
            2.0**-25,
            2.0**-25 * 1.0001,
            2.0**-26,
            2.0**-14,
            1e-40,
            3.4e38,
            float("inf"),
        ]
    )
    x = torch.cat([halves, near.float(), bf_ties, random, edges])
    x = x[~torch.isnan(x)]  # NaN has its own test
    return torch.cat([x, -x])


def _toward_zero(rn_bits: torch.Tensor, rn_value: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The round-toward-zero result from the round-to-nearest one: one step toward zero where rounding
    went up in magnitude (bit patterns of one sign are ordered by magnitude)."""
    up = rn_value.double().abs() > x.double().abs()
    return torch.where(up, rn_bits - 1, rn_bits)


def test_float_to_half_and_bfloat16_bit_exact(elementwise):
    x = _inputs()
    n = x.numel()
    outs = [torch.zeros(n, dtype=torch.int16) for _ in range(4)]
    elementwise.to_16bit[(n + 255) // 256, 256](x, *outs, n)
    h_rn, h_rz, b_rn, b_rz = (_bits(o) for o in outs)

    th, tb = x.to(torch.float16), x.to(torch.bfloat16)
    assert torch.equal(h_rn, _bits(th))
    assert torch.equal(b_rn, _bits(tb))
    assert torch.equal(h_rz, _toward_zero(_bits(th), th, x))
    assert torch.equal(b_rz, _toward_zero(_bits(tb), tb, x))


def test_nan_converts_to_cuda_canonical_nan(elementwise):
    x = torch.tensor([float("nan"), -float("nan")]).repeat(2)
    x[2:] = torch.tensor([0x7F800001, 0xFFC01234], dtype=torch.int64).to(torch.int32).view(torch.float32)
    outs = [torch.zeros(4, dtype=torch.int16) for _ in range(4)]
    elementwise.to_16bit[1, 32](x, *outs, 4)
    for o in outs:  # CUDA's conversions return the canonical NaN 0x7fff, whatever the payload
        assert (_bits(o) == 0x7FFF).all()


def test_half_and_bfloat16_to_float_exact_for_every_bit_pattern(elementwise):
    bits = torch.arange(0, 1 << 16, dtype=torch.int32).to(torch.int16)
    h, b = bits.view(torch.float16), bits.view(torch.bfloat16)
    hf, bf = torch.zeros(1 << 16), torch.zeros(1 << 16)
    elementwise.from_16bit[256, 256](h, b, hf, bf, 1 << 16)
    finite = torch.isfinite(h.float()) | torch.isinf(h.float())
    assert torch.equal(hf[finite], h.float()[finite]) and torch.isnan(hf[~finite]).all()
    finite = ~torch.isnan(b.float())
    assert torch.equal(bf[finite], b.float()[finite]) and torch.isnan(bf[~finite]).all()


def test_half_arithmetic_rounds_once(elementwise):
    g = torch.Generator().manual_seed(1)
    a = (torch.randn(5000, generator=g) * 100).to(torch.float16)
    b = (torch.randn(5000, generator=g) * 100).to(torch.float16)
    s, p = torch.zeros(5000, dtype=torch.float16), torch.zeros(5000, dtype=torch.float16)
    bs = torch.zeros(5000, dtype=torch.bfloat16)
    elementwise.half_math[20, 256](a, b, s, p, bs, 5000)
    # torch computes float16 ops in float and rounds once too (exact for +, -, *: 11-bit operands).
    assert torch.equal(_bits(s), _bits(a + b))
    assert torch.equal(_bits(p), _bits(a * b))
    assert torch.equal(_bits(bs), _bits(a.to(torch.bfloat16) + b.to(torch.bfloat16)))
