"""On an Apple Silicon Mac: blockwise.metal's kernels, compiled by Apple's compiler and run on the GPU,
give the bytes the reference gives on cpu. This is what the emulator cannot show: that fast math (if the
library was compiled with it) leaves the scaling, the NaN tests and the nearest-code compares alone."""

from __future__ import annotations

import pytest
import torch
from on_mps_checks import DTYPES, same, special_input

from bitsandbytes import functional
from bitsandbytes._reference import REFERENCE
from bitsandbytes_mps.ops import blockwise

pytestmark = pytest.mark.skipif(not torch.backends.mps.is_available(), reason="needs an Apple Silicon GPU (MPS)")


@pytest.mark.parametrize("blocksize", [32, 64, 256, 4096])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_blockwise_bytes_on_mps(dtype, blocksize):
    A = special_input(dtype)
    code = functional.create_dynamic_map(signed=True).float()
    q, absmax = blockwise.quantize_blockwise(A.to("mps"), code.to("mps"), blocksize)
    rq, rabsmax = REFERENCE["quantize_blockwise"](A, code, blocksize)
    same(q, rq)
    same(absmax, rabsmax)
    same(blockwise.dequantize_blockwise(q, absmax, code.to("mps"), blocksize, dtype),
          REFERENCE["dequantize_blockwise"](rq, rabsmax, code, blocksize, dtype))  # fmt: skip
