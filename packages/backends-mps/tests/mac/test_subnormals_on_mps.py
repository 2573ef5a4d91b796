"""On an Apple Silicon Mac: blocks of subnormal values through the quant kernels meet the documented
contract (bitsandbytes_mps.testing.subnormals): every absmax, and the codes of every block whose absmax is
subnormal, are the reference's; dequantized values are the flushed input's or within 2**-126 of the
reference's; float16 input is bit-exact. The emulator checks the same assertion with BNB_EMU_METAL_FTZ=1
(tests/test_emulator_modes.py); here it is the hardware's own flushing."""

from __future__ import annotations

import pytest
import torch

from bitsandbytes import functional
from bitsandbytes._reference import REFERENCE
from bitsandbytes_mps.ops import blockwise, fourbit
from bitsandbytes_mps.testing.subnormals import assert_subnormal_contract, subnormal_blocks

pytestmark = pytest.mark.skipif(not torch.backends.mps.is_available(), reason="needs an Apple Silicon GPU (MPS)")

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _blockwise(code, blocksize, on_mps):
    def run(A):
        c = code.to(A.device)
        if on_mps:
            q, absmax = blockwise.quantize_blockwise(A, c, blocksize)
            return [q, absmax, blockwise.dequantize_blockwise(q, absmax, c, blocksize, A.dtype)]
        q, absmax = REFERENCE["quantize_blockwise"](A, c, blocksize)
        return [q, absmax, REFERENCE["dequantize_blockwise"](q, absmax, c, blocksize, A.dtype)]

    return run


def _fourbit(blocksize, quant_type, on_mps):
    def run(A):
        if on_mps:
            packed, absmax = fourbit.quantize_4bit(A, blocksize, quant_type, torch.uint8)
            deq = fourbit.dequantize_4bit(packed, absmax, blocksize, quant_type, list(A.shape), A.dtype)
        else:
            packed, absmax = REFERENCE["quantize_4bit"](A, blocksize, quant_type, torch.uint8)
            deq = REFERENCE["dequantize_4bit"](packed, absmax, blocksize, quant_type, list(A.shape), A.dtype)
        return [packed, absmax, deq]

    return run


@pytest.mark.parametrize("blocksize", [64, 256])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_subnormal_blocks_on_mps(dtype, blocksize):
    code = functional.create_dynamic_map(signed=True).float()
    A = subnormal_blocks(dtype, blocksize).to("mps")
    how = [
        assert_subnormal_contract(A, _blockwise(code, blocksize, True), _blockwise(code, blocksize, False), blocksize)
    ]
    for quant_type in ("nf4", "fp4"):
        how.append(
            assert_subnormal_contract(
                A, _fourbit(blocksize, quant_type, True), _fourbit(blocksize, quant_type, False), blocksize
            )
        )
    if dtype == torch.float16:
        assert how == ["exact"] * 3
