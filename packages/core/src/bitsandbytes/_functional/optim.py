"""Optimizer steps of ``bitsandbytes.functional``: upstream 0.50's signatures, plus 0.49's ``percentile_clipping``."""

from __future__ import annotations

import torch

from .. import _checks as c
from .._ops import check_optimizer_update_8bit_blockwise, check_optimizer_update_32bit

__all__ = ["optimizer_update_8bit_blockwise", "optimizer_update_32bit", "percentile_clipping"]

# Length of the gradient-norm history that percentile_clipping keeps (upstream's fixed size).
GNORM_HISTORY = 100


def _real(name: str, x: object) -> float:
    """A finite Python number from ``x``; a one-element tensor (e.g. percentile_clipping's scale) is read back."""
    if isinstance(x, torch.Tensor):
        if x.numel() != 1:
            raise ValueError(f"{name} must be a number or a one-element tensor; got a tensor of shape {tuple(x.shape)}")
        x = x.item()
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise TypeError(f"{name} must be a number; got {type(x).__name__}")
    c.finite_scalar(name, x)
    return float(x)


def _int(name: str, x: object) -> int:
    if isinstance(x, bool) or not isinstance(x, int):
        raise TypeError(f"{name} must be an int; got {type(x).__name__}")
    return x


def optimizer_update_32bit(
    optimizer_name: str,
    g: torch.Tensor,
    p: torch.Tensor,
    state1: torch.Tensor,
    beta1: float,
    eps: float,
    step: int,
    lr: float,
    state2: torch.Tensor | None = None,
    beta2: float = 0.0,
    beta3: float = 0.0,
    alpha: float = 0.0,
    weight_decay: float = 0.0,
    gnorm_scale: float = 1.0,
    unorm_vec: torch.Tensor | None = None,
    max_unorm: float = 0.0,
    skip_zeros=False,
) -> None:
    """One in-place optimizer step with fp32 state (``state1``, and ``state2`` for adam, lamb and ademamix).

    ``optimizer_name`` is one of adam, momentum, rmsprop, lion, adagrad, ademamix, lamb, lars. ``g`` and
    ``p`` share a dtype (fp16, bf16 or fp32) and are updated in place together with the states. AdEMAMix
    keeps its two EMAs stacked in ``state1`` (``[2, *p.shape]``). ``gnorm_scale`` multiplies the gradient
    first (a one-element tensor is accepted and read back). With ``max_unorm > 0`` (LAMB/LARS), the update is
    limited to ``max_unorm * ||p||`` and ``unorm_vec`` (one fp32 element) receives the squared update norm.
    ``skip_zeros`` leaves elements with an exactly zero gradient untouched. The exact rules, weight decay
    included, are documented in ``bitsandbytes._reference.optimizers``.
    """
    step = _int("step", step)
    floats = dict(beta1=beta1, eps=eps, lr=lr, beta2=beta2, beta3=beta3, alpha=alpha, weight_decay=weight_decay,
                  gnorm_scale=gnorm_scale, max_unorm=max_unorm)  # fmt: skip
    f = {name: _real(name, value) for name, value in floats.items()}
    # Validate before reading p for its norm, so a bad call fails with the contract's message.
    check_optimizer_update_32bit(
        optimizer_name, g, p, state1, state2, unorm_vec, f["max_unorm"], 0.0, f["beta1"], f["beta2"], f["beta3"],
        f["alpha"], f["eps"], f["weight_decay"], step, f["lr"], f["gnorm_scale"], bool(skip_zeros),
    )  # fmt: skip
    param_norm = 0.0
    if f["max_unorm"] > 0.0:
        # The op takes the norm as a float, so this reads one value back from the device (as upstream).
        param_norm = torch.linalg.vector_norm(p.float()).item()
    torch.ops.bitsandbytes.optimizer_update_32bit(
        optimizer_name, g, p, state1, state2, unorm_vec, f["max_unorm"], param_norm, f["beta1"], f["beta2"],
        f["beta3"], f["alpha"], f["eps"], f["weight_decay"], step, f["lr"], f["gnorm_scale"], bool(skip_zeros),
    )  # fmt: skip


def optimizer_update_8bit_blockwise(
    optimizer_name: str,
    g: torch.Tensor,
    p: torch.Tensor,
    state1: torch.Tensor,
    state2: torch.Tensor | None,
    beta1: float,
    beta2: float,
    beta3: float,
    alpha: float,
    eps: float,
    step: int,
    lr: float,
    qmap1: torch.Tensor,
    qmap2: torch.Tensor | None,
    absmax1: torch.Tensor,
    absmax2: torch.Tensor | None,
    weight_decay: float = 0.0,
    gnorm_scale: float = 1.0,
    skip_zeros=False,
) -> None:
    """One in-place optimizer step with 8-bit blockwise state (blocks of 256 values).

    ``state1``/``state2`` are uint8 codes into ``qmap1`` (signed dynamic map) and ``qmap2`` (unsigned dynamic
    map), scaled per block by the fp32 ``absmax1``/``absmax2``; all four are rewritten by the step. AdEMAMix
    stacks its two EMAs: ``state1`` is ``[2, *p.shape]`` and ``absmax1`` ``[2, blocks]``. Other arguments as
    in ``optimizer_update_32bit`` (there is no ``max_unorm`` here: lamb steps as adam and lars as momentum).
    """
    step = _int("step", step)
    floats = dict(beta1=beta1, beta2=beta2, beta3=beta3, alpha=alpha, eps=eps, lr=lr, weight_decay=weight_decay,
                  gnorm_scale=gnorm_scale)  # fmt: skip
    f = {name: _real(name, value) for name, value in floats.items()}
    args = (
        optimizer_name, g, p, state1, state2, f["beta1"], f["beta2"], f["beta3"], f["alpha"], f["eps"], step, f["lr"],
        qmap1, qmap2, absmax1, absmax2, f["weight_decay"], f["gnorm_scale"], bool(skip_zeros),
    )  # fmt: skip
    check_optimizer_update_8bit_blockwise(*args)
    torch.ops.bitsandbytes.optimizer_update_8bit_blockwise(*args)


def percentile_clipping(
    grad: torch.Tensor, gnorm_vec: torch.Tensor, step: int, percentile: int = 5
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Record ``grad``'s norm in the history ``gnorm_vec`` and derive a clipping scale (bitsandbytes 0.49 API).

    ``gnorm_vec`` holds 100 fp32 *squared* gradient norms and is updated in place: on ``step == 1`` the
    squared norm is added to every entry (entry 1 first reset to 0), otherwise it replaces entry
    ``step % 100``. Returns ``(current_gnorm, clip_value, gnorm_scale)``: the current norm, the
    ``percentile``-th smallest norm in the history, and ``clip_value / current_gnorm`` when the current norm
    exceeds it, else 1. All three are 0-dim fp32 tensors on ``grad``'s device, so nothing is read back to the
    host (upstream returned the float ``1.0`` for an unclipped scale); ``gnorm_scale`` can be passed as is to
    the optimizer update functions.
    """
    c.dtype("grad", grad, c.FLOAT_DTYPES)
    c.dtype("gnorm_vec", gnorm_vec, (torch.float32,))
    c.same_device("grad", grad, gnorm_vec=gnorm_vec)
    c.numel("gnorm_vec", gnorm_vec, GNORM_HISTORY, "the history of squared gradient norms")
    c.ndim("gnorm_vec", gnorm_vec, 1)
    step = _int("step", step)
    if step < 1:
        raise ValueError(f"step must be >= 1; got {step}")
    percentile = _int("percentile", percentile)
    if not 0 <= percentile < GNORM_HISTORY:
        raise ValueError(f"percentile must be in [0, {GNORM_HISTORY - 1}]; got {percentile}")

    with torch.no_grad():
        return record_squared_gnorm(gnorm_vec, grad.float().square().sum(), step, percentile)


def record_squared_gnorm(
    gnorm_vec: torch.Tensor, squared_norm: torch.Tensor, step: int, percentile: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`percentile_clipping` after its checks, from a squared norm computed by the caller (for a
    sharded gradient, summed over all ranks)."""
    slot = step % GNORM_HISTORY
    gnorm_vec[slot] = 0.0
    if step == 1:
        # The first norm seeds the whole history, so early percentiles are meaningful.
        gnorm_vec.add_(squared_norm)
    else:
        gnorm_vec[slot] = squared_norm
    current_gnorm = gnorm_vec[slot].sqrt()
    clip_value = torch.sort(gnorm_vec).values[percentile].sqrt()
    gnorm_scale = torch.where(current_gnorm > clip_value, clip_value / current_gnorm, torch.ones_like(clip_value))
    return current_gnorm, clip_value, gnorm_scale
