"""Optimizer steps (32-bit and 8-bit blockwise) on the reference kernels.

The 32-bit steps are compared with an independent float64 re-derivation of each update rule written below
(not with the kernel's code). The 8-bit steps are compared with the 32-bit ones, and their requantized state
is checked against properties that hold exactly (absmax, nearest codes).
"""

from __future__ import annotations

import math

import pytest
import torch

import bitsandbytes.functional as F

BLOCK = 256

# Hyperparameters per optimizer, close to upstream's defaults (lr raised so that few steps move p visibly).
HP = {
    "adam": dict(beta1=0.9, beta2=0.999, eps=1e-8, lr=1e-3),
    "lamb": dict(beta1=0.9, beta2=0.999, eps=1e-8, lr=1e-3),
    "ademamix": dict(beta1=0.9, beta2=0.999, beta3=0.9999, alpha=5.0, eps=1e-8, lr=1e-3),
    "momentum": dict(beta1=0.9, eps=1e-8, lr=1e-2),
    "lars": dict(beta1=0.9, eps=1e-8, lr=1e-2),
    "rmsprop": dict(beta1=0.99, eps=1e-8, lr=1e-3),
    "adagrad": dict(beta1=0.0, eps=1e-10, lr=1e-2),
    "lion": dict(beta1=0.9, beta2=0.99, eps=0.0, lr=1e-3),
}
NAMES = tuple(HP)
TWO_STATE = ("adam", "lamb", "ademamix")


# ---------------------------------------------------------------------------------------------------
# Independent float64 re-derivation of one step


def expected_step(name, g, p, states, step, weight_decay=0.0, gnorm_scale=1.0, max_unorm=0.0, unorm_prev=None):
    """Textbook form of each rule, in float64: returns (p, states, unorm). ``states`` as the 32-bit op stores them."""
    hp = HP[name]
    lr, eps, b1 = hp["lr"], hp["eps"], hp["beta1"]
    b2 = hp.get("beta2", 0.0)
    g = g.double() * gnorm_scale
    p = p.double()
    states = [s.double() for s in states]
    pnorm = p.norm().item()
    unorm = None
    if name in ("adam", "lamb"):
        m, v = states
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        u = (m / (1 - b1**step)) / ((v / (1 - b2**step)).sqrt() + eps)
        scale = 1.0
        if max_unorm > 0:
            unorm = u.square().sum().item()
            limit = max_unorm * pnorm
            scale = limit / math.sqrt(unorm) if math.sqrt(unorm) > limit else 1.0
        p = p * (1 - lr * weight_decay) - lr * scale * u
        return p, [m, v], unorm
    if name == "ademamix":
        m12, nu = states
        m1, m2 = m12.reshape(2, -1)
        m1 = b1 * m1 + (1 - b1) * g
        m2 = hp["beta3"] * m2 + (1 - hp["beta3"]) * g
        nu = b2 * nu + (1 - b2) * g * g
        u = (m1 / (1 - b1**step) + hp["alpha"] * m2) / ((nu / (1 - b2**step)).sqrt() + eps)
        p = p * (1 - lr * weight_decay) - lr * u
        return p, [torch.stack([m1, m2]), nu], None
    (s,) = states
    if name in ("momentum", "lars"):
        scale = 1.0
        if max_unorm > 0:  # trust ratio from the momentum without weight decay
            plain = g if step == 1 else b1 * s + g
            unorm = plain.square().sum().item()
            limit = max_unorm * pnorm + eps
            scale = limit / math.sqrt(unorm) if math.sqrt(unorm) > limit else 1.0
        gd = g + weight_decay * p
        s = gd if step == 1 else b1 * s + gd
        return p - lr * scale * s, [s], unorm
    if name == "rmsprop":
        gd = g + weight_decay * p
        s = b1 * s + (1 - b1) * gd * gd
        return p - lr * gd / (s.sqrt() + eps), [s], None
    if name == "adagrad":
        gd = g + weight_decay * p
        s = s + gd * gd
        return p - lr * gd / (s.sqrt() + eps), [s], None
    assert name == "lion"
    scale = 1.0
    if max_unorm > 0:
        limit = max_unorm * pnorm + eps
        scale = limit / math.sqrt(unorm_prev) if math.sqrt(unorm_prev) > limit else 1.0
    p = p * (1 - lr * weight_decay) - lr * scale * torch.sign(b1 * s + (1 - b1) * g)
    s = b2 * s + (1 - b2) * g
    if max_unorm > 0:
        unorm = (b2 * s + (1 - b2) * g).sum().item()
    return p, [s], unorm


# ---------------------------------------------------------------------------------------------------
# Helpers


def dynamic_map(signed: bool) -> torch.Tensor:
    """Upstream's dynamic 8-bit map: for each decade 1e-6..1e0, evenly spaced means of [0.1, 1] scaled into it.

    Signed: 2**i means per decade i=0..6, both signs; unsigned: 2**(i+1) means. Plus 0 and 1; sorted.
    """
    values = [0.0, 1.0]
    for i in range(7):
        count = 2**i if signed else 2 ** (i + 1)
        edges = torch.linspace(0.1, 1, count + 1, dtype=torch.float32)
        means = ((edges[:-1] + edges[1:]) / 2 * 10.0 ** (i - 6)).tolist()
        values += means + ([-m for m in means] if signed else [])
    assert len(values) == 256
    return torch.tensor(sorted(values), dtype=torch.float32)


QMAP1, QMAP2 = dynamic_map(True), dynamic_map(False)


def n_blocks(n: int) -> int:
    return -(n // -BLOCK)


def make_32bit(name, n, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    p = torch.randn(n, generator=gen).to(dtype)
    state1 = torch.zeros(2 * n if name == "ademamix" else n)
    if name == "ademamix":
        state1 = state1.view(2, n)
    state2 = torch.zeros(n) if name in TWO_STATE else None
    return p, state1, state2


def grads(n, steps, dtype=torch.float32, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(n, generator=gen).to(dtype) for _ in range(steps)]


def step_32bit(name, g, p, state1, state2, step, unorm_vec=None, **kw):
    hp = HP[name]
    F.optimizer_update_32bit(
        name, g, p, state1, hp["beta1"], hp["eps"], step, hp["lr"], state2, hp.get("beta2", 0.0),
        hp.get("beta3", 0.0), hp.get("alpha", 0.0), unorm_vec=unorm_vec, **kw,
    )  # fmt: skip


def make_8bit(name, n, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    p = torch.randn(n, generator=gen).to(dtype)
    k = 2 if name == "ademamix" else 1
    # All-zero codes with absmax 0 dequantize to an all-zero state (how upstream initialises it).
    state1 = torch.zeros((k, n) if k == 2 else (n,), dtype=torch.uint8)
    absmax1 = torch.zeros((k, n_blocks(n)) if k == 2 else (n_blocks(n),))
    state2 = torch.zeros(n, dtype=torch.uint8) if name in TWO_STATE else None
    absmax2 = torch.zeros(n_blocks(n)) if name in TWO_STATE else None
    return p, state1, state2, absmax1, absmax2


def step_8bit(name, g, p, state1, state2, absmax1, absmax2, step, **kw):
    hp = HP[name]
    F.optimizer_update_8bit_blockwise(
        name, g, p, state1, state2, hp["beta1"], hp.get("beta2", 0.0), hp.get("beta3", 0.0), hp.get("alpha", 0.0),
        hp["eps"], step, hp["lr"], QMAP1, QMAP2 if state2 is not None else None, absmax1, absmax2, **kw,
    )  # fmt: skip


def dequant(codes, absmax, qmap):
    n = codes.numel()
    vals = qmap[codes.reshape(-1).long()].double()
    pad = -n % BLOCK
    vals = torch.cat([vals, vals.new_zeros(pad)]).view(-1, BLOCK) * absmax.reshape(-1, 1).double()
    return vals.reshape(-1)[:n]


def dequant_states(name, state1, state2, absmax1, absmax2):
    """fp32 states as the 32-bit op stores them, from 8-bit ones."""
    if name == "ademamix":
        n = state2.numel()
        rows = [dequant(state1[k], absmax1[k], QMAP1) for k in range(2)]
        return torch.stack(rows).float().view(2, n), dequant(state2, absmax2, QMAP2).float()
    s1 = dequant(state1, absmax1, QMAP1).float()
    s2 = dequant(state2, absmax2, QMAP2).float() if state2 is not None else None
    return s1, s2


def close(actual, expected, rtol, atol):
    torch.testing.assert_close(actual.double(), expected.double(), rtol=rtol, atol=atol)


# ---------------------------------------------------------------------------------------------------
# 32-bit against float64


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("n", [1, 300, 1000])
def test_32bit_matches_float64_rule(name, n):
    p, state1, state2 = make_32bit(name, n)
    exp_p, exp_states = p.double(), [s.double() for s in (state1, state2) if s is not None]
    for step, g in enumerate(grads(n, 4), start=1):
        step_32bit(name, g, p, state1, state2, step)
        exp_p, exp_states, _ = expected_step(name, g, exp_p, exp_states, step)
        close(p, exp_p, rtol=1e-5, atol=1e-6)
        for got, exp in zip([s for s in (state1, state2) if s is not None], exp_states, strict=True):
            # fp32 cancellation (momentum sums) allows errors relative to the state's scale, not each element.
            close(got, exp.view(got.shape), rtol=1e-5, atol=1e-6 * exp.abs().max().item())


@pytest.mark.parametrize("name", NAMES)
def test_32bit_weight_decay_and_gnorm_scale(name):
    n, wd, scale = 500, 0.1, 0.37
    p, state1, state2 = make_32bit(name, n)
    exp_p, exp_states = p.double(), [s.double() for s in (state1, state2) if s is not None]
    for step, g in enumerate(grads(n, 3), start=1):
        step_32bit(name, g, p, state1, state2, step, weight_decay=wd, gnorm_scale=scale)
        exp_p, exp_states, _ = expected_step(name, g, exp_p, exp_states, step, weight_decay=wd, gnorm_scale=scale)
    close(p, exp_p, rtol=1e-5, atol=1e-6)
    # Weight decay must have had a visible effect (guards against it being ignored).
    p0, s1, s2 = make_32bit(name, n)
    for step, g in enumerate(grads(n, 3), start=1):
        step_32bit(name, g, p0, s1, s2, step, gnorm_scale=scale)
    assert (p - p0).abs().max() > 1e-5


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", ["adam", "momentum", "lion", "ademamix"])
def test_32bit_half_precision_params(name, dtype):
    n = 777
    p, state1, state2 = make_32bit(name, n, dtype)
    exp_p, exp_states = p.double(), [s.double() for s in (state1, state2) if s is not None]
    for step, g in enumerate(grads(n, 3, dtype), start=1):
        step_32bit(name, g, p, state1, state2, step)
        exp_p, exp_states, _ = expected_step(name, g, exp_p, exp_states, step)
        exp_p = exp_p.to(dtype).double()  # p is stored in its own dtype after every step
    assert p.dtype == dtype and state1.dtype == torch.float32
    # fp32 math rounded once to the parameter dtype: at most one unit in the last place apart.
    ulp = torch.finfo(dtype).eps * exp_p.abs().clamp_min(1e-3)
    assert ((p.double() - exp_p).abs() <= ulp + 1e-7).all()
    close(state1, exp_states[0].view(state1.shape), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("name", ["lamb", "lars"])
def test_32bit_max_unorm_clips_update(name):
    n = 600
    max_unorm = 0.05  # small enough that the trust ratio engages on every step
    p, state1, state2 = make_32bit(name, n)
    unorm_vec = torch.zeros(1)
    exp_p, exp_states = p.double(), [s.double() for s in (state1, state2) if s is not None]
    for step, g in enumerate(grads(n, 3), start=1):
        before = p.clone()
        step_32bit(name, g, p, state1, state2, step, unorm_vec=unorm_vec, max_unorm=max_unorm)
        exp_p, exp_states, exp_unorm = expected_step(name, g, exp_p, exp_states, step, max_unorm=max_unorm)
        close(p, exp_p, rtol=1e-5, atol=1e-7)
        close(unorm_vec, torch.tensor([exp_unorm]), rtol=1e-5, atol=0)
        # The step is limited to max_unorm * ||p|| (+eps), in the update's own norm.
        # The step is limited to max_unorm * ||p|| (+eps), in the update's own norm; it was clipped (it is at
        # the limit), up to fp32 rounding of p.
        update_norm = (p.double() - before.double()).norm() / HP[name]["lr"]
        close(update_norm, max_unorm * before.double().norm(), rtol=1e-2, atol=0)


def test_32bit_max_unorm_limit_adds_eps_for_one_state_optimizers():
    # One-state rules (lars) clip at max_unorm * ||p|| + eps, two-state ones (lamb) at max_unorm * ||p||.
    n, lr, eps, max_unorm = 300, 1e-2, 0.5, 0.01
    for name, extra in (("lars", eps), ("lamb", 0.0)):
        p, state1, state2 = make_32bit(name, n)
        before = p.double().clone()
        F.optimizer_update_32bit(name, grads(n, 1)[0], p, state1, 0.9, eps, 1, lr, state2, 0.999,
                                 unorm_vec=torch.zeros(1), max_unorm=max_unorm)  # fmt: skip
        update_norm = (p.double() - before).norm() / lr
        close(update_norm, max_unorm * before.norm() + extra, rtol=1e-3, atol=0)


@pytest.mark.parametrize("name", ["lamb", "lars"])
def test_32bit_max_unorm_leaves_small_updates(name):
    n = 300
    p, state1, state2 = make_32bit(name, n)
    q, t1, t2 = make_32bit(name, n)
    g = grads(n, 1)[0]
    step_32bit(name, g, p, state1, state2, 1, unorm_vec=torch.zeros(1), max_unorm=1e6)
    step_32bit(name, g, q, t1, t2, 1)
    assert torch.equal(p, q)


def test_32bit_lion_max_unorm_uses_previous_norm():
    # Upstream quirk kept: lion scales with the unorm_vec of the previous step, then stores a new one.
    n = 300
    p, state1, _ = make_32bit("lion", n)
    unorm_vec = torch.tensor([4.0])
    exp_p, exp_states = p.double(), [state1.double()]
    for step, g in enumerate(grads(n, 3), start=1):
        prev = unorm_vec.item()
        step_32bit("lion", g, p, state1, None, step, unorm_vec=unorm_vec, max_unorm=0.01)
        exp_p, exp_states, exp_unorm = expected_step(
            "lion", g, exp_p, exp_states, step, max_unorm=0.01, unorm_prev=prev
        )
        close(p, exp_p, rtol=1e-5, atol=1e-6)
        close(unorm_vec, torch.tensor([exp_unorm]), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_32bit_skip_zeros(name):
    n = 400
    p, state1, state2 = make_32bit(name, n)
    g1, g2 = grads(n, 2)
    step_32bit(name, g1, p, state1, state2, 1)
    zero = torch.arange(n) % 3 == 0
    g2 = torch.where(zero, torch.zeros_like(g2), g2)
    p_before, s1_before = p.clone(), state1.clone()
    step_32bit(name, g2, p, state1, state2, 2, skip_zeros=True, weight_decay=0.01)
    assert torch.equal(p[zero], p_before[zero])
    assert torch.equal(state1.reshape(-1, n)[:, zero], s1_before.reshape(-1, n)[:, zero])
    assert not torch.equal(p[~zero], p_before[~zero])
    # Without the flag, zero gradients still move p (decay / momentum), which is what skip_zeros prevents.
    q, t1, t2 = make_32bit(name, n)
    step_32bit(name, g1, q, t1, t2, 1)
    step_32bit(name, g2, q, t1, t2, 2, weight_decay=0.01)
    assert not torch.equal(q[zero], p_before[zero])


def test_32bit_ademamix_stacked_state():
    n = 300
    p, state1, state2 = make_32bit("ademamix", n)
    g = grads(n, 1)[0]
    step_32bit("ademamix", g, p, state1, state2, 1)
    hp = HP["ademamix"]
    close(state1[0], (1 - hp["beta1"]) * g.double(), rtol=1e-6, atol=0)  # fast EMA first
    close(state1[1], (1 - hp["beta3"]) * g.double(), rtol=1e-5, atol=0)  # slow EMA second
    close(state2, (1 - hp["beta2"]) * g.double() ** 2, rtol=1e-5, atol=0)


def test_32bit_empty():
    p, state1, state2 = make_32bit("adam", 0)
    step_32bit("adam", torch.empty(0), p, state1, state2, 1, unorm_vec=torch.zeros(1), max_unorm=1.0)
    assert p.numel() == 0


# ---------------------------------------------------------------------------------------------------
# 8-bit blockwise


def nearest_codes_ok(codes, x, qmap):
    """Each code is a nearest qmap entry to x (float64 distances, allowing fp32 rounding of the distance)."""
    dist = (x.double().reshape(-1, 1) - qmap.double().reshape(1, -1)).abs()
    chosen = dist.gather(1, codes.reshape(-1, 1).long()).squeeze(1)
    return bool((chosen <= dist.min(dim=1).values + 1e-7).all())


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("n", [200, 700])
def test_8bit_step_is_32bit_step_then_requantize(name, n):
    """Exact: p moves as the 32-bit step on the dequantized state; the new state is requantized per block."""
    p, state1, state2, absmax1, absmax2 = make_8bit(name, n)
    for step, g in enumerate(grads(n, 3), start=1):
        s1, s2 = dequant_states(name, state1, state2, absmax1, absmax2)
        q = p.clone()
        step_32bit(name, g, q, s1, s2, step)
        step_8bit(name, g, p, state1, state2, absmax1, absmax2, step)
        assert torch.equal(p, q)  # p comes from the unquantized new state
        if name == "ademamix":
            fp32_states = [(s1[k], state1[k], absmax1[k], QMAP1) for k in range(2)]
        else:
            fp32_states = [(s1, state1, absmax1, QMAP1)]
        if s2 is not None:
            fp32_states.append((s2, state2, absmax2, QMAP2))
        for exact, codes, absmax, qmap in fp32_states:
            blocks = torch.nn.functional.pad(exact.reshape(-1), (0, -n % BLOCK)).view(-1, BLOCK)
            assert torch.equal(absmax, blocks.abs().amax(dim=1))
            scale = torch.where(absmax == 0, 1.0, absmax).repeat_interleave(BLOCK)[:n]
            assert nearest_codes_ok(codes, exact.reshape(-1) / scale, qmap)


@pytest.mark.parametrize("name", NAMES)
def test_8bit_tracks_32bit_over_steps(name):
    # Stated tolerance, in units of the total step length (steps * lr), for p after 5 steps against the 32-bit
    # run: worst element < 0.15 and mean < 0.015 (the 8-bit dynamic map resolves small values of a block
    # coarsely, which rmsprop's g/sqrt(v) feels most). Lion moves by lr * sign(...), so a momentum near zero
    # may flip sign: there, fewer than 1% of the elements may differ by more than 0.05, and the mean < 0.005.
    # The dequantized first state stays within 3% of the 32-bit one, relative to its largest value.
    n, steps = 1000, 5
    p8, state1, state2, absmax1, absmax2 = make_8bit(name, n)
    p32, s1, s2 = make_32bit(name, n)
    assert torch.equal(p8, p32)
    for step, g in enumerate(grads(n, steps), start=1):
        step_8bit(name, g, p8, state1, state2, absmax1, absmax2, step)
        step_32bit(name, g, p32, s1, s2, step)
    err = (p8.double() - p32.double()).abs() / (steps * HP[name]["lr"])
    if name == "lion":
        assert (err > 0.05).double().mean() < 0.01 and err.mean() < 0.005
    else:
        assert err.max() < 0.15 and err.mean() < 0.015, (err.max().item(), err.mean().item())
    d1, _ = dequant_states(name, state1, state2, absmax1, absmax2)
    assert (d1.double() - s1.double()).abs().max() < 0.03 * s1.double().abs().max()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_8bit_half_precision_params(dtype):
    n = 300
    p, state1, state2, absmax1, absmax2 = make_8bit("adam", n, dtype)
    g = grads(n, 1, dtype)[0]
    s1, s2 = dequant_states("adam", state1, state2, absmax1, absmax2)
    q = p.clone()
    step_32bit("adam", g, q, s1, s2, 1)
    step_8bit("adam", g, p, state1, state2, absmax1, absmax2, 1)
    assert p.dtype == dtype
    assert torch.equal(p, q)


def test_8bit_all_zero_block_has_zero_absmax_and_no_nan():
    n = 3 * BLOCK - 17
    p, state1, state2, absmax1, absmax2 = make_8bit("adam", n)
    g = grads(n, 1)[0]
    g[BLOCK : 2 * BLOCK] = 0
    p_mid = p[BLOCK : 2 * BLOCK].clone()
    step_8bit("adam", g, p, state1, state2, absmax1, absmax2, 1)
    assert absmax1[1] == 0 and absmax2[1] == 0
    assert absmax1[0] > 0 and absmax1[2] > 0
    assert torch.equal(p[BLOCK : 2 * BLOCK], p_mid)
    # The code of 0.0 in each map: index 127 in the signed one, 0 in the unsigned one.
    assert (state1[BLOCK : 2 * BLOCK] == 127).all() and (state2[BLOCK : 2 * BLOCK] == 0).all()
    assert torch.isfinite(p).all()


def test_8bit_nearest_code_ties_go_to_lower_index():
    # A 3-entry-spaced map where the state lands exactly between two codes.
    qmap = torch.linspace(-1, 1, 256)
    p = torch.zeros(2)
    g = torch.tensor([1.0, 0.0])
    state1 = torch.zeros(2, dtype=torch.uint8)
    absmax1 = torch.zeros(1)
    # momentum, step 1: state = g = [1, 0]; absmax 1, so x = [1, 0]; 0 sits between codes 127 and 128.
    F.optimizer_update_8bit_blockwise("momentum", g, p, state1, None, 0.9, 0.0, 0.0, 0.0, 0.0, 1, 0.1,
                                      qmap, None, absmax1, None)  # fmt: skip
    assert state1.tolist() == [255, 127]
    assert (qmap[127] + qmap[128]).abs() < 1e-6  # 0 really is the midpoint
    # Duplicate entries resolve to the lowest index holding the value.
    dup = torch.linspace(-1, 1, 256)
    dup[200:] = 1.0
    state1.zero_()
    F.optimizer_update_8bit_blockwise("momentum", g, p.zero_(), state1, None, 0.9, 0.0, 0.0, 0.0, 0.0, 1, 0.1,
                                      dup, None, absmax1, None)  # fmt: skip
    assert state1[0].item() == 200


def test_8bit_ademamix_stacked_state_odd_size():
    n = 300  # two blocks per EMA, the second one partial
    p, state1, state2, absmax1, absmax2 = make_8bit("ademamix", n)
    g = grads(n, 1)[0]
    g[BLOCK:] *= 100  # make the second block's absmax clearly different from the first
    step_8bit("ademamix", g, p, state1, state2, absmax1, absmax2, 1)
    hp = HP["ademamix"]
    for k, beta in enumerate((hp["beta1"], hp["beta3"])):
        ema = (1 - beta) * g.double()
        want = torch.stack([ema[:BLOCK].abs().max(), ema[BLOCK:].abs().max()])
        close(absmax1[k], want, rtol=1e-6, atol=0)
        close(dequant(state1[k], absmax1[k], QMAP1), ema, rtol=0.05, atol=1e-3 * want.max().item())


@pytest.mark.parametrize("name", NAMES)
def test_8bit_skip_zeros(name):
    n = 600
    p, state1, state2, absmax1, absmax2 = make_8bit(name, n)
    g1, g2 = grads(n, 2)
    step_8bit(name, g1, p, state1, state2, absmax1, absmax2, 1)
    zero = torch.arange(n) % 4 == 0
    g2 = torch.where(zero, torch.zeros_like(g2), g2)
    before_p = p.clone()
    before_s1, _ = dequant_states(name, state1, state2, absmax1, absmax2)
    step_8bit(name, g2, p, state1, state2, absmax1, absmax2, 2, skip_zeros=True)
    assert torch.equal(p[zero], before_p[zero])
    after_s1, _ = dequant_states(name, state1, state2, absmax1, absmax2)
    # Kept state is only requantized against its block's new absmax: within half a code step of the map.
    kept_before = before_s1.reshape(-1, n)[:, zero]
    kept_after = after_s1.reshape(-1, n)[:, zero]
    assert (kept_after - kept_before).abs().max() <= 0.05 * before_s1.abs().max() + 1e-12
    assert not torch.equal(p[~zero], before_p[~zero])


@pytest.mark.parametrize("name", ["adam", "momentum", "lion", "adagrad"])
def test_8bit_weight_decay_and_gnorm_scale(name):
    n = 300
    p, state1, state2, absmax1, absmax2 = make_8bit(name, n)
    g = grads(n, 1)[0]
    s1, s2 = dequant_states(name, state1, state2, absmax1, absmax2)
    q = p.clone()
    step_32bit(name, g, q, s1, s2, 1, weight_decay=0.2, gnorm_scale=0.5)
    step_8bit(name, g, p, state1, state2, absmax1, absmax2, 1, weight_decay=0.2, gnorm_scale=0.5)
    assert torch.equal(p, q)
    exp_p, _, _ = expected_step(name, g, make_8bit(name, n)[0], [torch.zeros(n)] * (1 + (name in TWO_STATE)), 1,
                                weight_decay=0.2, gnorm_scale=0.5)  # fmt: skip
    close(p, exp_p, rtol=1e-5, atol=1e-6)


def test_8bit_empty():
    p, state1, state2, absmax1, absmax2 = make_8bit("ademamix", 0)
    step_8bit("ademamix", torch.empty(0), p, state1, state2, absmax1, absmax2, 1)
    assert p.numel() == 0 and absmax1.shape == (2, 0)


def test_8bit_nonfinite_gradient_poisons_only_its_block():
    n = 2 * BLOCK
    p, state1, state2, absmax1, absmax2 = make_8bit("adam", n)
    g = grads(n, 1)[0]
    g[5] = float("nan")
    step_8bit("adam", g, p, state1, state2, absmax1, absmax2, 1)
    assert absmax1[0].isnan() and torch.isfinite(absmax1[1])
    assert torch.isfinite(p[BLOCK:]).all()


# ---------------------------------------------------------------------------------------------------
# percentile_clipping (bitsandbytes 0.49 API)


def test_percentile_clipping_history_and_scale():
    gnorm_vec = torch.zeros(100)
    norms = [3.0, 1.0, 10.0, 2.0]
    got = []
    for step, norm in enumerate(norms, start=1):
        grad = torch.zeros(7)
        grad[0] = norm  # ||grad|| == norm
        got.append(F.percentile_clipping(grad, gnorm_vec, step, percentile=5))
    # Step 1 fills the whole history with 3^2; later steps replace entry step % 100.
    want_hist = torch.full((100,), 9.0)
    want_hist[2], want_hist[3], want_hist[4] = 1.0, 100.0, 4.0
    assert torch.equal(gnorm_vec, want_hist)
    current, clip, scale = got[2]  # norm 10; sorted history: [1, 4, 9, 9, ...] -> 5th smallest is 9
    assert current.item() == pytest.approx(10.0) and clip.item() == pytest.approx(3.0)
    assert scale.item() == pytest.approx(0.3)
    current, clip, scale = got[1]  # norm 1 is below the clip value: no scaling
    assert current.item() == pytest.approx(1.0) and scale.item() == 1.0
    # Scales feed the optimizer functions as they are.
    p, s1, s2 = make_32bit("adam", 7)
    step_32bit("adam", torch.ones(7), p, s1, s2, 1, gnorm_scale=got[2][2])


def test_percentile_clipping_bad_input():
    g = torch.ones(4)
    with pytest.raises(ValueError, match="gnorm_vec"):
        F.percentile_clipping(g, torch.zeros(50), 1)
    with pytest.raises(TypeError, match="gnorm_vec"):
        F.percentile_clipping(g, torch.zeros(100, dtype=torch.float16), 1)
    with pytest.raises(TypeError, match="grad"):
        F.percentile_clipping(g.int(), torch.zeros(100), 1)
    with pytest.raises(ValueError, match="gnorm_vec"):
        F.percentile_clipping(g, torch.zeros(100, device="meta"), 1)
    with pytest.raises(ValueError, match="step"):
        F.percentile_clipping(g, torch.zeros(100), 0)
    with pytest.raises(ValueError, match="percentile"):
        F.percentile_clipping(g, torch.zeros(100), 1, percentile=100)


# ---------------------------------------------------------------------------------------------------
# Bad input: the right error, naming the argument, and nothing modified


def _args_32bit(name="adam", n=300):
    p, state1, state2 = make_32bit(name, n)
    return dict(
        optimizer_name=name, g=grads(n, 1)[0], p=p, state1=state1, state2=state2, unorm_vec=None, max_unorm=0.0,
        param_norm=0.0, beta1=0.9, beta2=0.999, beta3=0.0, alpha=0.0, eps=1e-8, weight_decay=0.0, step=1, lr=1e-3,
        gnorm_scale=1.0, skip_zeros=False,
    )  # fmt: skip


def _args_8bit(name="adam", n=300):
    p, state1, state2, absmax1, absmax2 = make_8bit(name, n)
    absmax1.fill_(0.5)  # non-trivial content, so a stray write would show
    if absmax2 is not None:
        absmax2.fill_(0.5)
    return dict(
        optimizer_name=name, g=grads(n, 1)[0], p=p, state1=state1.fill_(3), state2=state2, beta1=0.9, beta2=0.999,
        beta3=0.0, alpha=0.0, eps=1e-8, step=1, lr=1e-3, qmap1=QMAP1, qmap2=QMAP2 if state2 is not None else None,
        absmax1=absmax1, absmax2=absmax2, weight_decay=0.0, gnorm_scale=1.0, skip_zeros=False,
    )  # fmt: skip


def _replace(args, **changes):
    return {**args, **changes}


BAD_32BIT = {
    "unknown optimizer": (lambda a: _replace(a, optimizer_name="adamw"), ValueError, "optimizer_name"),
    "missing state2": (lambda a: _replace(a, state2=None), ValueError, "state2"),
    "g/p dtype mismatch": (lambda a: _replace(a, g=a["g"].half()), TypeError, "p"),
    "state1 dtype": (lambda a: _replace(a, state1=a["state1"].double()), TypeError, "state1"),
    "state1 length": (lambda a: _replace(a, state1=torch.zeros(299)), ValueError, "state1"),
    "non-contiguous g": (lambda a: _replace(a, g=torch.zeros(600)[::2]), ValueError, "g"),
    "device mismatch": (lambda a: _replace(a, state2=torch.zeros(300, device="meta")), ValueError, "state2"),
    "unorm_vec missing": (lambda a: _replace(a, max_unorm=1.0), ValueError, "unorm_vec"),
    "bad step": (lambda a: _replace(a, step=0), ValueError, "step"),
}

BAD_8BIT = {
    "unknown optimizer": (lambda a: _replace(a, optimizer_name="sgd"), ValueError, "optimizer_name"),
    "missing state2": (lambda a: _replace(a, state2=None), ValueError, "state2"),
    "state1 dtype": (lambda a: _replace(a, state1=a["state1"].float()), TypeError, "state1"),
    "g/p dtype mismatch": (lambda a: _replace(a, p=a["p"].bfloat16()), TypeError, "p"),
    "absmax1 length": (lambda a: _replace(a, absmax1=torch.zeros(3)), ValueError, "absmax1"),
    "absmax2 length": (lambda a: _replace(a, absmax2=torch.zeros(1)), ValueError, "absmax2"),
    "absmax dtype": (lambda a: _replace(a, absmax1=a["absmax1"].half()), TypeError, "absmax1"),
    "qmap1 size": (lambda a: _replace(a, qmap1=QMAP1[:255]), ValueError, "qmap1"),
    "missing qmap2": (lambda a: _replace(a, qmap2=None), ValueError, "qmap2"),
    "non-contiguous state1": (
        lambda a: _replace(a, state1=torch.zeros(600, dtype=torch.uint8)[::2]),
        ValueError,
        "state1",
    ),
    "device mismatch": (lambda a: _replace(a, absmax2=torch.zeros(2, device="meta")), ValueError, "absmax2"),
}


def _snapshot(args):
    return {k: v.clone() for k, v in args.items() if isinstance(v, torch.Tensor) and v.device.type != "meta"}


def _unchanged(args, snap):
    return all(torch.equal(args[k], v) for k, v in snap.items())


@pytest.mark.parametrize("case", BAD_32BIT)
@pytest.mark.parametrize("via", ["op", "functional"])
def test_32bit_bad_input(case, via):
    corrupt, exc, arg = BAD_32BIT[case]
    args = corrupt(_args_32bit())
    args["state1"].fill_(0.25) if args["state1"].device.type != "meta" else None
    snap = _snapshot(args)
    with pytest.raises(exc, match=rf"\b{arg}\b"):
        if via == "op":
            torch.ops.bitsandbytes.optimizer_update_32bit(**args)
        else:
            a = dict(args)
            F.optimizer_update_32bit(
                a["optimizer_name"], a["g"], a["p"], a["state1"], a["beta1"], a["eps"], a["step"], a["lr"],
                a["state2"], a["beta2"], weight_decay=0.0, unorm_vec=a["unorm_vec"], max_unorm=a["max_unorm"],
            )  # fmt: skip
    assert _unchanged(args, snap)


@pytest.mark.parametrize("case", BAD_8BIT)
@pytest.mark.parametrize("via", ["op", "functional"])
def test_8bit_bad_input(case, via):
    corrupt, exc, arg = BAD_8BIT[case]
    args = corrupt(_args_8bit())
    snap = _snapshot(args)
    with pytest.raises(exc, match=rf"\b{arg}\b"):
        if via == "op":
            torch.ops.bitsandbytes.optimizer_update_8bit_blockwise(**args)
        else:
            F.optimizer_update_8bit_blockwise(*args.values())
    assert _unchanged(args, snap)


def test_ademamix_8bit_needs_stacked_absmax():
    args = _args_8bit("ademamix")
    args["absmax1"] = torch.zeros(n_blocks(300))  # one row instead of two
    with pytest.raises(ValueError, match="absmax1"):
        torch.ops.bitsandbytes.optimizer_update_8bit_blockwise(**args)


def test_functional_rejects_non_numeric_hyperparameters():
    a = _args_32bit()
    with pytest.raises(TypeError, match="lr"):
        F.optimizer_update_32bit("adam", a["g"], a["p"], a["state1"], 0.9, 1e-8, 1, "0.1", a["state2"], 0.999)
    with pytest.raises(ValueError, match="eps"):
        F.optimizer_update_32bit("adam", a["g"], a["p"], a["state1"], 0.9, math.nan, 1, 0.1, a["state2"], 0.999)
    with pytest.raises(TypeError, match="step"):
        F.optimizer_update_32bit("adam", a["g"], a["p"], a["state1"], 0.9, 1e-8, 1.0, 0.1, a["state2"], 0.999)
