"""The optimizer kernels (metal/optimizers.metal) run in the Metal emulator against the reference.

What is pinned down, and why it can be:
- The kernels repeat the reference's float32 operations in its order (precise:: quotients and square
  roots; the emulator neither contracts a multiply-add nor approximates), so the new states are the
  reference's *bits*, every dtype, skip_zeros and weight decay included; 8-bit codes and absmax are then
  identical too, for the dynamic maps and for maps that exercise the nearest-code search's corners
  (unsorted, duplicates, clustered, one map for both states).
- p goes through a square root for most rules. The kernels' is correctly rounded; torch's vectorized CPU
  sqrt, which the reference runs on, is not always (1 ulp on some hosts), so p is compared within rtol
  1e-5 / atol 1e-6 and the reference restarts from our p after each step.
- With max_unorm the squared norm is a sum in another order (per-threadgroup SIMD-group sums, then one
  threadgroup adding the partials): unorm_vec within rtol 1e-5 of the reference's float32 sum; the scale
  then differs in the last bits, which the p tolerance covers; the states (which it does not touch) are
  still exact.
- NaN gradients poison their 8-bit block's absmax as the reference does; strided absmax is written back.
On an Apple GPU the compiler may fuse multiply-adds, so there (tests/mac) the same cases hold within
tolerances instead of bit for bit.
"""

from __future__ import annotations

import re

import pytest
import torch

from bitsandbytes import functional
from bitsandbytes._ops import OPTIMIZER_BLOCKSIZE, TWO_STATE_OPTIMIZERS
from bitsandbytes._reference import REFERENCE
from bitsandbytes_mps import _assemble, library, tables
from bitsandbytes_mps.ops import optimizers as ops
from bitsandbytes_mps.tables import _generate
from bitsandbytes_mps.tables import optimizers as table

NAMES = ("adam", "momentum", "rmsprop", "lion", "adagrad", "ademamix", "lamb", "lars")
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
HP = {"beta1": 0.9, "beta2": 0.995, "beta3": 0.999, "alpha": 5.0, "eps": 1e-6, "lr": 1e-2, "gnorm_scale": 0.8}
REF8 = REFERENCE["optimizer_update_8bit_blockwise"]
REF32 = REFERENCE["optimizer_update_32bit"]


pytestmark = pytest.mark.usefixtures("emulated")  # conftest.py: the kernels load in the emulator


def _maps() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(7)
    dyn = (functional.create_dynamic_map(signed=True).float(), functional.create_dynamic_map(signed=False).float())
    linear = torch.linspace(-1, 1, 256)
    dup = torch.linspace(-1, 1, 256)
    dup[100:140] = 0.25  # equal values: the lowest index wins
    clustered = torch.cat([torch.linspace(-1, 1, 56), 0.5 + torch.linspace(0, 1e-5, 200)]).sort().values
    return {
        "dynamic": dyn,
        "shuffled": tuple(m[torch.randperm(256, generator=gen)] for m in dyn),
        "linear": (linear, linear.abs()),
        "duplicates": (dup, dup.abs()),
        "clustered": (clustered, clustered.abs()),
        "one map": (linear, linear),  # the same tensor as qmap1 and qmap2
    }


MAPS = _maps()


def _grad(n, dtype, seed):
    g = torch.randn(n, generator=torch.Generator().manual_seed(seed)).to(dtype)
    g[::11] = 0  # skip_zeros has work to do
    return g


def _state8(name, n, seed, qmap1, qmap2):
    gen = torch.Generator().manual_seed(seed)
    blocks = -(n // -OPTIMIZER_BLOCKSIZE)
    ema = 2 if name == "ademamix" else 1
    two = name in TWO_STATE_OPTIMIZERS
    s1 = torch.randint(0, 256, (ema * n,), dtype=torch.uint8, generator=gen)
    a1 = torch.rand(ema * blocks, generator=gen) * 0.1
    s2 = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=gen) if two else None
    a2 = torch.rand(blocks, generator=gen) * 0.01 if two else None
    # Second moments are >= 0: codes of non-negative map values.
    for codes, qmap, second in ((s2, qmap2, True), (s1, qmap1, name in ("rmsprop", "adagrad"))):
        if codes is not None and second:
            nonneg = torch.nonzero(qmap >= 0).flatten()
            codes.copy_(nonneg[codes.long() % nonneg.numel()].to(torch.uint8))
    return [s1, s2, a1, a2]


def _state32(name, n, seed):
    gen = torch.Generator().manual_seed(seed)
    ema = 2 if name == "ademamix" else 1
    s1 = torch.rand(ema * n, generator=gen) * 0.1
    s2 = torch.rand(n, generator=gen) * 0.01 if name in TWO_STATE_OPTIMIZERS else None
    return [s1, s2, torch.tensor([2.0])]


def _clone(ts):
    return [t.clone() if t is not None else None for t in ts]


def _run8(fn, name, g, p, st, qmap1, qmap2, step, wd=0.01, skip=False):
    two = name in TWO_STATE_OPTIMIZERS
    fn(name, g, p, st[0], st[1], HP["beta1"], HP["beta2"], HP["beta3"], HP["alpha"], HP["eps"], step, HP["lr"],
       qmap1, qmap2 if two else None, st[2], st[3], wd, HP["gnorm_scale"], skip)  # fmt: skip


def _run32(fn, name, g, p, st, step, max_unorm=0.0, wd=0.01, skip=False):
    fn(name, g, p, st[0], st[1], st[2], max_unorm, 1.5, HP["beta1"], HP["beta2"], HP["beta3"], HP["alpha"],
       HP["eps"], wd, step, HP["lr"], HP["gnorm_scale"], skip)  # fmt: skip


def _close_p(p, ref_p, what):
    torch.testing.assert_close(p.float(), ref_p.float(), rtol=1e-5, atol=1e-6, msg=lambda m: f"{what}: p: {m}")
    ref_p.copy_(p)  # p may differ in the last bit (sqrt): restart the reference from ours


def _same_bits(got, want, what):
    assert got.dtype == want.dtype and got.shape == want.shape, what
    same = got.view(torch.uint8).reshape(got.numel(), -1) == want.view(torch.uint8).reshape(want.numel(), -1)
    bad = (~same.all(dim=1)).nonzero().flatten()
    assert bad.numel() == 0, f"{what}: {bad.numel()} elements differ, first at {bad[0].item()}: " + (
        f"{got.reshape(-1)[bad[0]].item()} != {want.reshape(-1)[bad[0]].item()}"
    )


# ---------------------------------------------------------------------------------------------------
# 8-bit


@pytest.mark.parametrize("map_name", list(MAPS))
@pytest.mark.parametrize("name", NAMES)
def test_8bit_identical_to_reference(name, map_name):
    qmap1, qmap2 = MAPS[map_name]
    n = 5 * OPTIMIZER_BLOCKSIZE + 77  # more blocks than the emulated grid (stride) and a short last block
    p = torch.randn(n, generator=torch.Generator().manual_seed(1))
    st = _state8(name, n, 2, qmap1, qmap2)
    ref_p, ref_st = p.clone(), _clone(st)
    for step in (1, 2):
        g = _grad(n, torch.float32, 10 + step)
        _run8(ops.optimizer_update_8bit_blockwise, name, g, p, st, qmap1, qmap2, step, skip=step == 2)
        _run8(REF8, name, g, ref_p, ref_st, qmap1, qmap2, step, skip=step == 2)
        _close_p(p, ref_p, f"{name} {map_name} step {step}")
        for got, want, what in zip(st, ref_st, ("state1", "state2", "absmax1", "absmax2"), strict=True):
            if want is not None:
                _same_bits(got, want, f"{name} {map_name} step {step}: {what}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", NAMES)
def test_8bit_dtypes_identical_to_reference(name, dtype):
    qmap1, qmap2 = MAPS["dynamic"]
    n = 2 * OPTIMIZER_BLOCKSIZE + 45
    p = torch.randn(n, generator=torch.Generator().manual_seed(3)).to(dtype)
    st = _state8(name, n, 4, qmap1, qmap2)
    ref_p, ref_st = p.clone(), _clone(st)
    for step, wd in ((1, 0.0), (2, 0.01)):
        g = _grad(n, dtype, 20 + step)
        _run8(ops.optimizer_update_8bit_blockwise, name, g, p, st, qmap1, qmap2, step, wd=wd, skip=step == 2)
        _run8(REF8, name, g, ref_p, ref_st, qmap1, qmap2, step, wd=wd, skip=step == 2)
        _close_p(p, ref_p, f"{name} {dtype} step {step}")
        for got, want in zip(st, ref_st, strict=True):
            if want is not None:
                _same_bits(got, want, f"{name} {dtype} step {step}")


@pytest.mark.parametrize("n", [1, 15, 255, 256, 257])
def test_8bit_small_sizes(n):
    qmap1, qmap2 = MAPS["dynamic"]
    for name in ("adam", "ademamix", "lion"):
        p = torch.randn(n, generator=torch.Generator().manual_seed(n))
        st = _state8(name, n, 8, qmap1, qmap2)
        ref_p, ref = p.clone(), _clone(st)
        g = _grad(n, torch.float32, n + 1)
        _run8(ops.optimizer_update_8bit_blockwise, name, g, p, st, qmap1, qmap2, 1)
        _run8(REF8, name, g, ref_p, ref, qmap1, qmap2, 1)
        _close_p(p, ref_p, f"{name} n={n}")
        for got, want in zip(st, ref, strict=True):
            if want is not None:
                _same_bits(got, want, f"{name} n={n}")


def test_8bit_empty_is_a_no_op():
    qmap1, qmap2 = MAPS["dynamic"]
    st = _state8("adam", 0, 1, qmap1, qmap2)
    _run8(ops.optimizer_update_8bit_blockwise, "adam", torch.zeros(0), torch.zeros(0), st, qmap1, qmap2, 1)


def test_8bit_nan_gradient_poisons_only_its_block():
    qmap1, qmap2 = MAPS["dynamic"]
    n = 3 * OPTIMIZER_BLOCKSIZE
    p = torch.randn(n, generator=torch.Generator().manual_seed(4))
    st = _state8("adam", n, 5, qmap1, qmap2)
    ref_p, ref = p.clone(), _clone(st)
    g = _grad(n, torch.float32, 6)
    g[OPTIMIZER_BLOCKSIZE + 3] = float("nan")
    _run8(ops.optimizer_update_8bit_blockwise, "adam", g, p, st, qmap1, qmap2, 1)
    _run8(REF8, "adam", g, ref_p, ref, qmap1, qmap2, 1)
    assert st[2].isnan().tolist() == [False, True, False] == ref[2].isnan().tolist()
    assert torch.equal(st[0], ref[0]) and torch.equal(st[1], ref[1])
    assert torch.equal(p.isnan(), ref_p.isnan())
    torch.testing.assert_close(p.nan_to_num(), ref_p.nan_to_num(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("nan_at", [0, 7, 200, 255])
@pytest.mark.parametrize("name", ["adam", "lion"])
def test_8bit_map_with_a_nan_entry_matches_reference(name, nan_at):
    """A NaN in a map sorts after every number (the reference's stable sort) and the NaN midpoints next to
    it are searched as the reference's bucketize searches them: the same codes for every state."""
    qmap1, qmap2 = (m.clone() for m in MAPS["dynamic"])
    qmap1[nan_at] = qmap2[nan_at] = float("nan")
    n = 3 * OPTIMIZER_BLOCKSIZE + 5
    p = torch.randn(n, generator=torch.Generator().manual_seed(nan_at))
    st = _state8(name, n, 30 + nan_at, qmap1, qmap2)
    for codes in st[:2]:  # old states away from the NaN code, so that the blocks stay finite
        if codes is not None:
            codes[codes == nan_at] = (nan_at + 1) % 256
    ref_p, ref = p.clone(), _clone(st)
    g = _grad(n, torch.float32, 40 + nan_at)
    _run8(ops.optimizer_update_8bit_blockwise, name, g, p, st, qmap1, qmap2, 1)
    _run8(REF8, name, g, ref_p, ref, qmap1, qmap2, 1)
    _close_p(p, ref_p, f"{name} NaN at {nan_at}")
    for got, want in zip(st, ref, strict=True):
        if want is not None:
            _same_bits(got, want, f"{name} NaN at {nan_at}")


@pytest.mark.parametrize("name", ["adam", "momentum", "ademamix"])
def test_8bit_all_zero_block_matches_reference(name):
    """A block whose new states are all zero (absmax 0) takes the reference's codes for 0, not a NaN's."""
    qmap1, qmap2 = MAPS["dynamic"]
    n = 2 * OPTIMIZER_BLOCKSIZE
    st = _state8(name, n, 12, qmap1, qmap2)
    st[2].zero_()  # every old state dequantizes to 0
    if st[3] is not None:
        st[3].zero_()
    p, g = torch.randn(n), _grad(n, torch.float32, 12)
    g[:OPTIMIZER_BLOCKSIZE] = 0.0
    ref_p, ref = p.clone(), _clone(st)
    _run8(ops.optimizer_update_8bit_blockwise, name, g, p, st, qmap1, qmap2, 1, wd=0.0)
    _run8(REF8, name, g, ref_p, ref, qmap1, qmap2, 1, wd=0.0)
    assert ref[2][0].item() == 0.0
    for got, want in zip(st, ref, strict=True):
        if want is not None:
            _same_bits(got, want, name)
    _close_p(p, ref_p, name)


def test_8bit_strided_absmax_is_written_back():
    n = 4 * OPTIMIZER_BLOCKSIZE
    qmap1, qmap2 = MAPS["dynamic"]
    st = _state8("adam", n, 9, qmap1, qmap2)
    ref = _clone(st)
    wide = torch.zeros(4, 2)
    wide[:, 0] = st[2]
    st[2] = wide[:, 0]  # stride 2
    p, g = torch.randn(n), _grad(n, torch.float32, 9)
    ref_p = p.clone()
    _run8(ops.optimizer_update_8bit_blockwise, "adam", g, p, st, qmap1, qmap2, 1)
    _run8(REF8, "adam", g, ref_p, ref, qmap1, qmap2, 1)
    assert torch.equal(wide[:, 0], ref[2]) and torch.equal(st[0], ref[0])


def test_8bit_one_state_rules_leave_state2_alone():
    """A one-state optimizer given a state2 (as some callers pass) neither reads nor writes it."""
    qmap1, qmap2 = MAPS["dynamic"]
    n = OPTIMIZER_BLOCKSIZE + 3
    st = _state8("momentum", n, 3, qmap1, qmap2)
    st[1], st[3] = torch.full((n,), 7, dtype=torch.uint8), torch.full((2,), 3.0)
    p, g = torch.randn(n), _grad(n, torch.float32, 3)
    ops.optimizer_update_8bit_blockwise("momentum", g, p, st[0], st[1], 0.9, 0.0, 0.0, 0.0, 1e-8, 1, 0.1, qmap1,
                                        qmap2, st[2], st[3], 0.0, 1.0)  # fmt: skip
    assert torch.equal(st[1], torch.full((n,), 7, dtype=torch.uint8)) and torch.equal(st[3], torch.full((2,), 3.0))


# ---------------------------------------------------------------------------------------------------
# 32-bit


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", NAMES)
def test_32bit_identical_to_reference(name, dtype):
    n = 3 * OPTIMIZER_BLOCKSIZE + 33  # a short last threadgroup
    p = torch.randn(n, generator=torch.Generator().manual_seed(3)).to(dtype)
    st = _state32(name, n, 4)
    ref_p, ref_st = p.clone(), _clone(st)
    for step, wd in ((1, 0.0), (2, 0.01), (3, 0.01)):
        g = _grad(n, dtype, 20 + step)
        _run32(ops.optimizer_update_32bit, name, g, p, st, step, wd=wd, skip=step == 3)
        _run32(REF32, name, g, ref_p, ref_st, step, wd=wd, skip=step == 3)
        _close_p(p, ref_p, f"{name} {dtype} step {step}")
        for got, want in zip(st, ref_st, strict=True):
            if want is not None:
                _same_bits(got, want, f"{name} {dtype} step {step}")


@pytest.mark.parametrize("name", NAMES)
def test_32bit_max_unorm_matches_reference(name):
    n = 6 * OPTIMIZER_BLOCKSIZE + 7  # more threadgroups than the emulated norm grid: the strided loop
    p = torch.randn(n, generator=torch.Generator().manual_seed(5))
    st = _state32(name, n, 6)
    ref_p, ref_st = p.clone(), _clone(st)
    for step in (1, 2):
        # max_unorm small enough that the trust ratio clips (a scale != 1) for the rules that use it
        g = _grad(n, torch.float32, 30 + step)
        _run32(ops.optimizer_update_32bit, name, g, p, st, step, max_unorm=0.02, skip=step == 2)
        _run32(REF32, name, g, ref_p, ref_st, step, max_unorm=0.02, skip=step == 2)
        torch.testing.assert_close(st[2], ref_st[2], rtol=1e-5, atol=0)
        torch.testing.assert_close(p, ref_p, rtol=1e-5, atol=1e-6)
        for got, want in zip(st[:2], ref_st[:2], strict=True):
            if want is not None:
                _same_bits(got, want, f"{name} step {step}")
        ref_p.copy_(p)
        ref_st[2].copy_(st[2])  # restart the reference from our (last-bit different) values


def test_32bit_max_unorm_actually_clips():
    n = 2 * OPTIMIZER_BLOCKSIZE
    outs = []
    for max_unorm in (0.0, 0.02):
        p = torch.randn(n, generator=torch.Generator().manual_seed(5))
        st = _state32("lamb", n, 6)
        _run32(ops.optimizer_update_32bit, "lamb", _grad(n, torch.float32, 1), p, st, 2, max_unorm=max_unorm)
        outs.append(p)
    assert not torch.allclose(outs[0], outs[1])


@pytest.mark.parametrize("max_unorm", [0.0, 1.0])
@pytest.mark.parametrize("n", [0, 1, 255, 257])
def test_32bit_small_sizes(n, max_unorm):
    for name in ("lamb", "ademamix", "lion", "lars"):
        p = torch.randn(n, generator=torch.Generator().manual_seed(n))
        st = _state32(name, n, 8)
        ref_p, ref = p.clone(), _clone(st)
        g = _grad(n, torch.float32, n + 1)
        _run32(ops.optimizer_update_32bit, name, g, p, st, 2, max_unorm=max_unorm)
        _run32(REF32, name, g, ref_p, ref, 2, max_unorm=max_unorm)
        torch.testing.assert_close(p, ref_p, rtol=1e-5, atol=1e-6)
        for got, want in zip(st, ref, strict=True):
            if want is not None:
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)


def test_without_the_kernel_the_reference_serves(monkeypatch):
    """Where a kernel is not loaded (bf16 below MSL 3.1, a source that failed), the op is the reference's."""
    called = []
    monkeypatch.setattr(ops, "native", lambda name, threads=0: called.append(name) and False)
    monkeypatch.setattr(ops, "dispatch", lambda *a, **k: pytest.fail("dispatched without a loaded kernel"))
    n = OPTIMIZER_BLOCKSIZE + 1
    qmap1, qmap2 = MAPS["dynamic"]
    p, st = torch.randn(n), _state8("adam", n, 1, qmap1, qmap2)
    ref_p, ref = p.clone(), _clone(st)
    g = _grad(n, torch.bfloat16, 2).float()
    _run8(ops.optimizer_update_8bit_blockwise, "adam", g, p, st, qmap1, qmap2, 1)
    _run8(REF8, "adam", g, ref_p, ref, qmap1, qmap2, 1)
    assert called == ["optimizer_8bit_blockwise_f32"] and torch.equal(p, ref_p) and torch.equal(st[0], ref[0])
    st32, ref32 = _state32("lamb", n, 3), None
    ref32, p32 = _clone(st32), p.clone()
    _run32(ops.optimizer_update_32bit, "lamb", g, p, st32, 1, max_unorm=1.0)
    _run32(REF32, "lamb", g, p32, ref32, 1, max_unorm=1.0)
    assert torch.equal(p, p32) and torch.equal(st32[2], ref32[2])


def test_dispatch_binds_lists_as_constant_arrays():
    """hyper / config go as Python lists (torch binds float32 / int64 arrays); the dispatcher checks them."""
    with pytest.raises(TypeError, match="config"):
        library.dispatch("optimizer_32bit_norm_total", torch.zeros(2), torch.zeros(1), [1.0, 0.0],
                         threads=256, group_size=256)  # fmt: skip
    with pytest.raises(TypeError, match="config"):
        library.dispatch("optimizer_32bit_norm_total", torch.zeros(2), torch.zeros(1), [], threads=256, group_size=256)
    unorm = torch.zeros(1)
    library.dispatch("optimizer_32bit_norm_total", torch.tensor([1.0, 2.0]), unorm, [1, 1], threads=256,
                     group_size=256)  # fmt: skip
    assert unorm.item() == 3.0


def test_ops_are_registered_with_their_source():
    from bitsandbytes_mps.ops import all_ops

    assert ops.SOURCES == (table.SOURCE,)
    assert all_ops()["optimizer_update_8bit_blockwise"] is ops.optimizer_update_8bit_blockwise
    assert all_ops()["optimizer_update_32bit"] is ops.optimizer_update_32bit


def test_bad_arguments_raise_the_reference_errors_before_writing():
    n = 2 * OPTIMIZER_BLOCKSIZE
    g, p = torch.randn(n), torch.randn(n)
    before = p.clone()
    qmap1, qmap2 = MAPS["dynamic"]
    st = _state8("adam", n, 1, qmap1, qmap2)
    with pytest.raises(ValueError, match="absmax1"):
        _run8(ops.optimizer_update_8bit_blockwise, "adam", g, p, [st[0], st[1], torch.ones(1), st[3]], qmap1,
              qmap2, 1)  # fmt: skip
    with pytest.raises(ValueError, match="optimizer_name"):
        _run8(ops.optimizer_update_8bit_blockwise, "sgd", g, p, st, qmap1, qmap2, 1)
    with pytest.raises(ValueError, match="unorm_vec"):
        _run32(ops.optimizer_update_32bit, "lamb", g, p, [torch.zeros(n), torch.zeros(n), None], 1, max_unorm=1.0)
    assert torch.equal(p, before)


# ---------------------------------------------------------------------------------------------------
# The source and the table


def test_table_matches_the_source_signatures():
    source = _assemble.source_path(table.SOURCE).read_text()
    parsed = tables.parse_kernels(source, table.SOURCE)
    assert set(parsed) == {k.name for k in table.KERNELS}
    for k in table.KERNELS:
        assert parsed[k.name] == k, k.name


def test_format_constants_come_from_the_core():
    """The scale floor and the state block are the generated constants (tables/_generate.py), not literals."""
    source = _assemble.source_path(table.SOURCE).read_text()
    generated = re.findall(r"#define (\w+) ", _generate.generated_regions(source)["constants"])
    assert {"BNB_MIN_SCALE_BITS", "BNB_OPTIMIZER_BLOCKSIZE"} <= set(generated)
    assert re.search(r"kBlock = BNB_OPTIMIZER_BLOCKSIZE;", source)
    assert table.THREADS == OPTIMIZER_BLOCKSIZE


def test_bfloat_kernels_are_guarded():
    """The bf16 instances sit under BNB_HAS_BFLOAT, so the library compiles where MSL < 3.1 lacks bfloat."""
    source = _assemble.source_path(table.SOURCE).read_text()
    guarded = source[source.index("#if BNB_HAS_BFLOAT") :]
    for k in table.KERNELS:
        if k.name.endswith("_bf16"):
            assert f'host_name("{k.name}")' in guarded and f'host_name("{k.name}")' not in source[: -len(guarded)]
