"""The blockwise family's CUDA kernels (csrc/kernels/blockwise.cu): what is particular to them.

Their bytes against the reference (every dtype, block size and shape, ties, the two scaling rules, unsorted
maps, non-finite input, empty tensors, .out) are the shipped suite's ``conformance/test_blockwise.py``, which
the emulated session runs on these kernels (``-p bitsandbytes_cuda.testing.emulated``). Here, with
``launch`` in emulator mode: the map preparation kernel and the launch geometry (their errors: the suite's
bad-input matrix).
That blockwise.cu builds with nvcc (warnings as errors) is test_launch.py's library build.
"""

from __future__ import annotations

import pytest
import torch

from bitsandbytes.testing.cases import BLOCKSIZES
from bitsandbytes.testing.compare import assert_equal
from bitsandbytes_cuda.ops import blockwise

pytestmark = pytest.mark.usefixtures("emulated")  # conftest: launch() in the emulator


def test_prepared_map_is_the_reference_sort(code):
    g = torch.Generator().manual_seed(3)
    shuffled = code[torch.randperm(256, generator=g)]
    mids, order = blockwise.sorted_code_map(shuffled)
    idx = torch.argsort(shuffled, stable=True)
    assert_equal(order, idx.to(torch.uint8), "order")
    v = shuffled[idx]
    assert_equal(mids[:255], (v[:-1] + v[1:]) / 2, "midpoints")


def test_geometry_meets_the_kernels_requirements():
    for n in (1, 1000, 10**9):
        for blocksize in BLOCKSIZES:
            grid, threads = blockwise.quantize_geometry(n, blocksize)
            group = blocksize // blockwise.ITEMS_PER_THREAD
            assert threads % 32 == 0 and threads % group == 0 and 256 <= threads <= 1024
            assert 1 <= grid <= blockwise.MAX_GRID
        grid, threads = blockwise.dequantize_geometry(n)
        assert 1 <= grid <= blockwise.MAX_GRID and threads == blockwise.THREADS
