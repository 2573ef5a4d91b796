"""The fourbit family's CUDA kernels (csrc/kernels/fourbit.cu): what is particular to them.

Their bytes against the reference (every dtype, block size, shape and storage, ties and signed zeros, the
two scaling rules, non-finite input, empty tensors, .out) are the shipped suite's
``conformance/test_fourbit.py``, run on these kernels by the emulated session. Here, with ``launch`` in
emulator mode: the grid-stride loops both quant families share (their errors: the suite's bad-input matrix).
"""

from __future__ import annotations

import pytest
import torch

from bitsandbytes._reference import REFERENCE
from bitsandbytes.testing.cases import randn, seed_of
from bitsandbytes.testing.compare import assert_equal
from bitsandbytes_cuda.ops import blockwise, fourbit

pytestmark = pytest.mark.usefixtures("emulated")  # conftest: launch() in the emulator


@pytest.mark.parametrize("blocksize", [32, 256, 4096])
def test_grid_stride(monkeypatch, code, blocksize):
    """With the grid capped at 2 blocks, the kernels of both families loop over the rest (as on a large
    tensor on a GPU): the reference's bytes still."""
    monkeypatch.setattr(blockwise, "MAX_GRID", 2)  # the geometry of both families
    A = randn((7 * blocksize + 3,), torch.bfloat16, seed_of("stride", blocksize))
    quantized = {
        "quantize_blockwise": (blockwise.quantize_blockwise, (A, code, blocksize)),
        "quantize_4bit": (fourbit.quantize_4bit, (A, blocksize, "nf4", torch.uint8)),
    }
    for op, (ours, args) in quantized.items():
        (q, absmax), (rq, rabsmax) = ours(*args), REFERENCE[op](*args)
        assert_equal(q, rq, f"{op}: codes")
        assert_equal(absmax, rabsmax, f"{op}: absmax")
        dequantized = {
            "dequantize_blockwise": (blockwise.dequantize_blockwise, (q, absmax, code, blocksize, A.dtype)),
            "dequantize_4bit": (fourbit.dequantize_4bit, (q, absmax, blocksize, "nf4", list(A.shape), A.dtype)),
        }
        back, dargs = dequantized[op.replace("quantize", "dequantize")]
        assert_equal(back(*dargs), REFERENCE[op.replace("quantize", "dequantize")](*dargs), f"{op}: dequantized")
