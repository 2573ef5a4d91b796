"""What the quantizer tests share (test_blockwise.py, test_fourbit.py): the (dtype, blocksize, shape) cases
and the comparisons of our op's bytes against the reference's."""

from __future__ import annotations

import torch

from bitsandbytes._reference import REFERENCE
from bitsandbytes.testing.cases import blockwise_cases, dtype_id
from bitsandbytes.testing.compare import assert_equal
from bitsandbytes_mps.ops import blockwise, fourbit

CASES = list(blockwise_cases())
CASE_IDS = [f"{dtype_id(d)}-b{b}-{'x'.join(map(str, s))}" for d, b, s in CASES]


def same_nans(actual: torch.Tensor, expected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Both with every NaN where both have one replaced by 0: NaN payloads are not part of the format."""
    both = actual.isnan() & expected.isnan()
    return actual.masked_fill(both, 0), expected.masked_fill(both, 0)


def check_blockwise(A, code, blocksize, dtype=None):
    """quantize_blockwise and its dequantization (to ``dtype``, default A's) equal the reference's bytes."""
    q, absmax = blockwise.quantize_blockwise(A, code, blocksize)
    rq, rabsmax = REFERENCE["quantize_blockwise"](A, code, blocksize)
    assert_equal(q, rq, "codes")
    assert_equal(absmax, rabsmax, "absmax")
    dtype = dtype or A.dtype
    out = blockwise.dequantize_blockwise(q, absmax, code, blocksize, dtype)
    ref = REFERENCE["dequantize_blockwise"](rq, rabsmax, code, blocksize, dtype)
    assert_equal(*same_nans(out, ref), "dequantized")


def check_4bit(A, blocksize, quant_type, dtype=None, storage=torch.uint8):
    """quantize_4bit and its dequantization equal the reference's bytes."""
    packed, absmax = fourbit.quantize_4bit(A, blocksize, quant_type, storage)
    rpacked, rabsmax = REFERENCE["quantize_4bit"](A, blocksize, quant_type, storage)
    assert_equal(packed, rpacked, "packed codes")
    assert_equal(absmax, rabsmax, "absmax")
    dtype = dtype or A.dtype
    out = fourbit.dequantize_4bit(packed, absmax, blocksize, quant_type, list(A.shape), dtype)
    ref = REFERENCE["dequantize_4bit"](rpacked, rabsmax, blocksize, quant_type, list(A.shape), dtype)
    assert_equal(*same_nans(out, ref), "dequantized")


def on_midpoints(mids: torch.Tensor, blocksize: int, absmax: float) -> torch.Tensor:
    """A full block and a short last block of midpoints times ``absmax``: the full-block rule (multiply by
    1 / absmax) and the last-block rule (divide) put different values exactly on a midpoint (a tie), so
    each block checks that the kernel uses its rule."""
    block = torch.cat([torch.tensor([absmax]), mids * absmax])
    block = torch.cat([block, torch.zeros(blocksize - block.numel())])
    a = torch.tensor(absmax)
    x = mids * absmax
    multiply, divide = x * (1.0 / a) == mids, x / a == mids
    assert (multiply & ~divide).any() and (divide & ~multiply).any(), "each rule must make ties the other does not"
    return torch.cat([block, block[: mids.numel()]])
