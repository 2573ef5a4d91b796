"""Bit-exact checks of the blockwise and fourbit ops against the reference, shared by their test files."""

from __future__ import annotations

import torch

from bitsandbytes._reference import REFERENCE
from bitsandbytes.testing.compare import assert_equal
from bitsandbytes_cuda.ops import blockwise, fourbit


def same_nans(actual: torch.Tensor, expected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Both with every NaN where both have one replaced by 0: NaN payloads are not part of the format (a
    GPU converts NaN to fp16 as 0x7fff, torch on a CPU as 0x7e00), everything else is compared bit for bit."""
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
    """A full block and a short last block whose values are midpoints times ``absmax``: scaled by the
    full-block rule (multiply by 1 / absmax) or the last-block rule (divide) they land on the midpoint
    (a tie) or one ulp off it, depending on the rule; so each block checks that the kernel uses its rule."""
    block = torch.cat([torch.tensor([absmax]), mids * absmax])
    block = torch.cat([block, torch.zeros(blocksize - block.numel())])
    a = torch.tensor(absmax)
    x = mids * absmax
    multiply, divide = x * (1.0 / a) == mids, x / a == mids
    assert (multiply & ~divide).any() and (divide & ~multiply).any(), "each rule must make ties the other does not"
    return torch.cat([block, block[: mids.numel()]])


def raises_as_the_reference(op: str, impl, args: tuple) -> None:
    """``impl(*args)`` raises what the reference kernel of ``op`` raises, with the same message."""
    import re

    import pytest

    with pytest.raises((TypeError, ValueError)) as ref:
        REFERENCE[op](*args)
    with pytest.raises(type(ref.value), match=re.escape(str(ref.value))):
        impl(*args)
