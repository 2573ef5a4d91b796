"""optimizer_update_32bit and optimizer_update_8bit_blockwise for device cuda (kernels: csrc/kernels/optimizers.cu).

The step's scalars are computed here in double, exactly as the reference computes them from Python floats,
and rounded to float32 once by the launcher; the kernels then repeat the reference's float32 operations in
its order, so p, the states and the 8-bit codes are the reference's bits (see optimizers.cuh).
"""

from __future__ import annotations

import math

import torch

from bitsandbytes import _ops

from ..launch import emulating, launch
from ..tables.optimizers import THREADS
from ._common import suffix

__all__ = ["OPS", "optimizer_update_8bit_blockwise", "optimizer_update_32bit"]

# Rule numbers of optimizers.cuh (lamb steps like adam, lars like momentum).
_RULE = {"adam": 0, "lamb": 0, "ademamix": 1, "momentum": 2, "lars": 2, "rmsprop": 3, "adagrad": 4, "lion": 5}
_ADEMAMIX, _ADAGRAD, _LION = 1, 4, 5
_ONE_STATE = ("momentum", "lars", "rmsprop", "adagrad", "lion")
_WEIGHT_DECAY, _SKIP_ZEROS, _FIRST_STEP, _SCALE_BY_UNORM, _VECTOR = 1, 2, 4, 8, 16  # kernel flags
_BLOCK = _ops.OPTIMIZER_BLOCKSIZE
assert _BLOCK == THREADS, "the 8-bit kernel runs one thread per state of a block"

# Blocks per SM that keep an SM full with 256-thread blocks (2048 threads); each block strides over the rest.
_BLOCKS_PER_SM = 8
_EMULATED_GRID = 4  # the emulator runs blocks one after another: a small grid still covers every stride path


def _grid(items: int, device: torch.device) -> int:
    """Blocks for ``items`` units of THREADS elements: all of them up to a few waves' worth, then a stride."""
    if emulating():
        cap = _EMULATED_GRID
    else:
        index = device.index if device.index is not None else torch.cuda.current_device()
        cap = _BLOCKS_PER_SM * torch.cuda.get_device_properties(index).multi_processor_count
    return max(1, min(items, cap))


def _hyper(name, flags_extra, n, beta1, beta2, beta3, alpha, eps, weight_decay, step, lr, gnorm_scale, skip_zeros):
    """The kernels' (rule, flags, n, 16 scalars) arguments, computed in double like the reference."""
    c1 = 1.0 - beta1**step
    c2 = math.sqrt(1.0 - beta2**step)
    flags = flags_extra
    flags |= _WEIGHT_DECAY if weight_decay > 0.0 else 0
    flags |= _SKIP_ZEROS if skip_zeros else 0
    flags |= _FIRST_STEP if step == 1 else 0
    return (
        _RULE[name], flags, n,
        beta1, 1.0 - beta1, beta2, 1.0 - beta2, beta3, 1.0 - beta3, alpha, eps, gnorm_scale, lr,
        weight_decay, 1.0 - lr * weight_decay, -lr * c2 / c1, eps * c2, c1, c2,
    )  # fmt: skip


# The arguments are the schema's (bitsandbytes._ops.SCHEMAS), whose check states every type.
@torch.no_grad()
def optimizer_update_32bit(
    optimizer_name, g, p, state1, state2, unorm_vec, max_unorm, param_norm, beta1, beta2,
    beta3, alpha, eps, weight_decay, step, lr, gnorm_scale, skip_zeros=False,
):  # fmt: skip
    _ops.check_optimizer_update_32bit(optimizer_name, g, p, state1, state2, unorm_vec, max_unorm, param_norm, beta1,
                                      beta2, beta3, alpha, eps, weight_decay, step, lr, gnorm_scale,
                                      skip_zeros)  # fmt: skip
    n = p.numel()
    rule = _RULE[optimizer_name]
    two = rule in (0, _ADEMAMIX)
    hyper = _hyper(optimizer_name, 0, n, beta1, beta2, beta3, alpha, eps, weight_decay, step, lr, gnorm_scale,
                   skip_zeros)  # fmt: skip
    sfx = suffix(g.dtype)
    s2 = state2 if two else None
    if max_unorm > 0.0:
        if n == 0:
            unorm_vec.zero_()  # the reference's sum over no elements
            return
        # Pass 1: partial sums, read-only. Lion scales by the norm its previous step stored, so its total
        # is written only after the step; the others are scaled by this step's norm.
        blocks = _grid(-(n // -THREADS), p.device)
        partials = torch.empty(2 * blocks, dtype=torch.float32, device=p.device)
        launch(f"optimizer_32bit_norm_{sfx}", blocks, THREADS, 0, g, state1, s2, partials, *hyper,
               1.0 - beta1**step, 1.0 - beta2**step)  # fmt: skip
        total = ("optimizer_32bit_norm_total", 1, THREADS, 0, partials, blocks, int(rule == _ADEMAMIX), unorm_vec)
        if rule != _LION:
            launch(*total)
        # adagrad and ademamix never scale their update (upstream quirks kept by the reference).
        if rule not in (_ADAGRAD, _ADEMAMIX):
            hyper = (hyper[0], hyper[1] | _SCALE_BY_UNORM, *hyper[2:])
    if n:
        # Vector loads need every buffer aligned to 4 elements (ademamix's m2 starts n floats into state1).
        quads = [g, p, state1] + ([s2] if two else [])
        if all(t.data_ptr() % (4 * t.element_size()) == 0 for t in quads) and (rule != _ADEMAMIX or n % 4 == 0):
            hyper = (hyper[0], hyper[1] | _VECTOR, *hyper[2:])
        limit = max_unorm * param_norm + (eps if optimizer_name in _ONE_STATE else 0.0)
        launch(f"optimizer_32bit_{sfx}", _grid(-(n // -THREADS), p.device), THREADS, 0, g, p, state1, s2,
               unorm_vec if max_unorm > 0.0 else None, *hyper, limit)  # fmt: skip
    if max_unorm > 0.0 and rule == _LION:
        launch(*total)


@torch.no_grad()
def optimizer_update_8bit_blockwise(
    optimizer_name, g, p, state1, state2, beta1, beta2, beta3, alpha, eps,
    step, lr, qmap1, qmap2, absmax1, absmax2, weight_decay, gnorm_scale, skip_zeros=False,
):  # fmt: skip
    _ops.check_optimizer_update_8bit_blockwise(optimizer_name, g, p, state1, state2, beta1, beta2, beta3, alpha, eps,
                                               step, lr, qmap1, qmap2, absmax1, absmax2, weight_decay, gnorm_scale,
                                               skip_zeros)  # fmt: skip
    n = p.numel()
    if n == 0:
        return
    two = _RULE[optimizer_name] in (0, _ADEMAMIX)
    # The kernel takes dense buffers; absmax may be a strided view, qmap any layout.
    a1 = absmax1.contiguous()
    a2 = absmax2.contiguous() if two else None
    q1 = qmap1.contiguous()
    q2 = qmap2.contiguous() if two else None
    hyper = _hyper(optimizer_name, 0, n, beta1, beta2, beta3, alpha, eps, weight_decay, step, lr, gnorm_scale,
                   skip_zeros)  # fmt: skip
    launch(f"optimizer_8bit_blockwise_{suffix(g.dtype)}", _grid(-(n // -_BLOCK), p.device), THREADS, 0, g, p,
           state1, state2 if two else None, a1, a2, q1, q2, *hyper)  # fmt: skip
    for dense, given in ((a1, absmax1), (a2, absmax2)):  # a strided absmax: written back through its view
        if dense is not None and dense.data_ptr() != given.data_ptr():
            given.copy_(dense.view(given.shape))


OPS = {f.__name__: f for f in (optimizer_update_32bit, optimizer_update_8bit_blockwise)}
