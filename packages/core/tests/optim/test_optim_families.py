"""Every optimizer family against its reference update rule, in 32-bit and 8-bit state.

32-bit state is compared with torch.optim where an equivalent exists (Adam, AdamW, SGD with momentum,
RMSprop, Adagrad) and otherwise with a textbook float64 form of the rule written here. 8-bit state is compared
with 32-bit state over the same steps: it may differ by the state's quantization error, no more.
"""

from __future__ import annotations

import math

import pytest
import torch
from optim_testlib import make_grads, run_steps

import bitsandbytes as bnb

SHAPE = (33, 20)  # 660 elements: three 256-blocks, the last one partial
STEPS = 4


def _run(factory, dtype=torch.float32, steps=STEPS, shape=SHAPE, seed=0):
    p0 = torch.randn(shape, generator=torch.Generator().manual_seed(seed + 100))
    p = torch.nn.Parameter(p0.clone().to(dtype))
    opt = factory([p])
    run_steps(opt, [p], [make_grads(shape, steps, seed, dtype)])
    return p0, p.detach(), opt


# (bnb 32-bit factory, torch factory)
TORCH_EQUIVALENTS = {
    "Adam": (
        lambda ps: bnb.optim.Adam32bit(ps, lr=1e-2, betas=(0.9, 0.99), eps=1e-8),
        lambda ps: torch.optim.Adam(ps, lr=1e-2, betas=(0.9, 0.99), eps=1e-8),
    ),
    "AdamW": (
        lambda ps: bnb.optim.AdamW32bit(ps, lr=1e-2, weight_decay=0.1),
        lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1),
    ),
    "SGD": (
        lambda ps: bnb.optim.SGD32bit(ps, lr=1e-2, momentum=0.9, weight_decay=0.01),
        lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9, weight_decay=0.01),
    ),
    "RMSprop": (
        lambda ps: bnb.optim.RMSprop32bit(ps, lr=1e-3, alpha=0.9, weight_decay=0.01),
        lambda ps: torch.optim.RMSprop(ps, lr=1e-3, alpha=0.9, eps=1e-8, weight_decay=0.01),
    ),
    "Adagrad": (
        lambda ps: bnb.optim.Adagrad32bit(ps, lr=1e-2),
        lambda ps: torch.optim.Adagrad(ps, lr=1e-2, eps=1e-10),
    ),
}


@pytest.mark.parametrize("name", TORCH_EQUIVALENTS)
def test_32bit_matches_torch_optim(name):
    ours, theirs = TORCH_EQUIVALENTS[name]
    p0, p, opt = _run(ours)
    _, expected, _ = _run(theirs)
    assert opt.state[opt.param_groups[0]["params"][0]]["state1"].dtype == torch.float32
    assert not torch.equal(p, p0)
    # fp32 arithmetic in a different order: a few ulps of the parameter.
    torch.testing.assert_close(p, expected, rtol=1e-5, atol=1e-6)


def _textbook(name, p, grads, hp):
    """float64 forms of the rules torch.optim does not have (weight decay 0)."""
    p = p.double().clone()
    m = torch.zeros_like(p)
    v = torch.zeros_like(p)
    m2 = torch.zeros_like(p)
    for t, g in enumerate(grads, start=1):
        g = g.double()
        if name == "Lion":
            b1, b2 = hp["betas"]
            p -= hp["lr"] * torch.sign(b1 * m + (1 - b1) * g)
            m = b2 * m + (1 - b2) * g
        elif name in ("LAMB", "AdEMAMix"):
            b1, b2 = hp["betas"][:2]
            m = b1 * m + (1 - b1) * g
            v = b2 * v + (1 - b2) * g * g
            if name == "LAMB":
                update = (m / (1 - b1**t)) / ((v / (1 - b2**t)).sqrt() + hp["eps"])
                limit = hp["max_unorm"] * p.norm()
                scale = min(1.0, float(limit / update.norm()))
            else:
                b3, alpha = hp["betas"][2], hp["alpha"]
                m2 = b3 * m2 + (1 - b3) * g
                update = (m / (1 - b1**t) + alpha * m2) / (v.sqrt() / math.sqrt(1 - b2**t) + hp["eps"])
                scale = 1.0
            p -= hp["lr"] * scale * update
        elif name == "LARS":
            m = g if t == 1 else hp["momentum"] * m + g
            limit = hp["max_unorm"] * p.norm()
            scale = min(1.0, float(limit / m.norm()))
            p -= hp["lr"] * scale * m
    return p.float()


TEXTBOOK = {
    "Lion": (bnb.optim.Lion32bit, dict(lr=1e-2, betas=(0.9, 0.99))),
    # A small max_unorm so that the trust ratio really limits the update.
    "LAMB": (bnb.optim.LAMB32bit, dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, max_unorm=0.005)),
    "LARS": (bnb.optim.LARS32bit, dict(lr=1e-2, momentum=0.9, max_unorm=0.001)),
    "AdEMAMix": (bnb.optim.AdEMAMix32bit, dict(lr=1e-2, betas=(0.9, 0.99, 0.999), alpha=5.0, eps=1e-8)),
}


@pytest.mark.parametrize("name", TEXTBOOK)
def test_32bit_matches_textbook_rule(name):
    cls, hp = TEXTBOOK[name]
    kwargs = {**hp, "weight_decay": 0.0}
    p0, p, _ = _run(lambda ps: cls(ps, **kwargs))
    expected = _textbook(name, p0, make_grads(SHAPE, STEPS), hp)
    assert not torch.equal(p, p0)
    # LARS's kernel adds eps to its trust-ratio limit; the rest differs by fp32 rounding only.
    torch.testing.assert_close(p, expected, rtol=1e-4, atol=1e-5)


def test_lars_matches_pytorch_lars():
    _, p, _ = _run(lambda ps: bnb.optim.LARS32bit(ps, lr=1e-2, momentum=0.9, max_unorm=0.001))
    _, expected, _ = _run(lambda ps: bnb.optim.PytorchLARS(ps, lr=1e-2, momentum=0.9, max_unorm=0.001))
    torch.testing.assert_close(p, expected, rtol=1e-4, atol=1e-5)


def test_ademamix_schedules_alpha_and_beta3():
    hp = dict(lr=1e-2, betas=(0.9, 0.99, 0.999), alpha=5.0, eps=1e-8, weight_decay=0.0)
    _, plain, _ = _run(lambda ps: bnb.optim.AdEMAMix32bit(ps, **hp))
    p0, scheduled, _ = _run(lambda ps: bnb.optim.AdEMAMix32bit(ps, **hp, t_alpha=100, t_beta3=100))
    assert not torch.allclose(plain, scheduled)
    # Replay with the scheduled (beta3, alpha) of each step through the functional API.
    p = p0.clone()
    state1 = torch.zeros((2, *SHAPE))
    state2 = torch.zeros(SHAPE)
    b1, b2, b3 = hp["betas"]
    for t, g in enumerate(make_grads(SHAPE, STEPS), start=1):
        alpha_t = min(t * hp["alpha"] / 100, hp["alpha"])
        s = t / 100
        ln1, ln3 = math.log(b1), math.log(b3)
        beta3_t = min(math.exp(ln1 * ln3 / ((1 - s) * ln3 + s * ln1)), b3)
        bnb.functional.optimizer_update_32bit(
            "ademamix", g, p, state1, b1, hp["eps"], t, hp["lr"], state2, b2, beta3_t, alpha_t
        )
    torch.testing.assert_close(scheduled, p, rtol=0, atol=0)


# Every class that can hold 8-bit state, with hyperparameters that move p visibly in a few steps.
EIGHT_BIT = {
    "Adam": (bnb.optim.Adam8bit, bnb.optim.Adam32bit, dict(lr=1e-2)),
    "AdamW": (bnb.optim.AdamW8bit, bnb.optim.AdamW32bit, dict(lr=1e-2)),
    "AdEMAMix": (bnb.optim.AdEMAMix8bit, bnb.optim.AdEMAMix32bit, dict(lr=1e-2)),
    "LAMB": (bnb.optim.LAMB8bit, bnb.optim.LAMB32bit, dict(lr=1e-2, max_unorm=1.0)),
    "LARS": (bnb.optim.LARS8bit, bnb.optim.LARS32bit, dict(lr=1e-2, momentum=0.9, max_unorm=0.0)),
    "SGD": (bnb.optim.SGD8bit, bnb.optim.SGD32bit, dict(lr=1e-2, momentum=0.9)),
    "Lion": (bnb.optim.Lion8bit, bnb.optim.Lion32bit, dict(lr=1e-3)),
    "RMSprop": (bnb.optim.RMSprop8bit, bnb.optim.RMSprop32bit, dict(lr=1e-3)),
    "Adagrad": (bnb.optim.Adagrad8bit, bnb.optim.Adagrad32bit, dict(lr=1e-2)),
}


@pytest.mark.parametrize("name", EIGHT_BIT)
def test_8bit_state_tracks_32bit_state(name):
    cls8, cls32, hp = EIGHT_BIT[name]
    # min_8bit_size=0 so that a tiny parameter gets 8-bit state. The 8-bit kernels have no trust ratio, so LARS
    # runs without one and LAMB with one too loose to bind (the 32-bit tests cover it).
    p0, p8, opt8 = _run(lambda ps: cls8(ps, min_8bit_size=0, **hp))
    _, p32, _ = _run(lambda ps: cls32(ps, min_8bit_size=0, **hp))
    state = next(iter(opt8.state.values()))
    assert state["state1"].dtype == torch.uint8
    assert state["qmap1"].shape == (256,) and state["absmax1"].dtype == torch.float32
    d8, d32 = p8 - p0, p32 - p0
    assert d32.norm() > 0
    # The dynamic 8-bit map keeps each state within ~1% of its block's absmax; a few steps stay close.
    assert (d8 - d32).norm() / d32.norm() < 0.05, name


def test_8bit_variants_of_the_flexible_classes():
    # optim_bits=8 on the generic class is the same optimizer as the fixed 8-bit class.
    _, a, _ = _run(lambda ps: bnb.optim.Adam(ps, lr=1e-2, optim_bits=8, min_8bit_size=0))
    _, b, _ = _run(lambda ps: bnb.optim.Adam8bit(ps, lr=1e-2, min_8bit_size=0))
    assert torch.equal(a, b)
    _, c, _ = _run(lambda ps: bnb.optim.Lion(ps, optim_bits=8, min_8bit_size=0))
    _, d, _ = _run(lambda ps: bnb.optim.Lion8bit(ps, min_8bit_size=0))
    assert torch.equal(c, d)


@pytest.mark.parametrize("bits", [32, 8])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_params(dtype, bits):
    p0, p, opt = _run(lambda ps: bnb.optim.Adam(ps, lr=1e-2, optim_bits=bits, min_8bit_size=0), dtype=dtype)
    _, ref, _ = _run(lambda ps: bnb.optim.Adam(ps, lr=1e-2, optim_bits=bits, min_8bit_size=0))
    assert p.dtype == dtype
    state = next(iter(opt.state.values()))
    # State stays fp32 (or uint8 codes) whatever the parameter's dtype.
    assert state["state1"].dtype == (torch.float32 if bits == 32 else torch.uint8)
    # Differences: half-precision rounding of p0 and of each grad and update (a few ulps of |p| ~ 3).
    tol = 4e-2 if dtype == torch.bfloat16 else 5e-3
    torch.testing.assert_close(p.float(), ref, rtol=0, atol=tol)
    assert not torch.equal(p.float(), p0.to(dtype).float())


def test_defaults_are_upstreams():
    p = [torch.nn.Parameter(torch.zeros(4))]
    checks = {
        bnb.optim.Adam: dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0),
        bnb.optim.AdamW: dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2),
        bnb.optim.AdEMAMix: dict(lr=1e-3, betas=(0.9, 0.999, 0.9999), alpha=5.0, eps=1e-8, weight_decay=1e-2),
        bnb.optim.Lion: dict(lr=1e-4, betas=(0.9, 0.99), eps=0.0, weight_decay=0),
        bnb.optim.RMSprop: dict(lr=1e-2, betas=(0.99, 0), eps=1e-8),
        bnb.optim.Adagrad: dict(lr=1e-2, eps=1e-10),
        bnb.optim.LAMB: dict(lr=1e-3, betas=(0.9, 0.999)),
    }
    for cls, expected in checks.items():
        group = cls(p).param_groups[0]
        assert {k: group[k] for k in expected} == expected, cls.__name__
    assert bnb.optim.LAMB(p).args.max_unorm == 1.0
    assert bnb.optim.LARS(p, lr=0.1, momentum=0.9).args.max_unorm == 0.02
    assert bnb.optim.Adam(p).args.min_8bit_size == 4096
    assert bnb.optim.Adam8bit(p).args.optim_bits == 8
    assert bnb.optim.PagedAdamW8bit(p).is_paged and not bnb.optim.AdamW8bit(p).is_paged
    # transformers' Trainer finds "bitsandbytes" in the class path.
    assert "bitsandbytes" in str(bnb.optim.AdamW)


def test_percentile_clipping_and_block_wise_are_accepted():
    # 0.49 keywords: block_wise has no effect (8-bit is always blockwise); percentile_clipping clips.
    p0 = torch.randn(SHAPE)
    # Growing gradient norms, so that each exceeds the 5th percentile of the history and is clipped.
    grads = [g * (1 + 2 * t) for t, g in enumerate(make_grads(SHAPE, STEPS))]

    def run(**kwargs):
        p = torch.nn.Parameter(p0.clone())
        opt = bnb.optim.SGD([p], lr=1e-2, momentum=0.9, **kwargs)
        run_steps(opt, [p], [grads])
        return p.detach(), opt

    default, _ = run()
    assert torch.equal(run(block_wise=False)[0], default)
    clipped, opt = run(percentile_clipping=5)
    assert next(iter(opt.state.values()))["gnorm_vec"].shape == (100,)
    assert not torch.allclose(clipped, default)
    # Replay: scale each gradient by percentile_clipping's factor, then the plain momentum step.
    p, m = p0.clone(), torch.zeros(SHAPE)
    gnorm_vec = torch.zeros(100)
    for t, g in enumerate(grads, start=1):
        scale = bnb.functional.percentile_clipping(g, gnorm_vec, t, 5)[2]
        bnb.functional.optimizer_update_32bit("momentum", g, p, m, 0.9, 0.0, t, 1e-2, gnorm_scale=scale)
    torch.testing.assert_close(clipped, p, rtol=0, atol=0)


@pytest.mark.parametrize("bits", [32, 8])
def test_skip_zeros_leaves_zero_gradient_elements_alone(bits):
    from bitsandbytes.optim.optimizer import Optimizer2State

    p = torch.nn.Parameter(torch.randn(SHAPE))
    opt = Optimizer2State("adam", [p], lr=1e-2, optim_bits=bits, min_8bit_size=0, skip_zeros=True)
    p.grad = torch.randn(SHAPE)
    opt.step()
    before = p.detach().clone()
    mask = torch.rand(SHAPE, generator=torch.Generator().manual_seed(3)) < 0.3
    p.grad = torch.randn(SHAPE).masked_fill(mask, 0.0)
    opt.step()
    # Without skip_zeros those elements would still move: their momentum from step 1 is not zero.
    assert torch.equal(p[mask], before[mask])
    assert not torch.equal(p[~mask], before[~mask])


def test_lr_scheduler_drives_the_learning_rate():
    p = torch.nn.Parameter(torch.ones(10))
    opt = bnb.optim.SGD([p], lr=0.1, momentum=0.5)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.0 if step >= 1 else 1.0)
    p.grad = torch.ones(10)
    opt.step()
    sched.step()  # lr is now 0
    moved = p.detach().clone()
    opt.step()
    assert torch.allclose(moved, torch.full((10,), 0.9)) and torch.equal(p.detach(), moved)
