"""Paged optimizers without managed memory (behave as unpaged, warn once) and the paged-memory hook."""

from __future__ import annotations

import warnings

import pytest
import torch
from optim_testlib import make_grads, run_steps

import bitsandbytes as bnb
import bitsandbytes.functional as F
from bitsandbytes._functional import paged


def _run(cls, shape=(33, 20), steps=3, **kwargs):
    p = torch.nn.Parameter(torch.randn(shape, generator=torch.Generator().manual_seed(0)))
    opt = cls([p], **kwargs)
    run_steps(opt, [p], [make_grads(shape, steps)])
    return p.detach(), opt


@pytest.mark.parametrize(
    ("paged_cls", "plain_cls"),
    [
        (bnb.optim.PagedAdamW8bit, bnb.optim.AdamW8bit),
        (bnb.optim.PagedAdam32bit, bnb.optim.Adam32bit),
        (bnb.optim.PagedLion8bit, bnb.optim.Lion8bit),
        (bnb.optim.PagedAdEMAMix8bit, bnb.optim.AdEMAMix8bit),
    ],
)
def test_paged_without_managed_memory_is_unpaged_and_warns_once(paged_cls, plain_cls):
    with pytest.warns(UserWarning, match=r"device 'cpu' has no paged \(managed\) memory") as record:
        p, opt = _run(paged_cls, min_8bit_size=0)
    assert len([w for w in record if "paged" in str(w.message)]) == 1  # 3 steps, one warning
    assert opt.is_paged and not any(getattr(t, "is_paged", False) for t in next(iter(opt.state.values())).values())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        expected, _ = _run(plain_cls, min_8bit_size=0)
    assert torch.equal(p, expected)


def test_is_paged_keyword_of_the_flexible_classes():
    with pytest.warns(UserWarning, match="unpaged"):
        _, opt = _run(bnb.optim.AdamW, optim_bits=8, is_paged=True)
    assert opt.is_paged


def test_get_paged_fallback_and_prefetch_are_harmless():
    t = F.get_paged(3, 4, dtype=torch.float16, device="cpu")
    assert t.shape == (3, 4) and t.dtype == torch.float16 and not t.any()
    assert t.is_paged is False and t.page_deviceid is None
    F.prefetch_tensor(t)  # nothing to migrate
    F.prefetch_tensor(torch.zeros(2), to_cpu=True)
    mng = F.GlobalPageManager.get_instance()
    assert F.GlobalPageManager.get_instance() is mng
    mng.prefetch_all()
    with pytest.raises(ValueError, match="shape"):
        F.get_paged(-1, dtype=torch.float32, device="cpu")
    with pytest.raises(RuntimeError, match="get_instance"):
        F.GlobalPageManager()


def test_a_backend_can_supply_paged_memory():
    # A stand-in for a backend with managed memory: records what the paged optimizer asks of it.
    allocated, prefetched = [], []

    def allocate(shape, dtype, device):
        allocated.append((shape, dtype))
        return torch.zeros(shape, dtype=dtype, device=device)

    paged.register_paged_memory("cpu", allocate, lambda t, device: prefetched.append((t.shape, device)))
    mng = F.GlobalPageManager.get_instance()
    before = len(mng.paged_tensors)
    try:
        assert paged.has_paged_memory("cpu")
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no "unpaged" warning now
            big, opt = _run(bnb.optim.PagedAdam8bit, shape=(400, 256), steps=2)  # >= 100k elements: paged
            _, small = _run(bnb.optim.PagedAdam8bit, shape=(10, 10), steps=1, min_8bit_size=0)  # too small
        state = opt.state[opt.param_groups[0]["params"][0]]
        assert state["state1"].is_paged and state["state2"].is_paged
        assert not getattr(next(iter(small.state.values()))["state1"], "is_paged", False)
        assert allocated == [((400, 256), torch.uint8), ((400, 256), torch.uint8)]
        assert len(mng.paged_tensors) == before + 2
        assert prefetched == [((400, 256), torch.device("cpu"))] * 4  # two states, two steps
        expected, _ = _run(bnb.optim.Adam8bit, shape=(400, 256), steps=2)
        assert torch.equal(big, expected)
    finally:
        del paged._PAGED_MEMORY["cpu"]
        del mng.paged_tensors[before:]
    assert not paged.has_paged_memory("cpu")


def test_paged_names_are_in_the_functional_facade():
    for name in ("get_paged", "prefetch_tensor", "GlobalPageManager"):
        assert name in F.__all__ and callable(getattr(F, name))
