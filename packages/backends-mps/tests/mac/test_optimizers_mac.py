"""The optimizer kernels on a real Apple GPU, against the reference on the CPU.

Apple's compiler may fuse a multiply and an add into one rounding, and the order of its SIMD-group sums
is unspecified, so here the emulator's bit-exact comparisons become tolerances: states within a few
float32 ulps (rtol 1e-5), 8-bit absmax likewise, and a state code may move to a neighbouring code when
its value lands within an ulp of a midpoint (allowed for under 1% of the codes).
"""

from __future__ import annotations

import pytest
import torch

from bitsandbytes import functional
from bitsandbytes._ops import OPTIMIZER_BLOCKSIZE, TWO_STATE_OPTIMIZERS
from bitsandbytes._reference import REFERENCE

pytestmark = pytest.mark.skipif(
    not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()),
    reason="needs an Apple Silicon GPU (MPS)",
)

NAMES = ("adam", "momentum", "rmsprop", "lion", "adagrad", "ademamix", "lamb", "lars")
HP = (0.9, 0.995, 0.999, 5.0, 1e-6)  # beta1, beta2, beta3, alpha, eps


def _ops():
    from bitsandbytes_mps import library
    from bitsandbytes_mps.ops import optimizers

    st = library.load()
    assert st.sources.get("optimizers.metal") in ("metallib", "source"), st.as_dict()
    return optimizers


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", NAMES)
def test_8bit_on_mps_matches_reference(name, dtype):
    ops = _ops()
    gen = torch.Generator().manual_seed(0)
    n = 40 * OPTIMIZER_BLOCKSIZE + 77
    ema = 2 if name == "ademamix" else 1
    two = name in TWO_STATE_OPTIMIZERS
    blocks = -(n // -OPTIMIZER_BLOCKSIZE)
    q1 = functional.create_dynamic_map(signed=True).float()
    q2 = functional.create_dynamic_map(signed=False).float()
    p = torch.randn(n, generator=gen).to(dtype)
    s1 = torch.zeros(ema * n, dtype=torch.uint8) + 127
    s2 = torch.zeros(n, dtype=torch.uint8) if two else None
    a1, a2 = torch.zeros(ema * blocks), torch.zeros(blocks) if two else None
    cpu = [p, s1, s2, a1, a2]
    dev = [t.to("mps") if t is not None else None for t in cpu]
    cpu = [t.clone() if t is not None else None for t in cpu]
    for step in (1, 2, 3):
        g = torch.randn(n, generator=gen).to(dtype)
        for fn, (pp, ss1, ss2, aa1, aa2), gg, qq1, qq2 in (
            (REFERENCE["optimizer_update_8bit_blockwise"], cpu, g, q1, q2),
            (ops.optimizer_update_8bit_blockwise, dev, g.to("mps"), q1.to("mps"), q2.to("mps")),
        ):
            fn(name, gg, pp, ss1, ss2, *HP, step, 1e-3, qq1, qq2 if two else None, aa1, aa2, 0.01, 1.0)
        for got, want in zip(dev, cpu, strict=True):
            if want is None:
                continue
            got = got.cpu()
            if want.dtype == torch.uint8:
                assert (got != want).float().mean().item() < 0.01
            else:
                torch.testing.assert_close(got.float(), want.float(), rtol=1e-3 if dtype != torch.float32 else 1e-5,
                                           atol=1e-5)  # fmt: skip
        for d, c in zip(dev, cpu, strict=True):  # restart both from the device's values
            if c is not None:
                c.copy_(d.cpu())


@pytest.mark.parametrize("max_unorm", [0.0, 0.05])
@pytest.mark.parametrize("name", NAMES)
def test_32bit_on_mps_matches_reference(name, max_unorm):
    ops = _ops()
    gen = torch.Generator().manual_seed(1)
    n = 100 * OPTIMIZER_BLOCKSIZE + 5
    ema = 2 if name == "ademamix" else 1
    p = torch.randn(n, generator=gen)
    s1 = torch.rand(ema * n, generator=gen) * 0.1
    s2 = torch.rand(n, generator=gen) * 0.01 if name in TWO_STATE_OPTIMIZERS else None
    cpu = [p, s1, s2, torch.tensor([2.0])]
    dev = [t.to("mps") if t is not None else None for t in cpu]
    for step in (1, 2):
        g = torch.randn(n, generator=gen)
        for fn, (pp, ss1, ss2, u), gg in ((REFERENCE["optimizer_update_32bit"], cpu, g),
                                          (ops.optimizer_update_32bit, dev, g.to("mps"))):  # fmt: skip
            fn(name, gg, pp, ss1, ss2, u, max_unorm, 1.5, *HP, 0.01, step, 1e-2, 0.8, False)
        for got, want in zip(dev, cpu, strict=True):
            if want is not None:
                torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-6)
                want.copy_(got.cpu())
