"""Optimizer steps at their edges: unusual code maps, odd sizes, NaN, strided absmax, one-state rules.

``test_optimizers`` checks every rule and dtype over a few steps; this module adds the cases where
kernels tend to go wrong: maps that are unsorted, linear, hold duplicates, clusters or NaN entries (the
nearest-code search's corners), sizes 0 to 257 around one block, a NaN gradient (it poisons its own
block only), an all-zero block, a strided absmax (written back through the view), a one-state rule
handed a state2 (left alone), bad arguments (raised before anything is written).

Every step starts the reference from the device's tensors, so each step is compared on its own.

Comparison: ``p`` within ``test_optimizers``' parameter tolerance. States: with ``--bnb-bitexact``
(kernels that repeat the reference's float32 operations in its order, without FMA contraction, such as
the emulated CUDA and Metal kernels) bit for bit, since the new states then are the reference's bits
and the codes follow. Without it, within ``test_optimizers``' state tolerances; 8-bit codes compared by
the rank of their map value, so that a neighbour code means a neighbour value in any map layout.
``unorm_vec`` is a sum in any order: ``rtol 1e-5`` in both modes.
"""

from __future__ import annotations

import pytest
import torch

from bitsandbytes import functional
from bitsandbytes._ops import OPTIMIZER_BLOCKSIZE, TWO_STATE_OPTIMIZERS
from bitsandbytes._reference import REFERENCE

from ..cases import DTYPES, dtype_id, to
from ..compare import assert_close, assert_codes_near, assert_equal
from ..samples import op_overload
from .test_optimizers import EPS32, assert_params_close

NAMES = ("adam", "momentum", "rmsprop", "lion", "adagrad", "ademamix", "lamb", "lars")
HP = {"beta1": 0.9, "beta2": 0.995, "beta3": 0.999, "alpha": 5.0, "eps": 1e-6, "lr": 1e-2, "gnorm_scale": 0.8}
B = OPTIMIZER_BLOCKSIZE
STATE8 = ("state1", "state2", "absmax1", "absmax2")
STATE32 = ("state1", "state2", "unorm_vec")


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


def nan_maps(layout: str) -> tuple[torch.Tensor, torch.Tensor]:
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


def grad(n, dtype, seed):
    g = torch.randn(n, generator=torch.Generator().manual_seed(seed)).to(dtype)
    g[::11] = 0  # skip_zeros has work to do
    return g


def state8(name, n, seed, qmap1, qmap2) -> dict:
    gen = torch.Generator().manual_seed(seed)
    blocks = -(n // -B)
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
    return {"state1": s1, "state2": s2, "absmax1": a1, "absmax2": a2}


def state32(name, n, seed) -> dict:
    gen = torch.Generator().manual_seed(seed)
    ema = 2 if name == "ademamix" else 1
    s1 = torch.rand(ema * n, generator=gen) * 0.1
    s2 = torch.rand(n, generator=gen) * 0.01 if name in TWO_STATE_OPTIMIZERS else None
    return {"state1": s1, "state2": s2, "unorm_vec": torch.tensor([2.0])}


def args8(name, g, p, st, qmap1, qmap2, step, wd, skip):
    two = name in TWO_STATE_OPTIMIZERS
    return (name, g, p, st["state1"], st["state2"], HP["beta1"], HP["beta2"], HP["beta3"], HP["alpha"], HP["eps"],
            step, HP["lr"], qmap1, qmap2 if two else None, st["absmax1"], st["absmax2"], wd, HP["gnorm_scale"],
            skip)  # fmt: skip


def args32(name, g, p, st, step, max_unorm, wd, skip):
    return (name, g, p, st["state1"], st["state2"], st["unorm_vec"], max_unorm, 1.5, HP["beta1"], HP["beta2"],
            HP["beta3"], HP["alpha"], HP["eps"], wd, step, HP["lr"], HP["gnorm_scale"], skip)  # fmt: skip


def step8(device, name, g, p, st, qmap1, qmap2, step=1, wd=0.01, skip=False):
    """One 8-bit step on the device (``p``, ``st`` updated in place) and on the reference from CPU copies of
    the same inputs; returns the reference's ``(p, states)``."""
    ref_p, ref_st = p.cpu().clone(), to(st, "cpu")
    q1, q2 = to((qmap1, qmap2), device)
    op_overload("optimizer_update_8bit_blockwise")(*args8(name, g.to(device), p, st, q1, q2, step, wd, skip))
    REFERENCE["optimizer_update_8bit_blockwise"](*args8(name, g.cpu(), ref_p, ref_st, qmap1, qmap2, step, wd, skip))
    return ref_p, ref_st


def step32(device, name, g, p, st, step=1, max_unorm=0.0, wd=0.01, skip=False):
    ref_p, ref_st = p.cpu().clone(), to(st, "cpu")
    op_overload("optimizer_update_32bit")(*args32(name, g.to(device), p, st, step, max_unorm, wd, skip))
    REFERENCE["optimizer_update_32bit"](*args32(name, g.cpu(), ref_p, ref_st, step, max_unorm, wd, skip))
    return ref_p, ref_st


def map_ranks(codes: torch.Tensor, qmap: torch.Tensor) -> torch.Tensor:
    """Each code's rank among the distinct values of ``qmap`` (NaN after every number, as the reference
    sorts it): neighbouring ranks are neighbouring values, whatever the order of the map."""
    values = qmap.cpu().double().nan_to_num(nan=float("inf"))
    return torch.searchsorted(torch.unique(values), values[codes.cpu().long()])


def assert_states8(st, ref, qmap1, qmap2, bitexact, what):
    for key in STATE8:
        if ref[key] is None:
            continue
        if bitexact:
            assert_equal(st[key], ref[key], f"{what}: {key}")
        elif key.startswith("absmax"):
            assert_close(st[key], ref[key], f"{what}: {key}", rtol=32 * EPS32, atol=0)
        else:
            qmap = qmap1 if key == "state1" else qmap2
            got, want = map_ranks(st[key], qmap), map_ranks(ref[key], qmap)
            assert_codes_near(got, want, f"{what}: {key} (rank of the code's value)", max_step=1, max_fraction=0.01)


def assert_states32(st, ref, bitexact, what):
    for key in STATE32:
        want = ref[key]
        if want is None:
            continue
        if key == "unorm_vec":
            assert_close(st[key], want, f"{what}: unorm_vec", rtol=1e-5, atol=0)
        elif bitexact:
            assert_equal(st[key], want, f"{what}: {key}")
        else:
            atol = 32 * EPS32 * want.abs().max().item()
            assert_close(st[key], want, f"{what}: {key}", rtol=32 * EPS32, atol=atol)


# ---------------------------------------------------------------------------------------------------
# 8-bit


@pytest.mark.parametrize("map_name", list(MAPS))
@pytest.mark.parametrize("name", NAMES)
def test_8bit_maps(bnb_device, bnb_bitexact, name, map_name):
    qmap1, qmap2 = MAPS[map_name]
    n = 3 * B + 77  # several blocks and a short last one
    p = torch.randn(n, generator=torch.Generator().manual_seed(1)).to(bnb_device)
    st = to(state8(name, n, 2, qmap1, qmap2), bnb_device)
    before = p.cpu().clone()
    ref_p, ref = step8(bnb_device, name, grad(n, torch.float32, 11), p, st, qmap1, qmap2)
    assert_params_close(p, ref_p, before, name, f"{name} {map_name}: p")
    assert_states8(st, ref, qmap1, qmap2, bnb_bitexact, f"{name} {map_name}")


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("name", NAMES)
def test_8bit_dtypes(bnb_device, bnb_bitexact, name, dtype):
    qmap1, qmap2 = MAPS["dynamic"]
    n = 2 * B + 45
    p = torch.randn(n, generator=torch.Generator().manual_seed(3)).to(dtype).to(bnb_device)
    st = to(state8(name, n, 4, qmap1, qmap2), bnb_device)
    for step, wd in ((1, 0.0), (2, 0.01)):
        before = p.cpu().clone()
        ref_p, ref = step8(bnb_device, name, grad(n, dtype, 20 + step), p, st, qmap1, qmap2, step, wd, step == 2)
        what = f"{name} {dtype_id(dtype)} step {step}"
        assert_params_close(p, ref_p, before, name, f"{what}: p")
        assert_states8(st, ref, qmap1, qmap2, bnb_bitexact, what)


@pytest.mark.parametrize("n", [1, 15, 255, 256, 257])
@pytest.mark.parametrize("name", ["adam", "ademamix", "lion"])
def test_8bit_small_sizes(bnb_device, bnb_bitexact, name, n):
    qmap1, qmap2 = MAPS["dynamic"]
    p = torch.randn(n, generator=torch.Generator().manual_seed(n)).to(bnb_device)
    st = to(state8(name, n, 8, qmap1, qmap2), bnb_device)
    before = p.cpu().clone()
    ref_p, ref = step8(bnb_device, name, grad(n, torch.float32, n + 1), p, st, qmap1, qmap2)
    assert_params_close(p, ref_p, before, name, f"{name} n={n}: p")
    assert_states8(st, ref, qmap1, qmap2, bnb_bitexact, f"{name} n={n}")


def test_8bit_empty_is_a_no_op(bnb_device):
    qmap1, qmap2 = MAPS["dynamic"]
    st = to(state8("adam", 0, 1, qmap1, qmap2), bnb_device)
    p = torch.zeros(0, device=bnb_device)
    step8(bnb_device, "adam", torch.zeros(0), p, st, qmap1, qmap2)
    assert p.numel() == 0 and st["absmax1"].numel() == 0


def test_8bit_nan_gradient_poisons_only_its_block(bnb_device, bnb_bitexact):
    qmap1, qmap2 = MAPS["dynamic"]
    n = 3 * B
    p = torch.randn(n, generator=torch.Generator().manual_seed(4)).to(bnb_device)
    st = to(state8("adam", n, 5, qmap1, qmap2), bnb_device)
    g = grad(n, torch.float32, 6)
    g[B + 3] = float("nan")
    before = p.cpu().clone()
    ref_p, ref = step8(bnb_device, "adam", g, p, st, qmap1, qmap2)
    assert st["absmax1"].isnan().tolist() == [False, True, False] == ref["absmax1"].isnan().tolist()
    assert st["absmax2"].isnan().tolist() == ref["absmax2"].isnan().tolist()
    assert torch.equal(p.cpu().isnan(), ref_p.isnan()), "NaN parameters where the reference has them"
    finite = ~ref_p.isnan()
    assert_params_close(p.cpu()[finite], ref_p[finite], before[finite], "adam", "finite p")
    keep = torch.arange(n) // B != 1  # the poisoned block's codes are not defined
    got = {k: (v.cpu()[keep] if k.startswith("state") else v) for k, v in st.items()}
    want = {k: (v[keep] if k.startswith("state") else v) for k, v in ref.items()}
    assert_states8(got, want, qmap1, qmap2, bnb_bitexact, "the other blocks")


@pytest.mark.parametrize("layout", ["scattered", "last", "shuffled"])
@pytest.mark.parametrize("name", ["adam", "ademamix", "rmsprop", "lion"])
def test_8bit_map_with_nan(bnb_device, bnb_bitexact, name, layout):
    # A user-supplied map may hold NaN: the reference sorts it after every number (torch.argsort, stable)
    # and searches the midpoints as torch.bucketize does.
    qmap1, qmap2 = nan_maps(layout)
    n = 3 * B + 40
    p = torch.randn(n, generator=torch.Generator().manual_seed(12)).to(bnb_device)
    st = state8(name, n, 13, qmap1, qmap2)
    for key, qmap in (("state1", qmap1), ("state2", qmap2)):  # start from finite states
        codes = st[key]
        if codes is not None:
            finite = torch.nonzero(~qmap.isnan()).flatten()
            bad = qmap[codes.long()].isnan()
            codes[bad] = finite[codes[bad].long() % finite.numel()].to(torch.uint8)
    st = to(st, bnb_device)
    before = p.cpu().clone()
    ref_p, ref = step8(bnb_device, name, grad(n, torch.float32, 14), p, st, qmap1, qmap2)
    assert_params_close(p, ref_p, before, name, f"{name} {layout}: p")
    assert_states8(st, ref, qmap1, qmap2, bnb_bitexact, f"{name} {layout}")


@pytest.mark.parametrize("name", ["adam", "momentum", "ademamix"])
def test_8bit_all_zero_block(bnb_device, bnb_bitexact, name):
    """A block whose new states are all zero (absmax 0) takes the reference's codes for 0, not a NaN's."""
    qmap1, qmap2 = MAPS["dynamic"]
    n = 2 * B
    st = state8(name, n, 12, qmap1, qmap2)
    st["absmax1"].zero_()  # every old state dequantizes to 0
    if st["absmax2"] is not None:
        st["absmax2"].zero_()
    st = to(st, bnb_device)
    p, g = torch.randn(n, generator=torch.Generator().manual_seed(12)).to(bnb_device), grad(n, torch.float32, 12)
    g[:B] = 0.0
    before = p.cpu().clone()
    ref_p, ref = step8(bnb_device, name, g, p, st, qmap1, qmap2, wd=0.0)
    assert ref["absmax1"][0].item() == 0.0
    assert_equal(st["absmax1"].cpu()[0], ref["absmax1"][0], f"{name}: the all-zero block's absmax")
    assert_states8(st, ref, qmap1, qmap2, bnb_bitexact, name)
    assert_params_close(p, ref_p, before, name, f"{name}: p")


def test_8bit_strided_absmax_is_written_back(bnb_device, bnb_bitexact):
    n = 4 * B
    qmap1, qmap2 = MAPS["dynamic"]
    st = to(state8("adam", n, 9, qmap1, qmap2), bnb_device)
    wide = torch.zeros(4, 2, device=bnb_device)
    wide[:, 0] = st["absmax1"]
    st["absmax1"] = wide[:, 0]  # stride 2
    p = torch.randn(n, generator=torch.Generator().manual_seed(9)).to(bnb_device)
    _, ref = step8(bnb_device, "adam", grad(n, torch.float32, 9), p, st, qmap1, qmap2)
    assert_states8({**st, "absmax1": wide[:, 0].clone()}, ref, qmap1, qmap2, bnb_bitexact, "strided absmax1")
    assert_equal(wide[:, 1], torch.zeros(4, device=bnb_device), "the elements between the strided absmax")


def test_8bit_one_state_rules_leave_state2_alone(bnb_device):
    """A one-state optimizer given a state2 (as some callers pass) neither reads nor writes it."""
    qmap1, qmap2 = MAPS["dynamic"]
    n = B + 3
    st = state8("momentum", n, 3, qmap1, qmap2)
    st["state2"], st["absmax2"] = torch.full((n,), 7, dtype=torch.uint8), torch.full((2,), 3.0)
    st = to(st, bnb_device)
    p = torch.randn(n, generator=torch.Generator().manual_seed(3)).to(bnb_device)
    g = grad(n, torch.float32, 3).to(bnb_device)
    op_overload("optimizer_update_8bit_blockwise")(
        "momentum", g, p, st["state1"], st["state2"], 0.9, 0.0, 0.0, 0.0, 1e-8, 1, 0.1, *to((qmap1, qmap2), bnb_device),
        st["absmax1"], st["absmax2"], 0.0, 1.0,
    )  # fmt: skip
    assert_equal(st["state2"], torch.full((n,), 7, dtype=torch.uint8), "state2")
    assert_equal(st["absmax2"], torch.full((2,), 3.0), "absmax2")


# ---------------------------------------------------------------------------------------------------
# 32-bit


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("name", NAMES)
def test_32bit_steps(bnb_device, bnb_bitexact, name, dtype):
    n = 5 * B + 33
    p = torch.randn(n, generator=torch.Generator().manual_seed(3)).to(dtype).to(bnb_device)
    st = to(state32(name, n, 4), bnb_device)
    for step, wd in ((1, 0.0), (2, 0.01), (3, 0.01)):
        before = p.cpu().clone()
        ref_p, ref = step32(bnb_device, name, grad(n, dtype, 20 + step), p, st, step, wd=wd, skip=step == 3)
        what = f"{name} {dtype_id(dtype)} step {step}"
        assert_params_close(p, ref_p, before, name, f"{what}: p")
        assert_states32(st, ref, bnb_bitexact, what)


@pytest.mark.parametrize("name", NAMES)
def test_32bit_max_unorm(bnb_device, bnb_bitexact, name):
    n = 6 * B + 7
    p = torch.randn(n, generator=torch.Generator().manual_seed(5)).to(bnb_device)
    st = to(state32(name, n, 6), bnb_device)
    for step in (1, 2):
        # max_unorm small enough that the trust ratio clips (a scale != 1) for the rules that use it. The
        # scale comes from unorm_vec, a sum in any order, so p gets rtol 1e-5 and the states are exact
        # only where the scale does not touch them (state1 and state2 are computed before it).
        before = p.cpu().clone()
        ref_p, ref = step32(bnb_device, name, grad(n, torch.float32, 30 + step), p, st, step, 0.02, skip=step == 2)
        assert_close(p, ref_p, f"{name} step {step}: p", rtol=1e-5, atol=1e-6)
        assert_states32(st, ref, bnb_bitexact, f"{name} step {step}")
        assert not torch.equal(p.cpu(), before), f"{name} step {step}: p must move"


def test_32bit_max_unorm_clips(bnb_device):
    n = 2 * B
    outs = []
    for max_unorm in (0.0, 0.02):
        p = torch.randn(n, generator=torch.Generator().manual_seed(5)).to(bnb_device)
        st = to(state32("lamb", n, 6), bnb_device)
        step32(bnb_device, "lamb", grad(n, torch.float32, 1), p, st, 2, max_unorm)
        outs.append(p.cpu())
    assert not torch.allclose(outs[0], outs[1]), "max_unorm=0.02 must change lamb's step"


@pytest.mark.parametrize("max_unorm", [0.0, 1.0])
@pytest.mark.parametrize("n", [0, 1, 255, 257])
@pytest.mark.parametrize("name", ["lamb", "ademamix", "lion", "lars"])
def test_32bit_small_sizes(bnb_device, name, n, max_unorm):
    p = torch.randn(n, generator=torch.Generator().manual_seed(n)).to(bnb_device)
    st = to(state32(name, n, 8), bnb_device)
    ref_p, ref = step32(bnb_device, name, grad(n, torch.float32, n + 1), p, st, 2, max_unorm)
    assert_close(p, ref_p, f"{name} n={n}: p", rtol=1e-5, atol=1e-6)
    for key in STATE32:
        if ref[key] is not None:
            assert_close(st[key], ref[key], f"{name} n={n}: {key}", rtol=1e-5, atol=1e-7)


def test_bad_arguments_raise_before_writing(bnb_device):
    n = 2 * B
    qmap1, qmap2 = MAPS["dynamic"]
    g = torch.randn(n, generator=torch.Generator().manual_seed(1))
    p = torch.randn(n, generator=torch.Generator().manual_seed(2)).to(bnb_device)
    before = p.cpu().clone()
    st = to(state8("adam", n, 1, qmap1, qmap2), bnb_device)
    with pytest.raises(ValueError, match="absmax1"):
        step8(bnb_device, "adam", g, p, {**st, "absmax1": torch.ones(1, device=bnb_device)}, qmap1, qmap2)
    with pytest.raises(ValueError, match="optimizer_name"):
        step8(bnb_device, "sgd", g, p, st, qmap1, qmap2)
    st32 = to({"state1": torch.zeros(n), "state2": torch.zeros(n), "unorm_vec": None}, bnb_device)
    with pytest.raises(ValueError, match="unorm_vec"):
        step32(bnb_device, "lamb", g, p, st32, max_unorm=1.0)
    assert_equal(p, before, "p after the refused calls")
