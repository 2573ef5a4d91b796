"""The nearest code found from a float's bits (the key table of nearest_code.h) is exactly the search's.

quantize_blockwise and the 8-bit optimizers no longer search the 255 midpoints (scalar and AVX2): they
look a key made of the value's exponent and top mantissa bits up in a table, then compare the low bits
once. The reference's rule is ``torch.bucketize`` over the value-sorted midpoints, so each test feeds
values whose scaled value is the value itself (every block holds a 1.0, so absmax is 1 and the scale
exact) and compares the codes byte for byte with the reference:

- every float32 within 8 ulps of every midpoint, and of its negation;
- every float32 on a key boundary of any shift the table may choose (low 13..21 bits all zero or all
  one), and a dense stride over all of [-1, 1];
- NaN, +-inf, +-0, subnormals, +-1 and values beyond +-1 (the clamp), each in blocks of their own;
- the signed and unsigned dynamic maps, a few-bit dynamic map (its padding zeros put many codes on one
  value) and a clustered map (keys that hold several midpoints, the table's slow path);
- at every ISA level this machine runs (a level it lacks is skipped by name), through
  quantize_blockwise and through an 8-bit optimizer step whose new state is the gradient itself
  (momentum, step 1: the state is g, quantized with qmap1).
"""

from __future__ import annotations

import pytest
import torch
from native_helpers import isa

import bitsandbytes  # noqa: F401  (loads the cpu backend)
from bitsandbytes import functional as F
from bitsandbytes._reference import REFERENCE
from bitsandbytes_cpu import _C

LEVELS = ("scalar", "avx2", "avx512")
BLOCK = 256  # the optimizers' block; quantize_blockwise runs the same blocksize


def _maps() -> dict[str, torch.Tensor]:
    clustered = torch.cat([torch.linspace(-1, 1, 56), 0.5 + torch.linspace(0, 1e-5, 200)]).sort().values
    return {
        "signed": F.create_dynamic_map(signed=True).float(),
        "unsigned": F.create_dynamic_map(signed=False).float(),
        "fewbit": F.create_dynamic_map(True, 4, 4).float(),
        "clustered": clustered,
    }


MAPS = _maps()


def _level(name: str) -> None:
    if name not in _C.supported_isas():
        pytest.skip(f"this CPU has no {name} (supported: {', '.join(_C.supported_isas())})")


def _bits(values: torch.Tensor) -> torch.Tensor:
    return values.view(torch.int32)


def _floats(bits: torch.Tensor) -> torch.Tensor:
    return bits.to(torch.int32).view(torch.float32)


def _near_midpoints(code: torch.Tensor, ulps: int = 8) -> torch.Tensor:
    v = code.sort(stable=True).values
    mids = (v[:-1] + v[1:]) / 2
    mids = torch.cat([mids, -mids])
    # Stepping the integer bits walks float32 neighbours (away from zero for larger bits, either sign).
    steps = torch.arange(-ulps, ulps + 1, dtype=torch.int64)
    bits = (_bits(mids).to(torch.int64)[:, None] + steps[None, :]).flatten()
    x = _floats(bits)
    return x[x.abs() <= 1]


def _sweep() -> torch.Tensor:
    one = 0x3F800000
    parts = [torch.arange(0, one + 1, 1021, dtype=torch.int64)]  # dense stride over [0, 1]
    for b in range(13, 22):
        starts = torch.arange(0, one + 1, 1 << b, dtype=torch.int64)
        parts += [starts, starts + (1 << b) - 1, starts + 1]
    bits = torch.cat(parts)
    bits = bits[bits <= one]
    x = _floats(bits)
    return torch.cat([x, -x])


def _blocks(values: torch.Tensor) -> torch.Tensor:
    """values (|v| <= 1) in blocks of BLOCK that each start with 1.0: absmax 1, the scaled value is v."""
    per = BLOCK - 1
    pad = (-values.numel()) % per
    body = torch.cat([values, torch.zeros(pad)]).view(-1, per)
    return torch.cat([torch.ones(body.shape[0], 1), body], dim=1).flatten()


def _specials() -> torch.Tensor:
    tiny = torch.tensor([1e-45, 2e-45, 1.1754942e-38, 1.1754944e-38, 1.17549435e-38, 1e-40, 3e-39])
    edge = torch.tensor([0.0, -0.0, 1.0, -1.0, 0.99999994, -0.99999994, 5.9604645e-08, -5.9604645e-08])
    finite = _blocks(torch.cat([tiny, -tiny, edge]))
    # Blocks of their own: NaN makes a block's absmax NaN, inf makes it inf, 1.5 clamps the rest to it.
    own = []
    for v in (float("nan"), float("inf"), float("-inf"), 1.5, -3.0):
        b = torch.linspace(-1, 1, BLOCK)
        b[7] = v
        own.append(b)
    return torch.cat([finite, *own])


KINDS = ("near_midpoints", "sweep", "specials")


def _input(kind: str, code: torch.Tensor) -> torch.Tensor:
    if kind == "near_midpoints":
        return _blocks(_near_midpoints(code))
    if kind == "sweep":
        return _blocks(_sweep())
    return _specials()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("map_name", list(MAPS))
@pytest.mark.parametrize("level", LEVELS)
def test_quantize_blockwise_codes_are_the_search(level, map_name, kind):
    _level(level)
    code = MAPS[map_name]
    x = _input(kind, code)
    want_q, want_absmax = REFERENCE["quantize_blockwise"](x, code, BLOCK)
    with isa(level):
        q, absmax = torch.ops.bitsandbytes.quantize_blockwise(x, code, BLOCK)
    torch.testing.assert_close(absmax, want_absmax, rtol=0, atol=0, equal_nan=True)
    bad = torch.nonzero(q != want_q).flatten()
    assert bad.numel() == 0, (
        f"{bad.numel()} codes differ, first at {x[bad[0]].item()!r}: {q[bad[0]].item()} != {want_q[bad[0]].item()}"
    )


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("map_name", list(MAPS))
@pytest.mark.parametrize("level", LEVELS)
def test_optimizer_state_codes_are_the_search(level, map_name, kind):
    _level(level)
    code = MAPS[map_name]
    g = _input(kind, code)
    n, blocks = g.numel(), -(g.numel() // -BLOCK)
    results = []
    for fn in (torch.ops.bitsandbytes.optimizer_update_8bit_blockwise, REFERENCE["optimizer_update_8bit_blockwise"]):
        p = torch.zeros(n)
        state1, absmax1 = torch.zeros(n, dtype=torch.uint8), torch.zeros(blocks)
        with isa(level):
            # momentum, step 1, no weight decay, gnorm_scale 1: the new state is g itself.
            fn("momentum", g, p, state1, None, 0.9, 0.0, 0.0, 0.0, 1e-8, 1, 1e-3, code, None, absmax1, None,
               0.0, 1.0, False)  # fmt: skip
        results.append((state1, absmax1))
    (q, absmax), (want_q, want_absmax) = results
    torch.testing.assert_close(absmax, want_absmax, rtol=0, atol=0, equal_nan=True)
    bad = torch.nonzero(q != want_q).flatten()
    assert bad.numel() == 0, (
        f"{bad.numel()} codes differ, first at {g[bad[0]].item()!r}: {q[bad[0]].item()} != {want_q[bad[0]].item()}"
    )
