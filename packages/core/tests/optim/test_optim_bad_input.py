"""Bad hyperparameters and bad state dicts: a clear error naming the argument or key, and nothing half-changed."""

from __future__ import annotations

import copy

import pytest
import torch
from optim_testlib import make_grads, run_steps

import bitsandbytes as bnb

WRAP = "__bnb_optimizer_quant_state__"


def _p(n=300):
    return [torch.nn.Parameter(torch.randn(n, generator=torch.Generator().manual_seed(0)))]


@pytest.mark.parametrize(
    ("factory", "error", "match"),
    [
        (lambda: bnb.optim.Adam(_p(), lr=-1.0), ValueError, "lr must be >= 0"),
        (lambda: bnb.optim.Adam(_p(), lr=float("nan")), ValueError, "lr must be finite"),
        (lambda: bnb.optim.Adam(_p(), lr="0.1"), TypeError, "lr must be a number"),
        (lambda: bnb.optim.AdamW(_p(), eps=-1e-8), ValueError, "eps must be >= 0"),
        (lambda: bnb.optim.Adam(_p(), weight_decay=-0.1), ValueError, "weight_decay must be >= 0"),
        (lambda: bnb.optim.Adam(_p(), betas=(0.9, 1.0)), ValueError, r"betas\[1\] must be in \[0, 1\)"),
        (lambda: bnb.optim.Adam(_p(), betas="0.9;0.99"), ValueError, "betas must look like"),
        (lambda: bnb.optim.Adam(_p(), betas=0.9), TypeError, "betas must be a tuple"),
        (lambda: bnb.optim.AdEMAMix(_p(), betas=(0.9, 0.999)), ValueError, "betas must have 3 values"),
        (lambda: bnb.optim.AdEMAMix(_p(), t_alpha=0), ValueError, "t_alpha must be None or an int > 0"),
        (lambda: bnb.optim.Lion(_p(), betas=(-0.1, 0.99)), ValueError, r"betas\[0\] must be in \[0, 1\)"),
        (lambda: bnb.optim.Adam(_p(), optim_bits=16), ValueError, "optim_bits must be 8 or 32, got 16"),
        (lambda: bnb.optim.Lion(_p(), optim_bits="8"), TypeError, "optim_bits must be 8 or 32"),
        (lambda: bnb.optim.Adam8bit(_p(), optim_bits=8), ValueError, "Adam8bit only supports optim_bits=32"),
        (lambda: bnb.optim.Adagrad8bit(_p(), optim_bits=32), ValueError, "Adagrad8bit only supports optim_bits=8"),
        (lambda: bnb.optim.Adam(_p(), amsgrad=True), ValueError, "Adam does not support amsgrad"),
        (lambda: bnb.optim.Adam(_p(), min_8bit_size=-1), ValueError, "min_8bit_size must be an int >= 0"),
        (lambda: bnb.optim.Adam(_p(), percentile_clipping=101), ValueError, r"percentile_clipping must .*\[0, 100\]"),
        (lambda: bnb.optim.LAMB(_p(), max_unorm=-1.0), ValueError, "max_unorm must be >= 0"),
        (lambda: bnb.optim.LAMB8bit(_p(), max_unorm=0.5), ValueError, "LAMB8bit only supports max_unorm=1.0"),
        (lambda: bnb.optim.SGD(_p(), lr=0.1), NotImplementedError, "SGD without momentum"),
        (lambda: bnb.optim.SGD(_p(), lr=0.1, momentum=0.9, nesterov=True), NotImplementedError, "nesterov"),
        (lambda: bnb.optim.RMSprop(_p(), centered=True), NotImplementedError, "centered"),
        (lambda: bnb.optim.RMSprop(_p(), momentum=0.9), NotImplementedError, "momentum"),
        (lambda: bnb.optim.Adagrad(_p(), lr_decay=0.1), ValueError, "lr_decay"),
        (lambda: bnb.optim.LARS(_p(), lr=0.1), NotImplementedError, "LARS without momentum"),
        (lambda: bnb.optim.PytorchLARS(_p(), lr=-0.1), ValueError, "lr must be >= 0"),
    ],
)
def test_bad_hyperparameters(factory, error, match):
    with pytest.raises(error, match=match):
        factory()


def test_bad_override_at_state_creation_leaves_no_state():
    # Overrides are checked when registered; a config object bypassing that still fails cleanly at init.
    p = _p()
    opt = bnb.optim.Adam(p)
    bnb.optim.GlobalOptimManager.get_instance()._param_config[p[0]] = {"optim_bits": 4}
    p[0].grad = torch.ones_like(p[0])
    with pytest.raises(ValueError, match="optim_bits must be 8 or 32, got 4"):
        opt.step()
    assert len(opt.state[p[0]]) == 0


def _trained(cls=bnb.optim.Adam8bit, n_params=1, **kwargs):
    ps = [_p()[0] for _ in range(n_params)]
    opt = cls(ps, min_8bit_size=0, **kwargs)
    run_steps(opt, ps, [make_grads((300,), 2, seed=i) for i in range(n_params)])
    return opt


def _hyperparameters(opt):
    return [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]


def _edit(sd, key, value, index=0):
    sd = copy.deepcopy(sd)
    if key == "step":
        sd["state"][index]["step"] = value
    else:
        sd["state"][index][WRAP][key] = value
    return sd


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("state1", torch.zeros(299, dtype=torch.uint8), r"\['state1'\] has shape \(299,\), expected \(300,\)"),
        ("state1", torch.zeros(300, dtype=torch.float16), r"\['state1'\] has dtype float16, expected float32 or uint8"),
        ("state2", torch.zeros(300), r"\['state2'\] has dtype float32, expected uint8"),
        ("absmax1", torch.zeros(3), r"\['absmax1'\] has shape \(3,\), expected \(2,\)"),
        ("qmap2", torch.zeros(256, dtype=torch.float64), r"\['qmap2'\] has dtype float64, expected float32"),
        ("qmap1", None, r"\['qmap1'\] must be a tensor"),
        ("step", -1, r"\['step'\] must be an int >= 0"),
    ],
)
def test_bad_state_dict_is_refused_and_nothing_changes(key, value, match):
    # Parameter 0's entry is valid and comes first: it must not be loaded when parameter 1's is refused.
    good = _trained(n_params=2).state_dict()
    good["param_groups"][0]["lr"] = 0.5
    fresh = bnb.optim.Adam8bit(_p() + _p(), min_8bit_size=0)
    before = _hyperparameters(fresh)
    with pytest.raises(ValueError, match=r"state_dict\['state'\]\[1\]" + match):
        fresh.load_state_dict(_edit(good, key, value, index=1))
    assert _hyperparameters(fresh) == before and len(fresh.state) == 0


def test_bad_state_dict_of_an_optimizer_with_state_keeps_its_state():
    opt = _trained()
    saved = opt.state_dict()
    state = next(iter(opt.state.values()))
    state_before = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in state.items()}
    with pytest.raises(ValueError, match="absmax2"):
        opt.load_state_dict(_edit(saved, "absmax2", torch.zeros(5)))
    state_after = next(iter(opt.state.values()))
    assert state_after.keys() == state_before.keys()
    assert all(torch.equal(state_after[k], v) if isinstance(v, torch.Tensor) else state_after[k] == v
               for k, v in state_before.items())  # fmt: skip


def test_state_dict_for_a_different_optimizer_layout():
    opt = _trained()
    sd = opt.state_dict()
    two = bnb.optim.Adam8bit(_p() + _p(), min_8bit_size=0)
    with pytest.raises(ValueError, match=r"param_groups'\]\[0\] has 1 parameters, the optimizer's group 0 has 2"):
        two.load_state_dict(sd)
    groups = bnb.optim.Adam8bit([{"params": _p()}, {"params": _p()}])
    with pytest.raises(ValueError, match="1 parameter groups, the optimizer 2"):
        groups.load_state_dict(sd)
    # A one-state optimizer's dict into a two-state optimizer: state2 is missing.
    lion = _trained(bnb.optim.Lion8bit).state_dict()
    with pytest.raises(ValueError, match=r"\['state2'\] must be a tensor"):
        bnb.optim.Adam8bit(_p(), min_8bit_size=0).load_state_dict(lion)
    with pytest.raises(ValueError, match="'state' and 'param_groups'"):
        opt.load_state_dict({"state": {}})
