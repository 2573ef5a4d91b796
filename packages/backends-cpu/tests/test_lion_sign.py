"""Lion's sign(d), now taken from the bits of d without branches, keeps the reference's values.

d > 0 -> 1, d < 0 -> -1, d = +-0 -> 0 and NaN -> NaN (so a NaN gradient shows in p); checked for
the 32-bit and the 8-bit step at every ISA level this machine runs, p compared with the reference
bit for bit (the Lion update has no sqrt or division, so p is exact).
"""

from __future__ import annotations

import pytest
import torch
from native_helpers import isa

import bitsandbytes  # noqa: F401  (loads the cpu backend)
from bitsandbytes import functional as F
from bitsandbytes._reference import REFERENCE
from bitsandbytes_cpu import _C

N = 1024  # four optimizer blocks


def _grad() -> torch.Tensor:
    g = torch.randn(N, generator=torch.Generator().manual_seed(11))
    g[:64] = 0.0  # with a zero state: d = +0
    g[64:128] = -0.0  # d = -0 * ... the sign of zero must not matter
    g[300] = float("nan")  # block 1: NaN in p
    g[700:710] = float("inf")
    g[710:720] = float("-inf")
    return g


@pytest.mark.parametrize("bits", [32, 8])
@pytest.mark.parametrize("level", _C.supported_isas())
def test_lion_sign_matches_reference(level, bits):
    g = _grad()
    results = []
    for fn in ("native", "reference"):
        p = torch.randn(N, generator=torch.Generator().manual_seed(12))
        with isa(level):
            if bits == 32:
                op = (
                    torch.ops.bitsandbytes.optimizer_update_32bit
                    if fn == "native"
                    else REFERENCE["optimizer_update_32bit"]
                )
                s1 = torch.zeros(N)
                op("lion", g, p, s1, None, None, 0.0, 0.0, 0.9, 0.99, 0.0, 0.0, 1e-8, 0.0, 1, 1e-2, 1.0, False)
            else:
                op = (
                    torch.ops.bitsandbytes.optimizer_update_8bit_blockwise
                    if fn == "native"
                    else REFERENCE["optimizer_update_8bit_blockwise"]
                )
                s1, a1 = torch.full((N,), 127, dtype=torch.uint8), torch.zeros(N // 256)  # code 127 is 0.0
                code = F.create_dynamic_map(signed=True)
                op("lion", g, p, s1, None, 0.9, 0.99, 0.0, 0.0, 1e-8, 1, 1e-2, code, None, a1, None, 0.0, 1.0, False)
        results.append((p, s1))
    (p, s1), (want_p, want_s1) = results
    torch.testing.assert_close(p, want_p, rtol=0, atol=0, equal_nan=True)
    assert torch.isnan(p[300]) and torch.equal(
        p[:128], torch.randn(N, generator=torch.Generator().manual_seed(12))[:128]
    )
    torch.testing.assert_close(s1, want_s1, rtol=0, atol=0, equal_nan=True)
