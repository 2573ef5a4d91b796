"""On a real GPU: the optimizer kernels against the reference run on the same GPU, and managed memory.

torch's CUDA sqrt and division are correctly rounded and it never fuses separate ops, so the reference on
the GPU computes exactly the float32 operations our kernels do: the states, 8-bit codes and absmax must be
identical, and p too (checked with the emulated tests' tolerance all the same). Only the max_unorm norm
is a sum in another order (rtol 1e-5). Paged memory: get_paged gives managed memory the GPU and host can
both use, prefetching it either way keeps the values.
"""

from __future__ import annotations

import pytest
import torch

import bitsandbytes  # noqa: F401  (loads the cuda backend: ops and paged memory)
from bitsandbytes import functional
from bitsandbytes._functional import paged as core_paged
from bitsandbytes._ops import OPTIMIZER_BLOCKSIZE, TWO_STATE_OPTIMIZERS
from bitsandbytes._reference import REFERENCE
from bitsandbytes_cuda.ops import optimizers as ops

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")

NAMES = ("adam", "momentum", "rmsprop", "lion", "adagrad", "ademamix", "lamb", "lars")
HP = (0.9, 0.995, 0.999, 5.0, 1e-6)  # beta1, beta2, beta3, alpha, eps
REF8 = REFERENCE["optimizer_update_8bit_blockwise"]
REF32 = REFERENCE["optimizer_update_32bit"]


def _clone(ts):
    return [t.clone() if t is not None else None for t in ts]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", NAMES)
def test_8bit_on_gpu_is_the_reference_on_gpu(name, dtype):
    n = 1000 * OPTIMIZER_BLOCKSIZE + 77  # more blocks than the grid: the stride loop runs
    gen = torch.Generator().manual_seed(1)
    ema, two = (2 if name == "ademamix" else 1), name in TWO_STATE_OPTIMIZERS
    blocks = -(n // -OPTIMIZER_BLOCKSIZE)
    qmap1 = functional.create_dynamic_map(signed=True).float().cuda()
    qmap2 = functional.create_dynamic_map(signed=False).float().cuda()
    codes = torch.randint(0, 256, (ema * n,), dtype=torch.uint8, generator=gen)
    if name in ("rmsprop", "adagrad"):  # a second moment: codes of non-negative map values only
        nonneg = torch.nonzero(qmap1.cpu() >= 0).flatten()
        codes = nonneg[codes.long() % nonneg.numel()].to(torch.uint8)
    st = [
        codes,
        torch.randint(0, 256, (n,), dtype=torch.uint8, generator=gen) if two else None,  # qmap2 is unsigned
        torch.rand(ema * blocks, generator=gen) * 0.1,
        torch.rand(blocks, generator=gen) * 0.01 if two else None,
    ]
    st = [t.cuda() if t is not None else None for t in st]
    p = torch.randn(n, generator=gen).to(dtype).cuda()
    ref_p, ref = p.clone(), _clone(st)
    for step in (1, 2):
        g = torch.randn(n, generator=gen).to(dtype).cuda()
        g[::11] = 0
        for fn, pp, ss in ((ops.optimizer_update_8bit_blockwise, p, st), (REF8, ref_p, ref)):
            fn(name, g, pp, ss[0], ss[1], *HP, step, 1e-2, qmap1, qmap2 if two else None, ss[2], ss[3], 0.01, 0.8,
               step == 2)  # fmt: skip
        for got, want in zip(st, ref, strict=True):
            if want is not None:
                assert torch.equal(got, want), f"{name} {dtype} step {step}"
        if dtype == torch.float32:
            torch.testing.assert_close(p, ref_p, rtol=1e-5, atol=1e-6)
        else:  # a last-bit fp32 difference may still flip a 16-bit rounding: one ulp of the dtype
            torch.testing.assert_close(p, ref_p)
        ref_p.copy_(p)


@pytest.mark.parametrize("name", NAMES)
def test_32bit_on_gpu_is_the_reference_on_gpu(name):
    n = 3000 * 256 + 5
    gen = torch.Generator().manual_seed(2)
    ema = 2 if name == "ademamix" else 1
    st = [torch.rand(ema * n, generator=gen) * 0.1, torch.rand(n, generator=gen) * 0.01, torch.tensor([2.0])]
    st = [t.cuda() for t in st]
    if name not in TWO_STATE_OPTIMIZERS:
        st[1] = None
    p = torch.randn(n, generator=gen).cuda()
    ref_p, ref = p.clone(), _clone(st)
    for step, max_unorm in ((1, 0.0), (2, 0.02)):
        g = torch.randn(n, generator=gen).cuda()
        for fn, pp, ss in ((ops.optimizer_update_32bit, p, st), (REF32, ref_p, ref)):
            fn(name, g, pp, ss[0], ss[1], ss[2], max_unorm, 1.5, *HP, 0.01, step, 1e-2, 0.8, False)
        torch.testing.assert_close(st[2], ref[2], rtol=1e-5, atol=0)
        torch.testing.assert_close(p, ref_p, rtol=1e-5, atol=1e-6)
        for got, want in zip(st[:2], ref[:2], strict=True):
            if want is not None:
                assert torch.equal(got, want), f"{name} step {step}"
        ref_p.copy_(p)
        ref[2].copy_(st[2])


def test_paged_memory_is_managed_and_survives_prefetching():
    assert core_paged.has_paged_memory("cuda")
    t = functional.get_paged(1000, 3, dtype=torch.bfloat16, device="cuda")
    assert t.is_paged and t.device.type == "cuda" and t.shape == (1000, 3) and not t.any()
    t.copy_(torch.arange(3000, dtype=torch.bfloat16).view(1000, 3))
    functional.prefetch_tensor(t, to_cpu=True)
    functional.prefetch_tensor(t)
    torch.cuda.synchronize()
    assert torch.equal(t.cpu(), torch.arange(3000, dtype=torch.bfloat16).view(1000, 3))
