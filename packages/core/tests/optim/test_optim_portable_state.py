"""The portable form of optimizer state (fp32, no block data), single-process.

Sharded (DTensor) parameters present their state this way (tests/distributed/test_fsdp_optim8bit.py); here
the conversion itself, and plain parameters loading such state, without any ranks.
"""

from __future__ import annotations

import copy

import pytest
import torch
from optim_testlib import make_grads, run_steps

import bitsandbytes as bnb
import bitsandbytes.functional as F
from bitsandbytes.optim import _portable

WRAP = "__bnb_optimizer_quant_state__"
SHAPES = [(33, 20), (300,)]  # partial last blocks


def _params(seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in SHAPES]


def _grads(steps, seed=1):
    return [make_grads(s, steps, seed + i) for i, s in enumerate(SHAPES)]


def _trained(cls, steps=3, **kw):
    ps = _params()
    opt = getattr(bnb.optim, cls)(ps, lr=1e-2, min_8bit_size=0, **kw)
    run_steps(opt, ps, _grads(steps))
    return ps, opt


def _portable_sd(opt, stack=1):
    """opt.state_dict() with each state decoded to the portable form, as a sharded parameter gives it."""
    sd = opt.state_dict()
    for entry in sd["state"].values():
        quant = entry.pop(WRAP)
        for n, key in ((1, "state1"), (2, "state2")):
            if key in quant:
                s = stack if n == 1 else 1
                entry[key] = _portable.decode(quant[key], quant[f"absmax{n}"], quant[f"qmap{n}"], s)
    return sd


@pytest.mark.parametrize("cls", ["Adam8bit", "AdEMAMix8bit", "Lion8bit"])
def test_encode_of_decode_restores_codes_and_absmax_exactly(cls):
    _, opt = _trained(cls)
    stack = opt._state1_stack()
    negative_extreme = False
    for state in opt.state.values():
        for n, key in ((1, "state1"), (2, "state2")):
            if key not in state:
                continue
            s = stack if n == 1 else 1
            codes, absmax, qmap = state[key], state[f"absmax{n}"], state[f"qmap{n}"]
            again = _portable.encode(_portable.decode(codes, absmax, qmap, s), qmap, s)
            assert torch.equal(again[0], codes) and torch.equal(again[1], absmax)
            if n == 1 and s == 1:
                # The case the decoding map exists for: decoded with the kernels' own map, a block whose
                # extreme is negative (code min, -0.993) comes back with a smaller absmax and other codes.
                plain = F.dequantize_blockwise(codes, absmax=absmax, code=qmap, blocksize=256)
                naive = _portable.encode(plain, qmap)
                negative_extreme |= not torch.equal(naive[1], absmax)
    if cls != "AdEMAMix8bit":
        assert negative_extreme


@pytest.mark.parametrize("cls", ["Adam8bit", "AdEMAMix8bit"])
def test_plain_parameters_load_portable_state_and_continue_identically(cls):
    ps, opt = _trained(cls)
    sd = _portable_sd(opt, opt._state1_stack())
    assert all(WRAP not in e and e["state1"].dtype == torch.float32 for e in sd["state"].values())
    ps2 = [torch.nn.Parameter(p.detach().clone()) for p in ps]
    opt2 = getattr(bnb.optim, cls)(ps2, lr=1e-2, min_8bit_size=0)
    opt2.load_state_dict(sd)
    for p, q in zip(ps, ps2, strict=True):
        a, b = opt.state[p], opt2.state[q]
        assert set(a) == set(b) and b["state1"].dtype == torch.uint8
        assert all(torch.equal(a[k], b[k]) for k in a if k != "step") and b["step"] == 3
    tail = _grads(5)
    run_steps(opt, ps, [g[3:] for g in tail])
    run_steps(opt2, ps2, [g[3:] for g in tail])
    assert all(torch.equal(p, q) for p, q in zip(ps, ps2, strict=True))
    # Saved again in upstream's layout.
    assert all(set(e) == {"step", WRAP} for e in opt2.state_dict()["state"].values())


def test_portable_state_takes_the_precision_the_optimizer_uses():
    ps, opt = _trained("Adam8bit")
    sd = _portable_sd(opt)
    opt32 = bnb.optim.Adam32bit([torch.nn.Parameter(p.detach().clone()) for p in ps], lr=1e-2)
    opt32.load_state_dict(copy.deepcopy(sd))
    for entry, state in zip(sd["state"].values(), opt32.state.values(), strict=True):
        assert state["state1"].dtype == torch.float32 and "absmax1" not in state
        assert torch.equal(state["state1"], entry["state1"]) and torch.equal(state["state2"], entry["state2"])


def test_portable_state_beats_a_native_template_for_plain_parameters():
    # torch.distributed.checkpoint merges a checkpoint into the optimizer's own state dict: for plain
    # parameters the portable state is the checkpoint, the native state beside it the stale template.
    ps, opt = _trained("Adam8bit")
    portable = _portable_sd(opt)
    _, other = _trained("Adam8bit", steps=1)
    merged = other.state_dict()
    for index, entry in merged["state"].items():
        entry.update({k: portable["state"][index][k] for k in ("step", "state1", "state2")})
    opt2 = bnb.optim.Adam8bit([torch.nn.Parameter(p.detach().clone()) for p in ps], lr=1e-2, min_8bit_size=0)
    opt2.load_state_dict(merged)
    for a, b in zip(opt.state.values(), opt2.state.values(), strict=True):
        assert torch.equal(a["state1"], b["state1"]) and torch.equal(a["absmax2"], b["absmax2"])


def test_bad_portable_state_is_refused_naming_the_key():
    ps, opt = _trained("Adam8bit")
    sd = _portable_sd(opt)
    sd["state"][0]["state2"] = sd["state"][0]["state2"][:5]
    opt2 = bnb.optim.Adam8bit([torch.nn.Parameter(p.detach().clone()) for p in ps], min_8bit_size=0)
    with pytest.raises(ValueError, match=r"\['state2'\] has shape \(5, 20\), expected \(33, 20\)"):
        opt2.load_state_dict(sd)
    assert not opt2.state
    sd = _portable_sd(opt)
    sd["state"][1]["state1"] = sd["state"][1]["state1"].half()
    with pytest.raises(ValueError, match=r"\['state1'\] has dtype float16, expected float32 or uint8"):
        opt2.load_state_dict(sd)
