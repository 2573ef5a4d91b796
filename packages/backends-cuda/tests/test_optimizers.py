"""The optimizer kernels (csrc/kernels/optimizers.cu) run in the emulator against the reference.

What is pinned down, and why it can be:
- The kernels repeat the reference's float32 operations in its order with explicitly rounded intrinsics
  (no FMA contraction), so the new states are the reference's *bits*, every dtype, skip_zeros and weight
  decay included; 8-bit codes and absmax are then identical too, for the dynamic maps and for maps that
  exercise the nearest-code search's corners (unsorted, duplicates, clustered).
- p goes through a square root for most rules. The kernels' is correctly rounded; torch's vectorized CPU
  sqrt, which the reference runs on, is not (about 20% of random inputs are 1 ulp off on an AVX-512 host),
  so p is compared within rtol 1e-5 / atol 1e-6 and the reference restarts from our p after each step.
- With max_unorm the squared norm is a sum in another order (per-block float partials, then a double
  total): unorm_vec within rtol 1e-5 of the reference's float32 sum; the scale then differs in the last
  bits, which the p tolerance covers; the states (which the scale does not touch) are still exact.
- NaN gradients poison their 8-bit block's absmax as the reference does; strided absmax is written back.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import torch

import bitsandbytes
from bitsandbytes import functional
from bitsandbytes._ops import OPTIMIZER_BLOCKSIZE, TWO_STATE_OPTIMIZERS
from bitsandbytes._reference import REFERENCE
from bitsandbytes_cuda import launch
from bitsandbytes_cuda.ops import optimizers as ops

pytestmark = pytest.mark.usefixtures("emulated")  # conftest.py: launch() runs in the emulator

NAMES = ("adam", "momentum", "rmsprop", "lion", "adagrad", "ademamix", "lamb", "lars")
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
HP = {"beta1": 0.9, "beta2": 0.995, "beta3": 0.999, "alpha": 5.0, "eps": 1e-6, "lr": 1e-2, "gnorm_scale": 0.8}
REF8 = REFERENCE["optimizer_update_8bit_blockwise"]
REF32 = REFERENCE["optimizer_update_32bit"]
CSRC = Path(__file__).parents[1] / "csrc"


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


def _nan_maps(layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    qmap1, qmap2 = (m.clone() for m in MAPS["dynamic"])
    if layout == "scattered":
        qmap1[[3, 77, 200]] = float("nan")
        qmap2[[10, 128]] = float("nan")
    elif layout == "last":  # sorted in torch's order, NaN after every number
        qmap1[255] = qmap2[255] = float("nan")
    else:  # shuffled, with NaN
        gen = torch.Generator().manual_seed(11)
        qmap1, qmap2 = (m[torch.randperm(256, generator=gen)] for m in (qmap1, qmap2))
        qmap1[[0, 1, 250]] = qmap2[[5, 6]] = float("nan")
    return qmap1, qmap2


@pytest.mark.parametrize("layout", ["scattered", "last", "shuffled"])
@pytest.mark.parametrize("name", ["adam", "ademamix", "rmsprop", "lion"])
def test_8bit_map_with_nan_matches_the_reference(name, layout):
    # A user-supplied map may hold NaN: the reference sorts it after every number (torch.argsort, stable)
    # and searches the midpoints as torch.bucketize does; the kernel's map must be built in that order,
    # every slot written exactly once, whatever the threads' timing.
    qmap1, qmap2 = _nan_maps(layout)
    n = 3 * OPTIMIZER_BLOCKSIZE + 40
    p = torch.randn(n, generator=torch.Generator().manual_seed(12))
    st = _state8(name, n, 13, qmap1, qmap2)
    for codes, qmap in ((st[0], qmap1), (st[1], qmap2)):  # start from finite states
        if codes is not None:
            finite = torch.nonzero(~qmap.isnan()).flatten()
            bad = qmap[codes.long()].isnan()
            codes[bad] = finite[codes[bad].long() % finite.numel()].to(torch.uint8)
    ref_p, ref = p.clone(), _clone(st)
    g = _grad(n, torch.float32, 14)
    _run8(ops.optimizer_update_8bit_blockwise, name, g, p, st, qmap1, qmap2, 1)
    _run8(REF8, name, g, ref_p, ref, qmap1, qmap2, 1)
    _close_p(p, ref_p, f"{name} {layout}")
    for got, want, what in zip(st, ref, ("state1", "state2", "absmax1", "absmax2"), strict=True):
        if want is not None:
            _same_bits(got, want, f"{name} {layout}: {what}")


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


# ---------------------------------------------------------------------------------------------------
# 32-bit


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", NAMES)
def test_32bit_identical_to_reference(name, dtype):
    n = 5 * OPTIMIZER_BLOCKSIZE + 33
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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", ["adam", "ademamix", "rmsprop"])
def test_32bit_vector_and_scalar_paths_agree(name, dtype, monkeypatch):
    """Aligned buffers take 4-element vector loads, misaligned views the scalar loop: same bits."""
    flags = []

    def spy(kernel, *args):
        if kernel.startswith("optimizer_32bit_") and "norm" not in kernel:
            flags.append(args[9] & ops._VECTOR)
        launch.launch(kernel, *args)

    monkeypatch.setattr(ops, "launch", spy)
    n = 3 * OPTIMIZER_BLOCKSIZE + 4  # a multiple of 4: ademamix may vectorize too
    runs = []
    for offset in (0, 1):
        # The same values, at an offset of `offset` elements into their storage.
        def at(t, offset=offset):
            return torch.cat([t.new_zeros(offset), t])[offset:] if t is not None else None

        p = at(torch.randn(n, generator=torch.Generator().manual_seed(2)).to(dtype))
        st = [at(t) for t in _state32(name, n, 3)]
        for step in (1, 2):
            _run32(ops.optimizer_update_32bit, name, at(_grad(n, dtype, step)), p, st, step, skip=step == 2)
        runs.append([p, *st])
    assert flags == [ops._VECTOR] * 2 + [0] * 2
    for got, want in zip(runs[1], runs[0], strict=True):
        if want is not None:
            _same_bits(got, want, f"{name} {dtype}")


@pytest.mark.parametrize("name", NAMES)
def test_32bit_max_unorm_matches_reference(name):
    n = 6 * OPTIMIZER_BLOCKSIZE + 7
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
# The sources are real CUDA


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA toolkit)")
def test_kernels_compile_with_nvcc(tmp_path):
    from bitsandbytes_cuda.tables import optimizers as table

    # Taking each table entry's address instantiates it, as the generated launchers do.
    refs = ", ".join(f"(void*)&{k.expr}" for k in table.KERNELS)
    src = tmp_path / "instances.cu"
    src.write_text(f'#include "kernels/optimizers.cu"\nvoid* instances[] = {{{refs}}};\n')
    include = ["-I", str(CSRC), "-I", bitsandbytes.get_include(), "-I", str(CSRC / "kernels")]
    run = subprocess.run(["nvcc", "-arch=sm_80", "-ptx", *include, str(src), "-o", str(tmp_path / "o.ptx")],
                         capture_output=True, text=True)  # fmt: skip
    assert run.returncode == 0, run.stderr
    ptx = (tmp_path / "o.ptx").read_text()
    # The element math must not be contracted or approximated (the reference's bits depend on it).
    assert "fma.rn.f32" not in ptx and ".approx.f32" not in ptx.replace("ex2.approx", "")
