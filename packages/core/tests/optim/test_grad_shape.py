"""An optimizer step whose ``p.grad`` has another shape than ``p`` (issue 15 part 4).

torch's ``.grad`` setter refuses that, but ``p.grad.data = t`` does not; the step must then name the
parameter's gradient and change nothing: neither the parameter nor its state.
"""

import re

import pytest
import torch

import bitsandbytes as bnb


def snapshot(opt, p):
    return {k: v.clone() if torch.is_tensor(v) else v for k, v in opt.state[p].items()}


def same(a, b):
    return a.keys() == b.keys() and all(torch.equal(v, b[k]) if torch.is_tensor(v) else v == b[k] for k, v in a.items())


@pytest.mark.parametrize("optim_bits", [8, 32])
@pytest.mark.parametrize("bad_shape", [(128, 64), (10,)], ids=["same-numel", "other-numel"])
def test_step_names_the_gradient_and_changes_nothing(optim_bits, bad_shape):
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(64, 128))
    opt = bnb.optim.Adam([p], lr=1e-2, optim_bits=optim_bits, min_8bit_size=16)
    p.grad = torch.randn(64, 128)
    opt.step()
    if optim_bits == 8:
        assert opt.state[p]["state1"].dtype == torch.uint8
    state, value = snapshot(opt, p), p.detach().clone()
    p.grad.data = torch.randn(bad_shape)
    match = re.escape(f"the gradient (p.grad) of parameter 0 in param group 0 has shape {tuple(bad_shape)}")
    with pytest.raises(ValueError, match=match):
        opt.step()
    assert same(snapshot(opt, p), state) and torch.equal(p, value)


def test_first_step_with_a_misshapen_gradient_creates_no_state():
    p = torch.nn.Parameter(torch.randn(64, 128))
    opt = bnb.optim.Adam8bit([p], min_8bit_size=16)
    p.grad = torch.zeros(64, 128)
    p.grad.data = torch.zeros(128, 64)
    with pytest.raises(ValueError, match=r"must have the parameter's shape \(64, 128\)"):
        opt.step()
    assert len(opt.state[p]) == 0
