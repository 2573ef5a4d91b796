"""Sharded (DTensor) parameters, as FSDP2 ``fully_shard`` gives them to the optimizer.

The update of a sharded parameter runs on its local shard, with state allocated per local shard, so an
8-bit state costs about 1/world of the whole on each rank. Only what needs the whole tensor (the gradient
norm of percentile clipping, the layout of a checkpoint) looks past the shard, through the parameter's
device mesh. ``torch.distributed.tensor`` is never imported here: if nobody has imported it, no tensor can
be a DTensor, so single-process use pays nothing.
"""

from __future__ import annotations

import sys
from typing import Any

import torch


def dtensor_type() -> type | None:
    module = sys.modules.get("torch.distributed.tensor")
    return getattr(module, "DTensor", None) if module is not None else None


def is_dtensor(t: Any) -> bool:
    cls = dtensor_type()
    return cls is not None and isinstance(t, cls)


def local(t: torch.Tensor) -> torch.Tensor:
    """The rank's own part of ``t`` (``t`` itself for a plain tensor); writes to it reach ``t``."""
    return t.to_local() if is_dtensor(t) else t


def is_split(p: torch.Tensor) -> bool:
    """Whether ``p`` is a DTensor whose elements are divided between ranks (not every rank holds them all)."""
    if not is_dtensor(p):
        return False
    mesh = p.device_mesh
    return any(not pl.is_replicate() and mesh.size(dim) > 1 for dim, pl in enumerate(p.placements))


def stacked_placements(p: torch.Tensor, stack: int) -> tuple:
    """``p``'s placements for a state of shape ``[stack, *p.shape]`` (the AdEMAMix stack adds dimension 0)."""
    from torch.distributed.tensor import Replicate, Shard

    if stack == 1:
        return tuple(p.placements)
    out = []
    for pl in p.placements:
        if pl.is_replicate():
            out.append(Replicate())
        elif type(pl) is Shard:
            out.append(Shard(pl.dim + 1))
        else:
            raise NotImplementedError(f"stacked optimizer state of a parameter placed as {pl} is not supported")
    return tuple(out)


def _state_shape(p: torch.Tensor, stack: int) -> tuple[int, ...]:
    return (stack, *p.shape) if stack > 1 else tuple(p.shape)


def as_dtensor(local_state: torch.Tensor, p: torch.Tensor, stack: int = 1) -> torch.Tensor:
    """The rank's ``local_state`` (shaped like ``p``'s local shard) as a DTensor laid out like ``p``."""
    from torch.distributed.tensor import DTensor

    shape = _state_shape(p, stack)
    stride = torch.empty(shape, device="meta").stride()
    return DTensor.from_local(
        local_state, p.device_mesh, stacked_placements(p, stack), run_check=False, shape=shape, stride=stride
    )


def local_part(full: torch.Tensor, p: torch.Tensor, stack: int = 1) -> torch.Tensor:
    """The part of ``full`` (a whole state, shaped like ``p`` or ``[stack, *p.shape]``) that this rank holds."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    shape, offset = compute_local_shape_and_global_offset(full.shape, p.device_mesh, stacked_placements(p, stack))
    return full[tuple(slice(o, o + n) for n, o in zip(shape, offset, strict=True))]


def check_reduced(grad: torch.Tensor) -> None:
    """Raise unless the DTensor ``grad`` holds final values (no pending ``Partial`` reduction)."""
    if is_dtensor(grad) and any(pl.is_partial() for pl in grad.placements):
        raise ValueError(
            "the gradient of a sharded parameter must be reduced (Shard or Replicate placements) before the "
            f"optimizer step, got placements {tuple(grad.placements)}"
        )


def global_squared_norm(grad: torch.Tensor) -> torch.Tensor:
    """The squared L2 norm of the whole of the DTensor ``grad`` (0-dim fp32, the same on every rank)."""
    from torch.distributed.tensor import DTensor, Partial, Replicate

    check_reduced(grad)
    placements = [Replicate() if pl.is_replicate() else Partial("sum") for pl in grad.placements]
    squared = grad.to_local().float().square().sum()
    # Partial over the sharded mesh dimensions: full_tensor() sums the ranks' parts (one all-reduce).
    return DTensor.from_local(squared, grad.device_mesh, placements, run_check=False).full_tensor()


def agree(flag: bool, p: torch.Tensor) -> bool:
    """Whether ``flag`` is the same on every rank of ``p``'s device mesh (a collective over that mesh)."""
    import torch.distributed as dist

    mesh = p.device_mesh
    t = torch.tensor([int(flag), -int(flag)], dtype=torch.int32, device=p.to_local().device)
    for dim in range(mesh.ndim):
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=mesh.get_group(dim))
    return int(t[0]) == -int(t[1])
