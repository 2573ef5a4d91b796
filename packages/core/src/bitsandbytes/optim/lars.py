"""LARS: SGD with momentum whose update is limited by a trust ratio, ``max_unorm * ||p||`` (32-bit state only).

The 8-bit kernels have no trust ratio, so with 8-bit state LARS steps as SGD with momentum (as upstream).
``PytorchLARS`` is the plain-PyTorch version, for comparison.
"""

from __future__ import annotations

import torch

from . import _args
from .optimizer import Optimizer1State

__all__ = ["LARS", "LARS8bit", "LARS32bit", "PytorchLARS"]


def _check(cls: type, lr, momentum, nesterov) -> None:
    if lr is None:
        raise TypeError(f"{cls.__name__} requires lr")
    if momentum == 0:
        raise NotImplementedError(f"{cls.__name__} without momentum is not supported")
    if nesterov:
        raise ValueError(f"{cls.__name__} does not support nesterov=True")


class LARS(Optimizer1State):
    """LARS; ``optim_bits`` (32 or 8) picks the state precision."""

    def __init__(
        self, params, lr, momentum=0, dampening=0, weight_decay=0, nesterov=False, optim_bits=32, args=None,
        min_8bit_size=4096, max_unorm=0.02, percentile_clipping=100, block_wise=True,
    ):  # fmt: skip
        _check(type(self), lr, momentum, nesterov)
        super().__init__(
            "lars", params, lr, (momentum, dampening), 0.0, weight_decay, optim_bits, args, min_8bit_size,
            max_unorm=max_unorm, percentile_clipping=percentile_clipping, block_wise=block_wise,
        )  # fmt: skip


class LARS8bit(Optimizer1State):
    """LARS with 8-bit blockwise state (no trust ratio: steps as SGD with momentum)."""

    def __init__(
        self, params, lr, momentum=0, dampening=0, weight_decay=0, nesterov=False, args=None, min_8bit_size=4096,
        max_unorm=0.02, percentile_clipping=100, block_wise=True,
    ):  # fmt: skip
        _check(type(self), lr, momentum, nesterov)
        super().__init__(
            "lars", params, lr, (momentum, dampening), 0.0, weight_decay, 8, args, min_8bit_size,
            max_unorm=max_unorm, percentile_clipping=percentile_clipping, block_wise=block_wise,
        )  # fmt: skip


class LARS32bit(Optimizer1State):
    """LARS with 32-bit state."""

    def __init__(
        self, params, lr, momentum=0, dampening=0, weight_decay=0, nesterov=False, args=None, min_8bit_size=4096,
        max_unorm=0.02, percentile_clipping=100, block_wise=True,
    ):  # fmt: skip
        _check(type(self), lr, momentum, nesterov)
        super().__init__(
            "lars", params, lr, (momentum, dampening), 0.0, weight_decay, 32, args, min_8bit_size,
            max_unorm=max_unorm, percentile_clipping=percentile_clipping, block_wise=block_wise,
        )  # fmt: skip


class PytorchLARS(torch.optim.Optimizer):
    """LARS in plain PyTorch: SGD (optionally Nesterov) whose update norm is capped at ``max_unorm * ||p||``."""

    def __init__(self, params, lr=0.01, momentum=0, dampening=0, weight_decay=0, nesterov=False, max_unorm=0.02):
        _args.non_negative("lr", lr)
        _args.non_negative("momentum", momentum)
        _args.non_negative("weight_decay", weight_decay)
        _args.non_negative("max_unorm", max_unorm)
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum > 0 and dampening = 0")
        defaults = dict(
            lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay, nesterov=nesterov,
            max_unorm=max_unorm,
        )  # fmt: skip
        super().__init__(params, defaults)

    def __setstate__(self, state):
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("nesterov", False)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            wd, momentum, dampening = group["weight_decay"], group["momentum"], group["dampening"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                d_p = p.grad if wd == 0 else p.grad.add(p, alpha=wd)
                update = d_p
                if momentum != 0:
                    buf = self.state[p].get("momentum_buffer")
                    if buf is None:
                        buf = self.state[p]["momentum_buffer"] = d_p.detach().clone()
                    else:
                        buf.mul_(momentum).add_(d_p, alpha=1 - dampening)
                    update = d_p + momentum * buf if group["nesterov"] else buf
                scale = 1.0
                if group["max_unorm"] > 0.0:
                    pnorm, unorm = torch.linalg.vector_norm(p.float()), torch.linalg.vector_norm(update.float())
                    limit = group["max_unorm"] * pnorm
                    scale = torch.where(unorm > limit, limit / unorm, torch.ones_like(unorm)).item()
                p.add_(update, alpha=-group["lr"] * scale)
        return loss
