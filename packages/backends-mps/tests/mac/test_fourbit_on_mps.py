"""On an Apple Silicon Mac: fourbit.metal's kernels, compiled by Apple's compiler and run on the GPU,
give the bytes the reference gives on cpu. This is what the emulator cannot show: that fast math (if the
library was compiled with it) leaves the scaling, the NaN tests and the nearest-code compares alone."""

from __future__ import annotations

import pytest
import torch
from on_mps_checks import DTYPES, same, special_input

from bitsandbytes._reference import REFERENCE
from bitsandbytes_mps.ops import fourbit

pytestmark = pytest.mark.skipif(not torch.backends.mps.is_available(), reason="needs an Apple Silicon GPU (MPS)")


@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
@pytest.mark.parametrize("blocksize", [32, 64, 256, 4096])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_4bit_bytes_on_mps(dtype, blocksize, quant_type):
    A = special_input(dtype)[:, :999]  # odd count: the padding nibble
    packed, absmax = fourbit.quantize_4bit(A.to("mps"), blocksize, quant_type, torch.uint8)
    rpacked, rabsmax = REFERENCE["quantize_4bit"](A, blocksize, quant_type, torch.uint8)
    same(packed, rpacked)
    same(absmax, rabsmax)
    got = fourbit.dequantize_4bit(packed, absmax, blocksize, quant_type, list(A.shape), dtype)
    same(got, REFERENCE["dequantize_4bit"](rpacked, rabsmax, blocksize, quant_type, list(A.shape), dtype))
