"""metal/blockwise.metal's backend-specific checks in the emulator: the quantizers' geometry (quantize.h
against the ops), the map preparation kernel, nothing launched for empty tensors, the reference where a
kernel is absent. The op's bytes against the reference (shapes, dtypes, ties, maps, NaN, the two scaling
rules) are the conformance suite's test_blockwise, which tests-mps-emulated runs on these kernels
(``bitsandbytes_mps.testing.emulated``).
"""

from __future__ import annotations

import re

import pytest
import torch
from quant_checks import check_blockwise

from bitsandbytes.testing.cases import BLOCKSIZES, empty_shapes, randn, seed_of
from bitsandbytes.testing.compare import assert_equal
from bitsandbytes_mps import _assemble
from bitsandbytes_mps.ops import _quantize, blockwise
from bitsandbytes_mps.tables import _quantize as geometry
from bitsandbytes_mps.tables import blockwise as table

pytestmark = pytest.mark.usefixtures("emulated")  # conftest: the library loads in the emulator

# --------------------------------------------------------------------------------- the source itself


def test_geometry_constants_match_quantize_h():
    text = _assemble.source_path("quantize.h").read_text()
    for macro, value in (("BNB_QUANT_ITEMS", geometry.QUANT_ITEMS), ("BNB_DEQUANT_ITEMS", geometry.DEQUANT_ITEMS)):
        assert re.search(rf"#define {macro} {value}\n", text), macro


def test_quantize_geometry_meets_the_kernels_requirements():
    for n in (1, 1000, 10**9):
        for blocksize in BLOCKSIZES:
            threads, size = _quantize.quantize_geometry(n, blocksize)
            group = blocksize // geometry.QUANT_ITEMS
            assert size % 32 == 0 and size % group == 0 and 256 <= size <= 1024 and threads % size == 0
            assert (threads // size) * (size // group) * blocksize >= n  # every block has its threads


# ------------------------------------------------------------------------------------------- 8-bit


def test_prepared_map_is_the_reference_sort(code):
    g = torch.Generator().manual_seed(3)
    shuffled = code[torch.randperm(256, generator=g)].contiguous()
    mids, order = blockwise.sorted_code_map(shuffled)
    idx = torch.argsort(shuffled, stable=True)
    assert_equal(order, idx.to(torch.uint8), "order")
    v = shuffled[idx]
    assert_equal(mids[:255], (v[:-1] + v[1:]) / 2, "midpoints")


@pytest.mark.parametrize("shape", empty_shapes(), ids=str)
def test_blockwise_empty(code, shape, dispatched):
    check_blockwise(torch.empty(shape), code, 64)
    assert dispatched == []  # Metal cannot bind an empty buffer: nothing is launched


# ------------------------------------------------------------------------------------ errors, fallback


def test_missing_bfloat_kernels_fall_back_to_the_reference(monkeypatch, code, dispatched):
    """Where MSL < 3.1 the bf16 instances are absent: those ops run the reference, the others stay native."""
    real = _quantize.native
    monkeypatch.setattr(_quantize, "native", lambda name, threads=0: not name.endswith("_bf16") and real(name, threads))
    A = randn((2, 70), torch.bfloat16, seed_of("fallback"))
    check_blockwise(A, code, 64)
    assert dispatched == []
    check_blockwise(A.float(), code, 64)
    assert dispatched  # float32 still runs its kernels


def test_ops_table():
    assert set(blockwise.OPS) == {"quantize_blockwise", "dequantize_blockwise", "dequantize_blockwise.out"}
    assert blockwise.SOURCES == (table.SOURCE,)
