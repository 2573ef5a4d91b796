"""A backend-style Metal kernel (NF4 quantize/dequantize) in emulation, bit for bit against the reference."""

from pathlib import Path

import pytest
import torch

from bitsandbytes import _formats
from bitsandbytes._reference import fourbit
from bitsandbytes_emu.build import unavailable_reason

pytestmark = pytest.mark.skipif(unavailable_reason() is not None, reason=unavailable_reason() or "")


@pytest.fixture(scope="module")
def lib():
    from bitsandbytes_emu.metal import metal_library

    return metal_library(Path(__file__).parent / "kernels" / "metal_nf4.metal")


@pytest.mark.parametrize(("n", "blocksize"), [(64 * 4, 64), (64 * 5 + 37, 64), (33, 64), (128 * 3 + 2, 128)])
def test_nf4_kernel_matches_the_reference(lib, n, blocksize):
    gen = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=gen) * 3
    x[5] = 0.0
    table = _formats.code_table("nf4").float()
    midpoints = ((table[:-1] + table[1:]) / 2).contiguous()
    blocks = -(-n // blocksize)
    packed = torch.zeros((n + 1) // 2, dtype=torch.uint8)
    absmax = torch.zeros(blocks)
    lib.nf4_quantize(x, midpoints, packed, absmax, n, threads=n + n % 2, group_size=blocksize)

    want_packed, want_absmax = fourbit.quantize_4bit(x, blocksize, "nf4", torch.uint8)
    assert torch.equal(absmax, want_absmax)
    assert torch.equal(packed, want_packed.reshape(-1))

    out = torch.zeros(n)
    lib.nf4_dequantize(packed, table, absmax, out, blocksize, threads=n, group_size=min(n, 256))
    assert torch.equal(out, fourbit.dequantize_4bit(want_packed, want_absmax, blocksize, "nf4", (n,), torch.float32))
