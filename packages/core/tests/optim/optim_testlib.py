"""Step drivers shared by the optimizer tests."""

from __future__ import annotations

import torch


def make_grads(shape, steps, seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=gen).to(dtype) for _ in range(steps)]


def run_steps(opt, params, grads_per_param):
    """Set each parameter's gradient from its list and step, once per list entry."""
    for step_grads in zip(*grads_per_param, strict=True):
        for p, g in zip(params, step_grads, strict=True):
            p.grad = g.clone()
        opt.step()
