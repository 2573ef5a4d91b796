"""Native optimizer steps: what the conformance suite does not pin down.

- 8-bit codes and absmax are *identical* to the reference (the state math has no sqrt, so the new
  states are bit-exact, and the nearest-code search must then give the reference's codes) for the
  dynamic maps and for maps that exercise the search's corners (unsorted, duplicates, clustered).
- Every ISA level gives the same bytes; 1 and 2 threads give the same bytes (unorm_vec included).
- The C++ re-checks reject wrong sizes before anything is written.
"""

from __future__ import annotations

import platform
from pathlib import Path

import pytest
import torch
from native_helpers import LEVEL_LOOKUPS, isa, map_lookup, num_threads

import bitsandbytes  # noqa: F401  (loads the cpu backend)
from bitsandbytes import functional
from bitsandbytes._ops import OPTIMIZER_BLOCKSIZE, TWO_STATE_OPTIMIZERS
from bitsandbytes._reference import REFERENCE
from bitsandbytes.testing.conformance.test_optimizers_strict import state8
from bitsandbytes_cpu import _C

NAMES = ("adam", "momentum", "rmsprop", "lion", "adagrad", "ademamix", "lamb", "lars")
ISAS = _C.supported_isas()
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
HP = {"beta1": 0.9, "beta2": 0.995, "beta3": 0.999, "alpha": 5.0, "eps": 1e-6, "lr": 1e-2, "gnorm_scale": 0.8}


def _maps() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(7)
    dyn = (functional.create_dynamic_map(signed=True).float(), functional.create_dynamic_map(signed=False).float())
    shuffled = tuple(m[torch.randperm(256, generator=gen)] for m in dyn)
    linear = torch.linspace(-1, 1, 256)
    dup = torch.linspace(-1, 1, 256)
    dup[100:140] = 0.25  # equal values: the lowest index wins
    clustered = torch.cat([torch.linspace(-1, 1, 56), 0.5 + torch.linspace(0, 1e-5, 200)]).sort().values
    return {
        "dynamic": dyn,
        "shuffled": shuffled,
        "linear": (linear, linear.abs()),
        "duplicates": (dup, dup.abs()),
        "clustered": (clustered, clustered.abs()),
    }


MAPS = _maps()


def _state8(name, n, seed, qmap1, qmap2):
    """The shipped suite's 8-bit states (realistic codes, non-negative second moments), as a list."""
    st = state8(name, n, seed, qmap1, qmap2)
    return [st["state1"], st["state2"], st["absmax1"], st["absmax2"]]


def _run8(fn, name, g, p, st, qmap1, qmap2, step, wd=0.01, skip=False):
    two = name in TWO_STATE_OPTIMIZERS
    fn(name, g, p, st[0], st[1], HP["beta1"], HP["beta2"], HP["beta3"], HP["alpha"], HP["eps"], step, HP["lr"],
       qmap1, qmap2 if two else None, st[2], st[3], wd, HP["gnorm_scale"], skip)  # fmt: skip


def _run32(fn, name, g, p, st, step, max_unorm=0.0, wd=0.01, skip=False):
    fn(name, g, p, st[0], st[1], st[2], max_unorm, 1.5, HP["beta1"], HP["beta2"], HP["beta3"], HP["alpha"],
       HP["eps"], wd, step, HP["lr"], HP["gnorm_scale"], skip)  # fmt: skip


def _state32(name, n, seed):
    gen = torch.Generator().manual_seed(seed)
    ema = 2 if name == "ademamix" else 1
    s1 = torch.rand(ema * n, generator=gen) * 0.1
    s2 = torch.rand(n, generator=gen) * 0.01 if name in TWO_STATE_OPTIMIZERS else None
    return [s1, s2, torch.tensor([2.0])]


def _clone(ts):
    return [t.clone() if t is not None else None for t in ts]


def _grad(n, dtype, seed):
    g = torch.randn(n, generator=torch.Generator().manual_seed(seed)).to(dtype)
    g[::11] = 0
    return g


OP8 = torch.ops.bitsandbytes.optimizer_update_8bit_blockwise
OP32 = torch.ops.bitsandbytes.optimizer_update_32bit


@pytest.mark.parametrize(("level", "lookup"), LEVEL_LOOKUPS)
@pytest.mark.parametrize("map_name", list(MAPS))
@pytest.mark.parametrize("name", NAMES)
def test_8bit_codes_identical_to_reference(name, map_name, level, lookup):
    qmap1, qmap2 = MAPS[map_name]
    n = 5 * OPTIMIZER_BLOCKSIZE + 77
    p = torch.randn(n, generator=torch.Generator().manual_seed(1))
    st = _state8(name, n, 2, qmap1, qmap2)
    ref_p, ref_st = p.clone(), _clone(st)
    with isa(level), map_lookup(lookup):
        for step in (1, 2):
            g = _grad(n, torch.float32, 10 + step)
            _run8(OP8, name, g, p, st, qmap1, qmap2, step, skip=step == 2)
            _run8(REFERENCE["optimizer_update_8bit_blockwise"], name, g, ref_p, ref_st, qmap1, qmap2, step,
                  skip=step == 2)  # fmt: skip
            for got, want, what in zip(st, ref_st, ("state1", "state2", "absmax1", "absmax2"), strict=True):
                if want is not None:
                    assert torch.equal(got, want), f"{name} {map_name} {level} step {step}: {what} differs"
            torch.testing.assert_close(p, ref_p, rtol=1e-5, atol=1e-6)
            ref_p.copy_(p)  # p may differ in the last bit (sqrt): restart the reference from ours


@pytest.mark.parametrize(("level", "lookup"), LEVEL_LOOKUPS)
@pytest.mark.parametrize("name", NAMES)
def test_8bit_nonfinite_gradients_match_reference(name, level, lookup):
    """NaN and +-inf gradients in some blocks (their states' absmax turns NaN or inf, the AVX2 sweep's
    checked search): the codes and absmax are the reference's byte for byte, p its values, NaN included."""
    qmap1, qmap2 = MAPS["dynamic"]
    n = 6 * OPTIMIZER_BLOCKSIZE + 33
    p = torch.randn(n, generator=torch.Generator().manual_seed(11))
    st = _state8(name, n, 12, qmap1, qmap2)
    ref_p, ref_st = p.clone(), _clone(st)
    g = _grad(n, torch.float32, 13)
    g[5], g[OPTIMIZER_BLOCKSIZE + 9], g[3 * OPTIMIZER_BLOCKSIZE + 200] = float("nan"), float("inf"), -float("inf")
    g[n - 3] = float("nan")  # the short last block
    with isa(level), map_lookup(lookup):
        _run8(OP8, name, g, p, st, qmap1, qmap2, 1)
    _run8(REFERENCE["optimizer_update_8bit_blockwise"], name, g, ref_p, ref_st, qmap1, qmap2, 1)
    for got, want, what in zip(st, ref_st, ("state1", "state2", "absmax1", "absmax2"), strict=True):
        if want is not None:
            assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), f"{name} {level}: {what} differs"
    torch.testing.assert_close(p, ref_p, rtol=1e-5, atol=1e-6, equal_nan=True)


def _cpu_vendor() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("vendor_id"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


@pytest.mark.skipif(
    platform.machine() not in ("x86_64", "AMD64"), reason="needs an x86-64 CPU (the lookup is AVX-512's)"
)
def test_map_lookup_auto_follows_the_vendor_and_rejects_unknown_names():
    vendor = _cpu_vendor()
    if vendor is None:
        pytest.skip("needs Linux's /proc/cpuinfo to name the CPU's vendor")
    with map_lookup("auto"):
        assert _C.map_lookup() == ("registers" if vendor == "AuthenticAMD" else "gather")
    for name in ("gather", "registers"):
        with map_lookup(name):
            assert _C.map_lookup() == name
    with pytest.raises(ValueError, match="auto, gather, registers; got 'gathers'"):
        _C.set_map_lookup("gathers")


def _run_all(level, threads, name, dtype, bits):
    n = 3 * OPTIMIZER_BLOCKSIZE + 45
    p = torch.randn(n, generator=torch.Generator().manual_seed(3)).to(dtype)
    qmap1, qmap2 = MAPS["dynamic"]
    st = _state8(name, n, 4, qmap1, qmap2) if bits == 8 else _state32(name, n, 4)
    with isa(level), num_threads(threads):
        for step in (1, 2, 3):
            g = _grad(n, dtype, 20 + step)
            if bits == 8:
                _run8(OP8, name, g, p, st, qmap1, qmap2, step, skip=step == 3)
            else:
                _run32(OP32, name, g, p, st, step, max_unorm=1.0, skip=step == 3)
    return [p, *st]


@pytest.mark.parametrize("bits", [32, 8])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", NAMES)
def test_identical_across_isa_levels_and_threads(name, dtype, bits):
    want = _run_all(ISAS[0], 1, name, dtype, bits)
    for level in ISAS:
        for threads in (1, 2):
            got = _run_all(level, threads, name, dtype, bits)
            for g, w in zip(got, want, strict=True):
                if w is not None:
                    assert torch.equal(g.view(torch.uint8), w.view(torch.uint8)), f"{level} x{threads} differs"


def test_unorm_independent_of_thread_count_on_many_blocks():
    n = 300_000
    outs = []
    for threads in (1, 2):
        p = torch.randn(n, generator=torch.Generator().manual_seed(5))
        st = _state32("lamb", n, 6)
        with num_threads(threads):
            _run32(OP32, "lamb", _grad(n, torch.float32, 7), p, st, 2, max_unorm=1.0)
        outs.append([p, *st])
    for a, b in zip(*outs, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("level", ISAS)
@pytest.mark.parametrize("n", [0, 1, 15, 16, 17, 31, 33, 63, 65, 127, 129, 255, 256, 257, 513])
@pytest.mark.parametrize("bits", [32, 8])
def test_small_sizes_match_reference(n, bits, level):
    """Every vector width's tail (8 and 16 lanes, 64-value groups) and the partial last block, at every level."""
    for name in NAMES:
        p = torch.randn(n, generator=torch.Generator().manual_seed(n))
        ref_p = p.clone()
        g = _grad(n, torch.float32, n + 1)
        if bits == 8:
            qmap1, qmap2 = MAPS["dynamic"]
            st = _state8(name, n, 8, qmap1, qmap2)
            ref = _clone(st)
            with isa(level):
                _run8(OP8, name, g, p, st, qmap1, qmap2, 1)
            _run8(REFERENCE["optimizer_update_8bit_blockwise"], name, g, ref_p, ref, qmap1, qmap2, 1)
        else:
            st = _state32(name, n, 8)
            ref = _clone(st)
            with isa(level):
                _run32(OP32, name, g, p, st, 2, max_unorm=1.0)
            _run32(REFERENCE["optimizer_update_32bit"], name, g, ref_p, ref, 2, max_unorm=1.0)
        torch.testing.assert_close(p, ref_p, rtol=1e-5, atol=1e-6)
        for got, want in zip(st, ref, strict=True):
            if want is not None:
                if bits == 8:
                    assert torch.equal(got, want), name
                else:
                    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)


def test_noncontiguous_absmax_is_written_back():
    n = 4 * OPTIMIZER_BLOCKSIZE
    qmap1, qmap2 = MAPS["dynamic"]
    st = _state8("adam", n, 9, qmap1, qmap2)
    ref = _clone(st)
    wide = torch.zeros(4, 2)
    wide[:, 0] = st[2]
    st[2] = wide[:, 0]  # stride 2
    p, ref_p, g = torch.randn(n), None, _grad(n, torch.float32, 9)
    ref_p = p.clone()
    _run8(OP8, "adam", g, p, st, qmap1, qmap2, 1)
    _run8(REFERENCE["optimizer_update_8bit_blockwise"], "adam", g, ref_p, ref, qmap1, qmap2, 1)
    assert torch.equal(wide[:, 0], ref[2])


def test_cxx_rechecks_sizes_before_writing():
    n = 2 * OPTIMIZER_BLOCKSIZE
    g, p = torch.randn(n), torch.randn(n)
    before = p.clone()
    qmap1, qmap2 = MAPS["dynamic"]
    s1, s2 = torch.zeros(n, dtype=torch.uint8), torch.zeros(n, dtype=torch.uint8)
    a1, a2 = torch.ones(2), torch.ones(2)
    args = (0.9, 0.99, 0.0, 0.0, 1e-8, 1, 1e-3)
    tail = (0.0, 1.0, False, 1)
    with pytest.raises(ValueError, match="absmax1"):
        _C.optimizer_update_8bit_blockwise("adam", g, p, s1, s2, *args, qmap1, qmap2, torch.ones(1), a2, *tail)
    with pytest.raises(ValueError, match="state2"):
        _C.optimizer_update_8bit_blockwise("adam", g, p, s1, s2[:-1], *args, qmap1, qmap2, a1, a2, *tail)
    with pytest.raises(ValueError, match="qmap1"):
        _C.optimizer_update_8bit_blockwise("adam", g, p, s1, s2, *args, qmap1[:-1], qmap2, a1, a2, *tail)
    with pytest.raises(ValueError, match="state2"):
        _C.optimizer_update_8bit_blockwise("adam", g, p, s1, None, *args, qmap1, None, a1, None, *tail)
    with pytest.raises(ValueError, match="state1"):  # ademamix keeps [2, n] codes
        _C.optimizer_update_8bit_blockwise("ademamix", g, p, s1, s2, *args, qmap1, qmap2, torch.ones(4), a2, *tail)
    with pytest.raises(ValueError, match="g must have"):
        _C.optimizer_update_8bit_blockwise("adam", g[:-1], p, s1, s2, *args, qmap1, qmap2, a1, a2, *tail)
    with pytest.raises(ValueError, match="dtype"):
        _C.optimizer_update_8bit_blockwise("adam", g.half(), p, s1, s2, *args, qmap1, qmap2, a1, a2, *tail)
    with pytest.raises(ValueError, match="optimizer_name"):
        _C.optimizer_update_8bit_blockwise("sgd", g, p, s1, s2, *args, qmap1, qmap2, a1, a2, *tail)
    m, v = torch.zeros(n), torch.zeros(n)
    hp32 = (0.9, 0.99, 0.0, 0.0, 1e-8, 0.0, 1, 1e-3, 1.0, False, 1)
    with pytest.raises(ValueError, match="state2"):
        _C.optimizer_update_32bit("adam", g, p, m, v[:-1], None, 0.0, 0.0, *hp32)
    with pytest.raises(ValueError, match="unorm_vec"):
        _C.optimizer_update_32bit("lamb", g, p, m, v, None, 1.0, 1.0, *hp32)
    with pytest.raises(ValueError, match="unorm_vec"):
        _C.optimizer_update_32bit("lamb", g, p, m, v, torch.zeros(2), 1.0, 1.0, *hp32)
    with pytest.raises(ValueError, match="state1"):
        _C.optimizer_update_32bit("ademamix", g, p, m, v, None, 0.0, 0.0, *hp32)
    with pytest.raises(ValueError, match="step"):
        _C.optimizer_update_32bit("adam", g, p, m, v, None, 0.0, 0.0, *hp32[:6], 0, *hp32[7:])
    assert torch.equal(p, before)
    assert not s1.any() and not m.any()
