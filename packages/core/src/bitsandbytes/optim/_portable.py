"""Conversion between 8-bit blockwise optimizer state and its portable form (fp32 values, no block data).

8-bit state is codes plus one absmax per block of 256 elements of the *local* tensor, so it only means
something for one sharding. The portable form is the decoded fp32 state, which any sharding can cut up and
encode again with its own blocks.

Decoding uses the state's map with its most negative entry read as -1.0. That entry stands for the values
nearest -1 after scaling by the block's absmax, and the maps have no -1.0 itself, so an element that *was*
-absmax (the block's extreme) is stored as code min. Decoding it back to -absmax makes encode(decode(x))
reproduce x's codes and absmax exactly (the absmax of every block is again one of its decoded values),
which is what lets a checkpoint resume bit-identically on the same sharding. Other elements decode to the
map's values as the optimizer kernels read them; blocks whose absmax is subnormal-small may lose bits.
"""

from __future__ import annotations

import torch

from .. import functional as F
from .._ops import OPTIMIZER_BLOCKSIZE


def _decoding_map(qmap: torch.Tensor) -> torch.Tensor:
    qmap = qmap.float().clone()
    lowest = int(torch.argmin(qmap))
    if qmap[lowest] < 0:
        qmap[lowest] = -1.0
    return qmap


def decode(codes: torch.Tensor, absmax: torch.Tensor, qmap: torch.Tensor, stack: int = 1) -> torch.Tensor:
    """fp32 values of 8-bit state ``codes`` (``[stack, ...]`` with ``absmax`` ``[stack, blocks]`` when stacked)."""
    qmap = _decoding_map(qmap).to(codes.device)
    if stack > 1:
        return torch.stack([decode(codes[i], absmax[i], qmap) for i in range(stack)])
    return F.dequantize_blockwise(codes, absmax=absmax, code=qmap, blocksize=OPTIMIZER_BLOCKSIZE)


def encode(values: torch.Tensor, qmap: torch.Tensor, stack: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, absmax) of fp32 ``values`` with blocks of 256 over each (stacked) state, as the kernels lay them."""
    values = values.float().contiguous()
    if stack > 1:
        parts = [encode(values[i], qmap) for i in range(stack)]
        return torch.stack([c for c, _ in parts]), torch.stack([a for _, a in parts])
    codes, quant_state = F.quantize_blockwise(values, code=qmap.to(values.device), blocksize=OPTIMIZER_BLOCKSIZE)
    return codes, quant_state.absmax.float()
