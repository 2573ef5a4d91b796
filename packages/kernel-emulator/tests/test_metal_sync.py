"""Metal emulation: threadgroup barriers, SIMD-group functions and atomics behave as on Apple GPUs."""

from pathlib import Path

import pytest
import torch

from bitsandbytes_emu.build import unavailable_reason

pytestmark = pytest.mark.skipif(unavailable_reason() is not None, reason=unavailable_reason() or "")

KERNELS = Path(__file__).parent / "kernels"


def _lib(name):
    from bitsandbytes_emu.metal import metal_library

    return metal_library(KERNELS / name)


def _error():
    from bitsandbytes_emu.errors import EmulationError

    return EmulationError


@pytest.mark.parametrize("order", ["forward", "reverse"])
@pytest.mark.parametrize(("n", "group"), [(256, 256), (1000, 256), (37, 64), (300, 128)])
def test_threadgroup_tree_sum_with_tail_group(n, group, order, monkeypatch):
    # Either lane order (BNB_EMU_ORDER): threadgroup memory is reset once per threadgroup, before its
    # first lane runs, never under lanes that have already written it.
    monkeypatch.setenv("BNB_EMU_ORDER", order)
    lib = _lib("metal_reduce.metal")
    x = torch.arange(n, dtype=torch.float32) % 17 - 8  # small integers: every order sums exactly
    groups = -(-n // group)
    out = torch.full((groups,), -1.0)
    lib.tg_tree_sum(x, out, n, threads=n, group_size=group)
    want = torch.stack([x[i * group : (i + 1) * group].sum() for i in range(groups)])
    assert torch.equal(out, want)

    out2 = torch.full((groups,), -1.0)
    lib.simd_then_tg_sum(x, out2, n, threads=n, group_size=group)
    assert torch.equal(out2, want)


def test_missing_barrier_changes_the_result(monkeypatch):
    # Without the barriers lane 0 adds slots other lanes have not written yet. Threadgroup memory starts
    # as all-ones bits (NaN) in emulation, so the race shows instead of passing by luck. (In reverse lane
    # order this particular tree happens to come out right: each order exposes different races.)
    monkeypatch.setenv("BNB_EMU_ORDER", "forward")
    lib = _lib("metal_reduce.metal")
    x = torch.ones(256)
    good, bad = torch.zeros(1), torch.zeros(1)
    lib.tg_tree_sum(x, good, 256, threads=256, group_size=256)
    lib.tg_tree_sum_no_barrier(x, bad, 256, threads=256, group_size=256)
    assert good.item() == 256.0
    assert torch.isnan(bad).all()


def test_barrier_in_divergent_code_is_an_error_not_a_hang():
    lib = _lib("metal_reduce.metal")
    with pytest.raises(_error(), match=r"barrier_in_branch.*barrier not reached by every lane") as e:
        lib.barrier_in_branch(torch.zeros(64), threads=64, group_size=64)
    assert "metal_reduce.metal:" in str(e.value)  # names the barrier's line
    with pytest.raises(_error(), match="barrier not reached by every lane"):
        lib.barrier_after_return(torch.zeros(64), 40, threads=64, group_size=64)
    # In the short last threadgroup of a grid the message names its position in the whole grid.
    with pytest.raises(_error(), match=r"threadgroup \(2,0,0\): barrier not reached"):
        lib.barrier_after_return(torch.zeros(80), 75, threads=80, group_size=32)


def _simd_model(x, threads, group):
    """Per lane: the global ids of its SIMD-group's members (Metal: lanes of a possibly short group)."""
    members = []
    for g in range(threads):
        base = g // group * group
        size = min(group, threads - base)
        sg = (g - base) // 32
        lo = base + 32 * sg
        members.append(list(range(lo, min(lo + 32, base + size))))
    return members


@pytest.mark.parametrize(("threads", "group"), [(64, 64), (70, 70), (100, 50)])
def test_simd_functions_per_lane(threads, group):
    lib = _lib("metal_simd.metal")
    gen = torch.Generator().manual_seed(threads)
    x = torch.randint(-20, 21, (threads,), generator=gen).float()
    out = torch.zeros(11 * threads)
    lib.simd_all_ops(x, out, threads, threads=threads, group_size=group)
    out = out.view(11, threads)
    nan = float("nan")
    for g, mem in enumerate(_simd_model(x, threads, group)):
        lane = g - mem[0]
        vals = {m - mem[0]: x[m].item() for m in mem}

        def at(src, vals=vals):
            return vals.get(src, nan)

        want = [
            sum(vals.values()),
            max(vals.values()),
            min(vals.values()),
            sum(v for k, v in vals.items() if k <= lane),
            sum(v for k, v in vals.items() if k < lane),
            vals[lane] if lane + 1 >= 32 else at(lane + 1),  # upper lanes keep their value
            vals[lane] if lane < 2 else at(lane - 2),
            at(lane ^ 5),
            at(3),
            at(31 - lane),
            float(sum(1 << k for k, v in vals.items() if v > 0 and k < 16)),
        ]
        got = out[:, g].tolist()
        for row, (w, o) in enumerate(zip(want, got, strict=True)):
            assert (w != w and o != o) or w == o, f"lane {g} row {row}: want {w}, got {o}"


def test_shuffle_down_tree_and_partial_simdgroup_reads_undefined_lanes():
    lib = _lib("metal_simd.metal")
    x = torch.arange(128, dtype=torch.int32)
    out = torch.zeros(4, dtype=torch.int32)
    lib.shuffle_tree(x, out, threads=128, group_size=128)
    assert out.tolist() == [int(x[i * 32 : (i + 1) * 32].sum()) for i in range(4)]
    # 40 threads: the second SIMD-group has 8 lanes; lane 0's tree reads lanes 8..31 that do not exist,
    # which is undefined on hardware: emulation gives all-ones bits, so the sum is visibly wrong.
    out = torch.zeros(2, dtype=torch.int32)
    lib.shuffle_tree(x[:40].clone(), out, threads=40, group_size=40)
    assert out[0].item() == int(x[:32].sum())
    assert out[1].item() != int(x[32:40].sum())


def test_simd_functions_skip_lanes_that_returned():
    lib = _lib("metal_simd.metal")
    x = torch.tensor([1] * 20 + [7] + [-1] * 43, dtype=torch.int32)
    out = torch.full((3 * 64,), -9, dtype=torch.int32)
    lib.active_lanes(x, out, 21, threads=64, group_size=64)
    got = out.view(64, 3)
    assert got[:21].tolist() == [[27, 1, 1]] * 21  # only lanes 0..20 take part
    assert (got[21:] == -9).all()


def test_simd_sum_of_half_vectors_rounds_like_half():
    lib = _lib("metal_simd.metal")
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(32, 4, generator=gen).half()
    out = torch.zeros(32, 4, dtype=torch.half)
    lib.simd_sum_vectors(x, out, threads=32, group_size=32)
    acc = x[0].clone()
    for i in range(1, 32):
        acc = (acc.float() + x[i].float()).half()  # one half rounding per addition, in lane order
    assert torch.equal(out, acc.expand(32, 4))


def test_simd_function_in_divergent_code_is_reported():
    lib = _lib("metal_simd.metal")
    with pytest.raises(
        _error(),
        match=r"simd_in_branch.*deadlock.*simd_sum.*threadgroup_barrier|"
        r"simd_in_branch.*deadlock.*threadgroup_barrier.*simd_sum",
    ):
        lib.simd_in_branch(torch.zeros(32), threads=32, group_size=32)


def test_simd_function_reached_from_two_branches_is_reported():
    lib = _lib("metal_simd.metal")
    with pytest.raises(_error(), match=r"simd_sum_both_branches.*reach simd_sum at different places"):
        lib.simd_sum_both_branches(torch.zeros(32), threads=32, group_size=32)


def test_shuffle_delta_must_be_uniform():
    lib = _lib("metal_simd.metal")
    with pytest.raises(_error(), match=r"simd_shuffle_down at .*metal_simd.metal:\d+: its delta must be the same"):
        lib.nonuniform_delta(torch.zeros(32), threads=32, group_size=32)


def test_atomics_from_many_lanes_and_groups():
    lib = _lib("metal_atomics.metal")
    n, group = 1000, 128
    x = (torch.arange(n) % 13).float()
    counter = torch.zeros(1, dtype=torch.int32)
    total = torch.zeros(1)
    biggest = torch.full((1,), -1, dtype=torch.int32)
    per_group = torch.zeros(8, dtype=torch.int32)
    lib.count_and_sum(counter, total, biggest, x, per_group, threads=n, group_size=group)
    assert counter.item() == n
    assert total.item() == x.sum().item()
    assert biggest.item() == 999
    assert per_group.tolist() == [128] * 7 + [104]

    data = torch.randint(0, 256, (777,), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    bins = torch.zeros(16, dtype=torch.int32)
    lib.histogram(data, bins, threads=777, group_size=64)
    assert bins.tolist() == torch.bincount((data & 15).long(), minlength=16).tolist()


def test_float_atomics_are_deterministic_and_in_lane_order(monkeypatch):
    monkeypatch.setenv("BNB_EMU_ORDER", "forward")
    lib = _lib("metal_atomics.metal")
    n = 700
    x = torch.randn(n, generator=torch.Generator().manual_seed(3))
    results = []
    for _ in range(3):
        counter, total = torch.zeros(1, dtype=torch.int32), torch.zeros(1)
        biggest, per_group = torch.zeros(1, dtype=torch.int32), torch.zeros(11, dtype=torch.int32)
        lib.count_and_sum(counter, total, biggest, x, per_group, threads=n, group_size=64)
        results.append(total.clone())
    assert all(torch.equal(r, results[0]) for r in results)
    acc = torch.zeros((), dtype=torch.float32)
    for v in x:  # threadgroups in order, lanes in order: one fixed float summation order
        acc = acc + v
    assert torch.equal(results[0], acc.reshape(1))
