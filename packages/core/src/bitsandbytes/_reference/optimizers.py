"""Reference kernels for the optimizer steps: ``optimizer_update_32bit`` and ``optimizer_update_8bit_blockwise``.

Both ops update ``p`` and the optimizer state in place from the gradient ``g``. The math of one step is
shared (``_step``); the 8-bit op only wraps it in a dequantize / requantize of its states.

Semantics, as upstream bitsandbytes 0.50.2 defines them (its pure-PyTorch default and CPU kernels, which
mirror its CUDA kernels except where noted):

* The gradient is first multiplied by ``gnorm_scale``. All math is fp32, whatever the dtype of ``g``/``p``.
* ``lamb`` steps like ``adam`` and ``lars`` like ``momentum``; they differ only through ``max_unorm``.
* Weight decay (only when ``weight_decay > 0``): *coupled* (``g += weight_decay * p``) for momentum, lars,
  rmsprop and adagrad; *decoupled* (``p *= 1 - lr * weight_decay``, before the update) for adam, lamb,
  ademamix and lion. (Upstream's CUDA kernels decay adam/ademamix after the update, a second-order
  difference; the default, CPU and Triton kernels decay before, as here.)
* Bias correction uses ``step`` (>= 1): adam ``p += -lr * sqrt(1-b2^t)/(1-b1^t) * m / (sqrt(v) + eps*sqrt(1-b2^t))``;
  ademamix ``p -= lr * (m1/(1-b1^t) + alpha*m2) / (sqrt(nu)/sqrt(1-b2^t) + eps)`` with ``m2`` an EMA with
  ``beta3`` and both EMAs stacked in ``state1`` (``[2, *p.shape]``).
* momentum: ``m = g`` on step 1, else ``m = beta1*m + g``; ``p -= lr*m``. rmsprop: ``v = beta1*v + (1-beta1)g^2``;
  ``p -= lr*g/(sqrt(v)+eps)``. adagrad: ``v += g^2``; same update. lion: ``p -= lr*sign(beta1*m + (1-beta1)g)``,
  then ``m = beta2*m + (1-beta2)g``.
* ``max_unorm > 0`` (32-bit only; LAMB/LARS trust ratio): ``unorm_vec`` is overwritten with a squared update
  norm, and the update is scaled by ``limit / sqrt(unorm)`` when ``sqrt(unorm) > limit``, where
  ``limit = max_unorm * param_norm`` (+ ``eps`` for the one-state optimizers). The norm is that of the
  bias-corrected update for adam/lamb, of the new momentum for momentum/lars, of ``g/(sqrt(v)+eps)`` for
  rmsprop/adagrad, all computed without weight decay. Upstream quirks kept for compatibility: adagrad and
  ademamix never scale their update; ademamix stores the plain sum of its old ``state1``; lion scales with the
  ``unorm_vec`` left by the previous step and then stores the plain sum of ``beta2*m_new + (1-beta2)g``.
* ``skip_zeros``: elements whose gradient is exactly zero keep their parameter and state. (Upstream's CUDA
  kernels test the gradient after coupled weight decay in 32-bit one-state optimizers and ignore the flag
  for 8-bit two-state ones; its other kernels do not support it.) The ``max_unorm`` norm covers all elements.
* 8-bit blockwise: blocks of 256 over the flattened state (AdEMAMix: over each of its two EMAs, with
  ``absmax1`` laid out as ``[2, blocks]``). A state is dequantized as ``qmap[code] * absmax[block]``, the step
  runs in fp32, ``p`` is updated from the new *unquantized* states (as upstream), then each new state is
  requantized: ``absmax`` = max ``|state|`` of its block (0 for an all-zero block) and each code is the nearest
  ``qmap`` entry to ``state / absmax`` (``state / 1`` when ``absmax`` is 0), ties to the lower index.
  (Upstream's CUDA kernel also nudges a code whose value has the wrong sign one step; not done here.)
  8-bit has no ``max_unorm``.
* NaN/Inf: no value checks. A non-finite gradient makes its elements of ``p`` and state non-finite, and in
  8-bit its block's ``absmax``, so the whole block visibly dequantizes to non-finite values. (Upstream's CUDA
  8-bit kernel instead zeroes the state of such elements.)
* One-state optimizers ignore ``state2`` (and ``qmap2``/``absmax2``) if given; it is left untouched.

Every kernel calls the op's ``check_*`` first and computes the whole step before its first write, so a bad
call raises without modifying anything.
"""

from __future__ import annotations

import math

import torch

from .._ops import OPTIMIZER_BLOCKSIZE, check_optimizer_update_8bit_blockwise, check_optimizer_update_32bit
from ._registry import reference
from .blockwise import block_absmax_and_scale, nearest_code

# The update rule each optimizer name runs; lamb and lars add only the max_unorm trust ratio on top.
_RULE = {
    "adam": "adam",
    "lamb": "adam",
    "ademamix": "ademamix",
    "momentum": "momentum",
    "lars": "momentum",
    "rmsprop": "rmsprop",
    "adagrad": "adagrad",
    "lion": "lion",
}
_COUPLED_DECAY = ("momentum", "rmsprop", "adagrad")
_ONE_STATE = ("momentum", "rmsprop", "adagrad", "lion")


def _step(
    rule: str,
    g: torch.Tensor,
    p: torch.Tensor,
    states: list[torch.Tensor],
    beta1: float,
    beta2: float,
    beta3: float,
    alpha: float,
    eps: float,
    weight_decay: float,
    step: int,
    lr: float,
    update_scale: torch.Tensor | float,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One fp32 step on flat tensors: returns the new parameter and the new states (inputs are not modified).

    ``g`` is already multiplied by ``gnorm_scale``; ``states`` holds [m, v] for adam, [m1, m2, nu] for ademamix
    and [s] for the one-state rules.
    """
    if weight_decay > 0.0:
        if rule in _COUPLED_DECAY:
            g = g + weight_decay * p
        else:
            p = p * (1.0 - lr * weight_decay)

    if rule == "adam":
        m, v = states
        m = beta1 * m + (1.0 - beta1) * g
        v = beta2 * v + (1.0 - beta2) * g * g
        correction1 = 1.0 - beta1**step
        correction2 = math.sqrt(1.0 - beta2**step)
        step_size = -lr * correction2 / correction1
        p = p + update_scale * step_size * (m / (v.sqrt() + eps * correction2))
        return p, [m, v]
    if rule == "ademamix":
        m1, m2, nu = states
        m1 = beta1 * m1 + (1.0 - beta1) * g
        m2 = beta3 * m2 + (1.0 - beta3) * g
        nu = beta2 * nu + (1.0 - beta2) * g * g
        correction1 = 1.0 - beta1**step
        correction2 = math.sqrt(1.0 - beta2**step)
        p = p - lr * (m1 / correction1 + alpha * m2) / (nu.sqrt() / correction2 + eps)
        return p, [m1, m2, nu]
    (s,) = states
    if rule == "momentum":
        s = g if step == 1 else beta1 * s + g
        p = p - update_scale * lr * s
    elif rule == "rmsprop":
        s = beta1 * s + (1.0 - beta1) * g * g
        p = p - update_scale * lr * g / (s.sqrt() + eps)
    elif rule == "adagrad":
        s = s + g * g
        p = p - lr * g / (s.sqrt() + eps)
    else:  # lion: the sign of an interpolation with beta1 moves p; the state is an EMA with beta2
        direction = beta1 * s + (1.0 - beta1) * g
        # torch.sign(NaN) is 0 on some devices; keep NaN so a NaN gradient is visible in p.
        p = p - update_scale * lr * torch.where(direction.isnan(), direction, torch.sign(direction))
        s = beta2 * s + (1.0 - beta2) * g
    return p, [s]


def _squared_update_norm(
    rule: str, g: torch.Tensor, states: list[torch.Tensor], beta1: float, beta2: float, eps: float, step: int
) -> torch.Tensor:
    """The ``unorm_vec`` value for max_unorm (computed before the step, from the old states, without weight decay)."""
    if rule == "adam":
        m, v = states
        m = (beta1 * m + (1.0 - beta1) * g) / (1.0 - beta1**step)
        v = (beta2 * v + (1.0 - beta2) * g * g) / (1.0 - beta2**step)
        return (m / (v.sqrt() + eps)).square().sum()
    if rule == "ademamix":
        m1, m2, _ = states
        return m1.sum() + m2.sum()
    (s,) = states
    if rule == "momentum":
        return (g if step == 1 else beta1 * s + g).square().sum()
    if rule == "rmsprop":
        s = beta1 * s + (1.0 - beta1) * g * g
    else:  # adagrad
        s = s + g * g
    return (g / (s.sqrt() + eps)).square().sum()


@reference("optimizer_update_32bit")
@torch.no_grad()
def optimizer_update_32bit(
    optimizer_name: str,
    g: torch.Tensor,
    p: torch.Tensor,
    state1: torch.Tensor,
    state2: torch.Tensor | None,
    unorm_vec: torch.Tensor | None,
    max_unorm: float,
    param_norm: float,
    beta1: float,
    beta2: float,
    beta3: float,
    alpha: float,
    eps: float,
    weight_decay: float,
    step: int,
    lr: float,
    gnorm_scale: float,
    skip_zeros: bool = False,
) -> None:
    check_optimizer_update_32bit(
        optimizer_name, g, p, state1, state2, unorm_vec, max_unorm, param_norm, beta1, beta2, beta3, alpha, eps,
        weight_decay, step, lr, gnorm_scale, skip_zeros,
    )  # fmt: skip
    rule = _RULE[optimizer_name]
    n = p.numel()
    g32 = g.reshape(-1).float() * gnorm_scale
    p32 = p.reshape(-1).float()
    if rule == "ademamix":
        old = [*state1.reshape(2, n), state2.reshape(-1)]
    elif rule == "adam":
        old = [state1.reshape(-1), state2.reshape(-1)]
    else:
        old = [state1.reshape(-1)]

    update_scale: torch.Tensor | float = 1.0
    new_unorm = None
    if max_unorm > 0.0:
        if rule != "lion":
            new_unorm = _squared_update_norm(rule, g32, old, beta1, beta2, eps, step)
        # Lion scales with the norm stored by its previous step (upstream computes it after the update).
        unorm = unorm_vec.reshape(()).float() if rule == "lion" else new_unorm
        limit = max_unorm * param_norm + (eps if rule in _ONE_STATE else 0.0)
        current = unorm.sqrt()
        # torch.where rather than a Python `if`: no device-to-host sync.
        update_scale = torch.where(current > limit, limit / current, torch.ones_like(current))

    new_p, new = _step(rule, g32, p32, old, beta1, beta2, beta3, alpha, eps, weight_decay, step, lr, update_scale)

    if max_unorm > 0.0 and rule == "lion":
        new_unorm = (beta2 * new[0] + (1.0 - beta2) * g32).sum()
    if skip_zeros:
        keep = g.reshape(-1) == 0
        new_p = torch.where(keep, p32, new_p)
        new = [torch.where(keep, o, s) for o, s in zip(old, new, strict=True)]

    # All results exist before the first write.
    p.copy_(new_p.view(p.shape))
    if rule == "ademamix":
        state1.copy_(torch.stack(new[:2]).view(state1.shape))
        state2.copy_(new[2].view(state2.shape))
    else:
        state1.copy_(new[0].view(state1.shape))
        if rule == "adam":
            state2.copy_(new[1].view(state2.shape))
    if new_unorm is not None:
        unorm_vec.copy_(new_unorm.view(unorm_vec.shape))


# ---------------------------------------------------------------------------------------------------
# 8-bit blockwise state


def _blocks(x: torch.Tensor) -> torch.Tensor:
    """Flat ``x`` as rows of OPTIMIZER_BLOCKSIZE, the last one zero-padded (zeros do not change a block's absmax)."""
    pad = -x.numel() % OPTIMIZER_BLOCKSIZE
    return torch.nn.functional.pad(x, (0, pad)).view(-1, OPTIMIZER_BLOCKSIZE)


def _dequantize(codes: torch.Tensor, absmax: torch.Tensor, qmap: torch.Tensor) -> torch.Tensor:
    n = codes.numel()
    values = qmap.reshape(-1).float()[codes.reshape(-1).long()]
    return (_blocks(values) * absmax.reshape(-1, 1).float()).reshape(-1)[:n]


def _quantize(x: torch.Tensor, qmap: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat fp32 ``x`` -> (uint8 codes, fp32 absmax per block of 256).

    The new state is stored exactly as quantize_blockwise would store it (same scaling, same
    nearest-code rule), so an optimizer state and a quantized tensor share one format definition.
    """
    absmax, scaled = block_absmax_and_scale(x, OPTIMIZER_BLOCKSIZE)
    return nearest_code(scaled, qmap).to(torch.uint8), absmax


@reference("optimizer_update_8bit_blockwise")
@torch.no_grad()
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
    weight_decay: float,
    gnorm_scale: float,
    skip_zeros: bool = False,
) -> None:
    check_optimizer_update_8bit_blockwise(
        optimizer_name, g, p, state1, state2, beta1, beta2, beta3, alpha, eps, step, lr, qmap1, qmap2, absmax1,
        absmax2, weight_decay, gnorm_scale, skip_zeros,
    )  # fmt: skip
    rule = _RULE[optimizer_name]
    n = p.numel()
    # (codes, absmax, qmap) of each state, in the order _step expects them.
    if rule == "ademamix":
        codes1, scales1 = state1.reshape(2, n), absmax1.reshape(2, -1)
        quantized = [(codes1[0], scales1[0], qmap1), (codes1[1], scales1[1], qmap1), (state2, absmax2, qmap2)]
    elif rule == "adam":
        quantized = [(state1, absmax1, qmap1), (state2, absmax2, qmap2)]
    else:
        quantized = [(state1, absmax1, qmap1)]
    old = [_dequantize(codes, absmax, qmap) for codes, absmax, qmap in quantized]

    g32 = g.reshape(-1).float() * gnorm_scale
    p32 = p.reshape(-1).float()
    new_p, new = _step(rule, g32, p32, old, beta1, beta2, beta3, alpha, eps, weight_decay, step, lr, 1.0)
    if skip_zeros:
        keep = g.reshape(-1) == 0
        new_p = torch.where(keep, p32, new_p)
        new = [torch.where(keep, o, s) for o, s in zip(old, new, strict=True)]

    requantized = [_quantize(s, qmap) for s, (_, _, qmap) in zip(new, quantized, strict=True)]

    # All results exist before the first write.
    p.copy_(new_p.view(p.shape))
    if rule == "ademamix":
        (m1, a1), (m2, a2), (nu, a3) = requantized
        state1.copy_(torch.stack([m1, m2]).view(state1.shape))
        absmax1.copy_(torch.stack([a1, a2]).view(absmax1.shape))
        state2.copy_(nu.view(state2.shape))
        absmax2.copy_(a3.view(absmax2.shape))
    else:
        state1.copy_(requantized[0][0].view(state1.shape))
        absmax1.copy_(requantized[0][1].view(absmax1.shape))
        if rule == "adam":
            state2.copy_(requantized[1][0].view(state2.shape))
            absmax2.copy_(requantized[1][1].view(absmax2.shape))
