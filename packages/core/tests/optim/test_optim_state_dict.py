"""state_dict / load_state_dict: upstream's layout, and a save-load-continue that is identical to never stopping."""

from __future__ import annotations

import io

import pytest
import torch
from optim_testlib import make_grads, run_steps

import bitsandbytes as bnb

WRAP = "__bnb_optimizer_quant_state__"
SHAPES = [(33, 20), (7,)]  # one parameter with 8-bit state (min_8bit_size=100), one that stays 32-bit

FACTORIES = {
    "Adam8bit": lambda ps: bnb.optim.Adam8bit(ps, lr=1e-2, min_8bit_size=100),
    "AdamW32bit": lambda ps: bnb.optim.AdamW32bit(ps, lr=1e-2),
    "AdEMAMix8bit": lambda ps: bnb.optim.AdEMAMix8bit(ps, lr=1e-2, min_8bit_size=100, t_alpha=10, t_beta3=10),
    "Lion8bit": lambda ps: bnb.optim.Lion8bit(ps, lr=1e-3, min_8bit_size=100),
    "LAMB32bit": lambda ps: bnb.optim.LAMB32bit(ps, lr=1e-2),  # unorm_vec in the state
    "SGD8bit_clipped": lambda ps: bnb.optim.SGD8bit(
        ps, lr=1e-2, momentum=0.9, min_8bit_size=100, percentile_clipping=5
    ),
}


def _params(seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in SHAPES]


def _grads(steps, seed):
    return [make_grads(s, steps, seed + i) for i, s in enumerate(SHAPES)]


def _tail(grads, start):
    return [g[start:] for g in grads]


@pytest.mark.parametrize("name", FACTORIES)
def test_save_load_continue_is_identical_to_uninterrupted(name):
    factory = FACTORIES[name]
    grads = _grads(5, seed=1)

    straight = _params()
    opt = factory(straight)
    run_steps(opt, straight, grads)

    first = _params()
    opt1 = factory(first)
    run_steps(opt1, first, [g[:2] for g in grads])
    buffer = io.BytesIO()
    torch.save(opt1.state_dict(), buffer)

    # A fresh process would rebuild the model and optimizer, then load both states.
    resumed = [torch.nn.Parameter(p.detach().clone()) for p in first]
    opt2 = factory(resumed)
    buffer.seek(0)
    opt2.load_state_dict(torch.load(buffer, weights_only=False))
    run_steps(opt2, resumed, _tail(grads, 2))

    for a, b in zip(resumed, straight, strict=True):
        assert torch.equal(a, b)
    for a, b in zip(opt2.state.values(), opt.state.values(), strict=True):
        assert a.keys() == b.keys()
        for k in a:
            assert torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k], k


def test_layout_is_upstreams():
    ps = _params()
    opt = bnb.optim.Adam8bit(ps, min_8bit_size=100)
    run_steps(opt, ps, _grads(1, seed=0))
    sd = opt.state_dict()
    assert sd["param_groups"] == [
        {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0, "alpha": 0.0, "t_alpha": None,
         "t_beta3": None, "params": [0, 1]}
    ]  # fmt: skip
    big, small = sd["state"][0], sd["state"][1]
    # Only `step` stays at the top; every tensor is wrapped (FSDP would try to gather it otherwise).
    assert set(big) == {"step", WRAP} and big["step"] == 1 and isinstance(big["step"], int)
    quant = big[WRAP]
    assert set(quant) == {"state1", "state2", "qmap1", "qmap2", "absmax1", "absmax2"}
    assert quant["state1"].dtype == quant["state2"].dtype == torch.uint8
    assert quant["state1"].shape == SHAPES[0]
    assert quant["absmax1"].shape == quant["absmax2"].shape == (3,)  # 660 values in blocks of 256
    torch.testing.assert_close(quant["qmap1"], bnb.functional.create_dynamic_map(signed=True), rtol=0, atol=0)
    torch.testing.assert_close(quant["qmap2"], bnb.functional.create_dynamic_map(signed=False), rtol=0, atol=0)
    # Under min_8bit_size: 32-bit state.
    assert set(small[WRAP]) == {"state1", "state2"} and small[WRAP]["state1"].dtype == torch.float32
    # state_dict() is a copy of the layout: the optimizer's own state is not wrapped.
    assert "state1" in opt.state[ps[0]]


def test_ademamix_stacks_its_two_emas():
    ps = _params()
    opt = bnb.optim.AdEMAMix8bit(ps, min_8bit_size=100)
    run_steps(opt, ps, _grads(1, seed=0))
    quant = opt.state_dict()["state"][0][WRAP]
    assert quant["state1"].shape == (2, *SHAPES[0]) and quant["absmax1"].shape == (2, 3)
    assert quant["state2"].shape == SHAPES[0] and quant["absmax2"].shape == (3,)
    assert opt.state_dict()["state"][1][WRAP]["state1"].shape == (2, *SHAPES[1])


def test_unwrapped_state_dict_also_loads():
    # A state dict saved without the wrapper key (a plain torch layout) loads the same way.
    ps = _params()
    opt = bnb.optim.Adam8bit(ps, min_8bit_size=100)
    run_steps(opt, ps, _grads(2, seed=0))
    sd = opt.state_dict()
    flat = {**sd, "state": {k: {"step": v["step"], **v[WRAP]} for k, v in sd["state"].items()}}
    opt2 = bnb.optim.Adam8bit(_params(), min_8bit_size=100)
    opt2.load_state_dict(flat)
    for a, b in zip(opt2.state.values(), opt.state.values(), strict=True):
        assert all(torch.equal(a[k], b[k]) for k in b if k != "step") and a["step"] == 2


def test_load_keeps_state_dtypes_and_casts_other_tensors():
    ps = [torch.nn.Parameter(torch.randn(300, dtype=torch.bfloat16))]
    opt = bnb.optim.Adam8bit(ps, min_8bit_size=0)
    run_steps(opt, ps, [make_grads((300,), 1, 0, torch.bfloat16)])
    sd = opt.state_dict()
    sd["state"][0]["extra"] = torch.ones(2, dtype=torch.float64)  # an entry some other tool added
    opt2 = bnb.optim.Adam8bit([torch.nn.Parameter(ps[0].detach().clone())], min_8bit_size=0)
    opt2.load_state_dict(sd)
    state = next(iter(opt2.state.values()))
    assert state["state1"].dtype == torch.uint8 and state["absmax1"].dtype == torch.float32
    assert state["qmap1"].dtype == torch.float32
    assert state["extra"].dtype == torch.bfloat16  # cast to the parameter's dtype, as torch does
