"""optimizer_update_32bit and optimizer_update_8bit_blockwise for device mps (kernels: metal/optimizers.metal).

The step's scalars are computed here in double, as the reference computes them from Python floats, and bound
as one float32 array (torch rounds each value once); the kernels repeat the reference's float32 operations
in its order. In emulation that gives the reference's bits for p, the states and the 8-bit codes; on Apple
GPUs the compiler may fuse a multiply-add, so there the results agree within a few float32 ulps.

Paged optimizer states need nothing here: on unified memory a paged tensor is an ordinary one (the core's
paged fallback hands these ops plain tensors).
"""

from __future__ import annotations

import math

import torch

from bitsandbytes import _ops
from bitsandbytes._reference import optimizers as _reference

from ..library import dispatch, emulating
from ..tables.optimizers import SOURCE, THREADS
from ._common import native, placeholder, suffix

__all__ = ["OPS", "SOURCES", "optimizer_update_8bit_blockwise", "optimizer_update_32bit"]

SOURCES = (SOURCE,)

# Rule numbers and flag bits of optimizers.metal (lamb steps like adam, lars like momentum).
_RULE = {"adam": 0, "lamb": 0, "ademamix": 1, "momentum": 2, "lars": 2, "rmsprop": 3, "adagrad": 4, "lion": 5}
_ADAM, _ADEMAMIX, _ADAGRAD, _LION = 0, 1, 4, 5
_ONE_STATE = ("momentum", "lars", "rmsprop", "adagrad", "lion")
_WEIGHT_DECAY, _SKIP_ZEROS, _FIRST_STEP, _SCALE_BY_UNORM = 1, 2, 4, 8
assert _ops.OPTIMIZER_BLOCKSIZE == THREADS, "the 8-bit kernel runs one thread per state of a block"

# Threadgroups that stride over the data when there is more than this many blocks of work: enough to fill
# the largest Apple GPU (80 cores) several times over. The emulator runs threadgroups one after another,
# so a small grid there still covers the strided paths.
_GROUPS_CAP = 1024
_EMULATED_GROUPS_CAP = 4


def _groups(items: int) -> int:
    """Threadgroups for ``items`` units of THREADS elements (at least one)."""
    return max(1, min(items, _EMULATED_GROUPS_CAP if emulating() else _GROUPS_CAP))


def _second_placeholder(device: torch.device) -> torch.Tensor:
    """A float32 placeholder distinct from ``placeholder(device)``, for a call with two absent float buffers
    (one buffer bound twice is fine for Metal, but the emulator rightly refuses aliased arguments)."""
    return placeholder(device, torch.int32).view(torch.float32)


def _hyper(beta1, beta2, beta3, alpha, eps, weight_decay, step, lr, gnorm_scale) -> list[float]:
    """The 16 scalars of the ``h*`` indices in optimizers.metal, computed in double like the reference."""
    c1 = 1.0 - beta1**step
    c2 = math.sqrt(1.0 - beta2**step)
    return [
        beta1, 1.0 - beta1, beta2, 1.0 - beta2, beta3, 1.0 - beta3, alpha, eps, gnorm_scale, lr,
        weight_decay, 1.0 - lr * weight_decay, -lr * c2 / c1, eps * c2, c1, c2,
    ]  # fmt: skip


def _flags(weight_decay: float, step: int, skip_zeros: bool) -> int:
    flags = _WEIGHT_DECAY if weight_decay > 0.0 else 0
    return flags | (_SKIP_ZEROS if skip_zeros else 0) | (_FIRST_STEP if step == 1 else 0)


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
    _ops.check_optimizer_update_32bit(
        optimizer_name, g, p, state1, state2, unorm_vec, max_unorm, param_norm, beta1, beta2, beta3, alpha, eps,
        weight_decay, step, lr, gnorm_scale, skip_zeros,
    )  # fmt: skip
    n = p.numel()
    sfx = suffix(g.dtype)
    if not (native(f"optimizer_32bit_{sfx}", n) and (max_unorm <= 0.0 or native(f"optimizer_32bit_norm_{sfx}"))):
        return _reference.optimizer_update_32bit(
            optimizer_name, g, p, state1, state2, unorm_vec, max_unorm, param_norm, beta1, beta2, beta3, alpha, eps,
            weight_decay, step, lr, gnorm_scale, skip_zeros,
        )  # fmt: skip
    rule = _RULE[optimizer_name]
    dev = p.device
    hyper = _hyper(beta1, beta2, beta3, alpha, eps, weight_decay, step, lr, gnorm_scale)
    flags = _flags(weight_decay, step, skip_zeros)
    s2 = state2 if rule in (_ADAM, _ADEMAMIX) else placeholder(dev)
    if max_unorm > 0.0:
        if n == 0:
            unorm_vec.zero_()  # the reference's sum over no elements
            return
        # Pass 1: partial sums, read-only; pass 2 adds them up. Lion scales by the norm its previous step
        # stored, so its new total is written only after the step; the others scale by this step's norm.
        groups = _groups(-(n // -THREADS))
        partials = torch.empty(2 * groups, dtype=torch.float32, device=dev)
        norm_hyper = [*hyper, 1.0 - beta1**step, 1.0 - beta2**step]
        dispatch(f"optimizer_32bit_norm_{sfx}", g, state1, s2, partials, norm_hyper, [rule, flags, n],
                 threads=groups * THREADS, group_size=THREADS)  # fmt: skip
        # Lion's new total goes to a scratch buffer before the step and is copied in after it: the step
        # stays the call's last kernel, so a failure of any kernel leaves the state as it was and the
        # reference can redo the whole call (ops.falling_back).
        new_unorm = torch.empty_like(unorm_vec) if rule == _LION else unorm_vec
        dispatch("optimizer_32bit_norm_total", partials, new_unorm, [groups, int(rule == _ADEMAMIX)],
                 threads=THREADS, group_size=THREADS)  # fmt: skip
        # adagrad and ademamix never scale their update (upstream quirks the reference keeps).
        if rule not in (_ADAGRAD, _ADEMAMIX):
            flags |= _SCALE_BY_UNORM
    if n:
        limit = max_unorm * param_norm + (eps if optimizer_name in _ONE_STATE else 0.0)
        unorm = unorm_vec if flags & _SCALE_BY_UNORM else _second_placeholder(dev)
        dispatch(f"optimizer_32bit_{sfx}", g, p, state1, s2, unorm, [*hyper, limit], [rule, flags, n],
                 threads=n, group_size=min(n, THREADS))  # fmt: skip
    if max_unorm > 0.0 and rule == _LION:
        unorm_vec.copy_(new_unorm)


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
    _ops.check_optimizer_update_8bit_blockwise(
        optimizer_name, g, p, state1, state2, beta1, beta2, beta3, alpha, eps, step, lr, qmap1, qmap2, absmax1,
        absmax2, weight_decay, gnorm_scale, skip_zeros,
    )  # fmt: skip
    n = p.numel()
    if n == 0:
        return
    groups = _groups(-(n // -THREADS))
    name = f"optimizer_8bit_blockwise_{suffix(g.dtype)}"
    if not native(name, groups * THREADS):
        return _reference.optimizer_update_8bit_blockwise(
            optimizer_name, g, p, state1, state2, beta1, beta2, beta3, alpha, eps, step, lr, qmap1, qmap2, absmax1,
            absmax2, weight_decay, gnorm_scale, skip_zeros,
        )  # fmt: skip
    dev = p.device
    two = _RULE[optimizer_name] in (_ADAM, _ADEMAMIX)
    # The kernel takes dense buffers; absmax may be a strided view (written back below), qmap any layout.
    a1 = absmax1.contiguous()
    q1 = qmap1.contiguous()
    if two:
        s2, a2, q2 = state2, absmax2.contiguous(), qmap2.contiguous()
        if q2.data_ptr() == q1.data_ptr():  # one map for both states: bind two buffers, not one twice
            q2 = q2.clone()
    else:
        s2, a2, q2 = placeholder(dev, torch.uint8), placeholder(dev), _second_placeholder(dev)
    hyper = _hyper(beta1, beta2, beta3, alpha, eps, weight_decay, step, lr, gnorm_scale)
    config = [_RULE[optimizer_name], _flags(weight_decay, step, skip_zeros), n]
    dispatch(name, g, p, state1, s2, a1, a2, q1, q2, hyper, config, threads=groups * THREADS, group_size=THREADS)
    if a1.data_ptr() != absmax1.data_ptr():
        absmax1.copy_(a1.view(absmax1.shape))
    if two and a2.data_ptr() != absmax2.data_ptr():
        absmax2.copy_(a2.view(absmax2.shape))


OPS = {
    "optimizer_update_32bit": optimizer_update_32bit,
    "optimizer_update_8bit_blockwise": optimizer_update_8bit_blockwise,
}
