"""metal/fourbit.metal's backend-specific checks in the emulator: the bit-decided path of blocks below
MIN_SCALE, nothing launched for empty tensors, many threadgroups, the reference where a kernel is absent.
The op's bytes against the reference (shapes, dtypes, ties, signed zeros, NaN, the two scaling rules,
quant_storage) are the conformance suite's test_fourbit, which tests-mps-emulated runs on these kernels
(``bitsandbytes_mps.testing.emulated``).
"""

from __future__ import annotations

import pytest
import torch
from quant_checks import check_4bit, check_blockwise

from bitsandbytes.testing.cases import QUANT_TYPES, empty_shapes, randn, seed_of
from bitsandbytes_mps.ops import _quantize, fourbit
from bitsandbytes_mps.tables import fourbit as table

pytestmark = pytest.mark.usefixtures("emulated")  # conftest: the library loads in the emulator


def test_blocks_below_min_scale(code):
    """Blocks whose absmax is under MIN_SCALE (subnormal values, signed zeros) in a full and the short
    last block: the kernels' bit-decided tiny-block path gives the reference's codes."""
    tiny = torch.tensor([1e-39, -3e-39, 0.0, -0.0, 5e-40, 1e-45, -1e-45, 2e-39])
    A = torch.cat([tiny.repeat(8), tiny[:5], torch.zeros(64 - 5 - 64 % 64), -tiny[:7]])
    check_blockwise(A, code, 64)
    for quant_type in QUANT_TYPES:
        check_4bit(A, 64, quant_type)


@pytest.mark.parametrize("shape", empty_shapes(), ids=str)
def test_4bit_empty(shape, dispatched):
    check_4bit(torch.empty(shape, dtype=torch.float16), 64, "fp4")
    assert dispatched == []


@pytest.mark.parametrize("blocksize", [32, 4096])
def test_many_threadgroups(code, blocksize):
    """Enough blocks for several threadgroups, and a last threadgroup with idle block slots."""
    A = randn((9 * blocksize + 3,), torch.bfloat16, seed_of("groups", blocksize))
    check_blockwise(A, code, blocksize)
    check_4bit(A, blocksize, "nf4")


# ------------------------------------------------------------------------------------ errors, fallback


def test_missing_bfloat_kernels_fall_back_to_the_reference(monkeypatch, dispatched):
    """Where MSL < 3.1 the bf16 instances are absent: those ops run the reference, the others stay native."""
    real = _quantize.native
    monkeypatch.setattr(_quantize, "native", lambda name, threads=0: not name.endswith("_bf16") and real(name, threads))
    A = randn((2, 70), torch.bfloat16, seed_of("fallback"))
    check_4bit(A, 64, "nf4")
    assert dispatched == []
    check_4bit(A.float(), 64, "nf4")
    assert dispatched  # float32 still runs its kernels


def test_ops_table():
    assert set(fourbit.OPS) == {"quantize_4bit", "dequantize_4bit", "dequantize_4bit.out"}
    assert fourbit.SOURCES == (table.SOURCE,)
