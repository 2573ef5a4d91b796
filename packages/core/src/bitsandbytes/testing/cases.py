"""Case generators shared by the conformance tests (and usable by a backend's own tests).

Inputs are always made on the CPU from a seeded generator and then moved to the device under test,
so every device sees the same values. Shapes are chosen around each block size: a single element,
one short of a block, several blocks plus a tail, 2-D with a ragged last block, and empty tensors.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator

import torch
import torch.utils._pytree as pytree

from .._checks import BLOCKSIZES, FLOAT_DTYPES, QUANT_STORAGE_DTYPES, QUANT_TYPES

__all__ = [
    "BLOCKSIZES",
    "DTYPES",
    "FP4_CODE",
    "NF4_CODE",
    "NONFINITE",
    "QUANT_STORAGE_DTYPES",
    "QUANT_TYPES",
    "block_absmax",
    "blockwise_cases",
    "code_table_4bit",
    "dtype_id",
    "empty_shapes",
    "on_midpoints",
    "randn",
    "seed_of",
    "shapes_for_blocksize",
    "to",
    "unpack_4bit",
    "with_nonfinite",
    "with_zero_block",
]

DTYPES = FLOAT_DTYPES

# The 4-bit code tables, written out here (upstream 0.50's values) rather than imported, so that the
# suite checks the tables every kernel uses against an independent copy.
NF4_CODE = (
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
    -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
    0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
    0.7229568362236023, 1.0,
)  # fmt: skip
# FP4 in code order; bit 3 is the sign. Code 8 ("minus zero") is +0.0: upstream's literal is the
# integer -0, so it dequantizes to +0.0 bit for bit.
_FP4_TWELFTHS = (0.0, 0.0625, 8.0, 12.0, 4.0, 6.0, 2.0, 3.0, 0.0, -0.0625, -8.0, -12.0, -4.0, -6.0, -2.0, -3.0)
FP4_CODE = tuple(v / 12 for v in _FP4_TWELFTHS)

NONFINITE = (float("nan"), float("inf"), float("-inf"))


def dtype_id(d: torch.dtype) -> str:
    return str(d).removeprefix("torch.")


def randn(shape, dtype: torch.dtype = torch.float32, seed: int = 0, device="cpu", spread: bool = True) -> torch.Tensor:
    """Normal values; with ``spread`` the magnitude varies by orders of magnitude along the tensor, so
    blocks get very different scales (and the small-magnitude codes of the dynamic map get used)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float32)
    if spread and x.numel():
        flat = x.view(-1)
        flat *= torch.logspace(-3, 2, flat.numel(), dtype=torch.float32)[torch.randperm(flat.numel(), generator=g)]
    return x.to(dtype).to(device)


def shapes_for_blocksize(blocksize: int) -> list[tuple[int, ...]]:
    """Odd shapes around ``blocksize``: one element, one short of a block, blocks plus a tail, 2-D."""
    return [(1,), (blocksize - 1,), (3 * blocksize + 5,), (5, blocksize // 4 + 3)]


def empty_shapes() -> list[tuple[int, ...]]:
    return [(0,), (0, 7), (3, 0)]


def blockwise_cases(dtypes=DTYPES, blocksizes=BLOCKSIZES) -> Iterator[tuple[torch.dtype, int, tuple[int, ...]]]:
    for dtype in dtypes:
        for blocksize in blocksizes:
            for shape in shapes_for_blocksize(blocksize):
                yield dtype, blocksize, shape


def with_zero_block(x: torch.Tensor, blocksize: int, block: int = 1) -> torch.Tensor:
    """A copy of ``x`` whose ``block``-th block (of the flattened tensor) is all zeros."""
    y = x.clone()
    y.view(-1)[block * blocksize : (block + 1) * blocksize] = 0
    return y


def with_nonfinite(x: torch.Tensor, blocksize: int, value: float, block: int = 1, offset: int = 3) -> torch.Tensor:
    """A copy of ``x`` with one non-finite ``value`` inside its ``block``-th block."""
    y = x.clone()
    y.view(-1)[block * blocksize + offset] = value
    return y


def block_absmax(x: torch.Tensor, blocksize: int) -> torch.Tensor:
    """max |x| per block of the flattened tensor, in float64 (exact for any float input), on the CPU."""
    flat = x.detach().cpu().double().reshape(-1).abs()
    n = flat.numel()
    pad = -n % blocksize
    # Padding with zeros cannot change a max of absolute values; NaN propagates through amax.
    flat = torch.cat([flat, flat.new_zeros(pad)])
    return flat.view(-1, blocksize).amax(dim=1) if n else flat.new_zeros(0)


def code_table_4bit(quant_type: str) -> torch.Tensor:
    """The 16-entry fp32 table of ``quant_type``; FP4 divided by 12 in fp32, as upstream builds it."""
    if quant_type == "nf4":
        return torch.tensor(NF4_CODE, dtype=torch.float32)
    return torch.tensor(_FP4_TWELFTHS, dtype=torch.float32) / 12


def seed_of(*params) -> int:
    """A stable seed per test case, so each case has its own values and reruns see the same ones."""
    return zlib.crc32(repr(params).encode())


def to(tree, device):
    """Every tensor in a (nested) tuple/list/dict moved to ``device`` (a copy, even when already there)."""
    return pytree.tree_map_only(torch.Tensor, lambda t: t.detach().to(device, copy=True), tree)


def unpack_4bit(packed: torch.Tensor, n: int) -> torch.Tensor:
    """The ``n`` 4-bit codes in a packed tensor (any storage dtype), first value from the high nibble."""
    raw = packed.detach().cpu().contiguous().view(-1).view(torch.uint8).long()
    codes = torch.stack([raw >> 4, raw & 0xF], dim=1).reshape(-1)
    return codes[:n]


def on_midpoints(mids: torch.Tensor, blocksize: int, absmax: float) -> torch.Tensor:
    """A full block and a short last block whose values are ``mids * absmax`` (after a first value of
    ``absmax``). Scaled by the full-block rule (multiply by ``1 / absmax``) or the last-block rule (divide
    by ``absmax``), a value lands on its midpoint (a tie) or one ulp off it depending on the rule, so each
    block checks that a kernel scales it by its own rule."""
    block = torch.cat([torch.tensor([absmax]), mids * absmax])
    block = torch.cat([block, torch.zeros(blocksize - block.numel())])
    a = torch.tensor(absmax)
    x = mids * absmax
    multiply, divide = x * (1.0 / a) == mids, x / a == mids
    if not ((multiply & ~divide).any() and (divide & ~multiply).any()):
        raise ValueError(f"absmax {absmax}: each scaling rule must make ties the other does not")
    return torch.cat([block, block[: mids.numel()]])
