"""What the quantizer tests share (test_blockwise.py, test_fourbit.py): our op's bytes against the
reference's (only a dequantized NaN's payload is free)."""

from __future__ import annotations

import torch

from bitsandbytes._reference import REFERENCE
from bitsandbytes.testing.compare import assert_equal, assert_equal_up_to_nan_payload
from bitsandbytes_mps.ops import blockwise, fourbit


def check_blockwise(A, code, blocksize):
    """quantize_blockwise and its dequantization equal the reference's bytes."""
    q, absmax = blockwise.quantize_blockwise(A, code, blocksize)
    rq, rabsmax = REFERENCE["quantize_blockwise"](A, code, blocksize)
    assert_equal(q, rq, "codes")
    assert_equal(absmax, rabsmax, "absmax")
    out = blockwise.dequantize_blockwise(q, absmax, code, blocksize, A.dtype)
    ref = REFERENCE["dequantize_blockwise"](rq, rabsmax, code, blocksize, A.dtype)
    assert_equal_up_to_nan_payload(out, ref, "dequantized")


def check_4bit(A, blocksize, quant_type):
    """quantize_4bit and its dequantization equal the reference's bytes."""
    packed, absmax = fourbit.quantize_4bit(A, blocksize, quant_type, torch.uint8)
    rpacked, rabsmax = REFERENCE["quantize_4bit"](A, blocksize, quant_type, torch.uint8)
    assert_equal(packed, rpacked, "packed codes")
    assert_equal(absmax, rabsmax, "absmax")
    out = fourbit.dequantize_4bit(packed, absmax, blocksize, quant_type, list(A.shape), A.dtype)
    ref = REFERENCE["dequantize_4bit"](rpacked, rabsmax, blocksize, quant_type, list(A.shape), A.dtype)
    assert_equal_up_to_nan_payload(out, ref, "dequantized")
