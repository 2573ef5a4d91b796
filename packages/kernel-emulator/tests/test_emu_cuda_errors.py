"""What the emulator reports instead of hanging or silently computing garbage: barriers not every lane
reaches, out-of-bounds accesses (naming the buffer), collectives with missing lanes, bad arguments."""

from __future__ import annotations

import re

import pytest
import torch

from bitsandbytes_emu import EmulationError

BUGS = [
    "sum_missing_barrier",
    "divergent_barrier",
    "early_exit_barrier",
    "copy_unguarded",
    "write_past_end",
    "write_before_start",
    "shuffle_outside_mask",
    "shuffle_after_exit",
    "shared_overflow",
    "wait_for_next_block",
]


@pytest.fixture(scope="module")
def bugs(cuda_kernels):
    return cuda_kernels("bugs.cu", BUGS)


def test_missing_barrier_changes_the_result_the_same_way_every_run(bugs):
    # Without the barrier lane 0 sums shared memory other lanes have not written yet: the result is
    # wrong, as it can be on hardware, and (unlike hardware) the same on every run.
    x = torch.arange(128, dtype=torch.float32)
    runs = []
    for _ in range(3):
        out = torch.zeros(2)
        bugs.sum_missing_barrier[2, 64](x, out)
        runs.append(out.tolist())
    assert runs[0] != [x[:64].sum().item(), x[64:].sum().item()]
    assert runs[0] == runs[1] == runs[2]


def test_the_reverse_lane_order_exposes_a_missing_barrier(bugs, cuda_kernels, monkeypatch):
    # Each order is deterministic; a kernel whose result depends on which one runs has a race.
    x = torch.arange(128, dtype=torch.float32)
    correct = [x[:64].sum().item(), x[64:].sum().item()]
    reduce = cuda_kernels("reduce.cu", {"sum64": "block_sum<64>"})
    results = {}
    for order in ("forward", "reverse"):
        monkeypatch.setenv("BNB_EMU_ORDER", order)
        racy, fine = torch.zeros(2), torch.zeros(2)
        bugs.sum_missing_barrier[2, 64](x, racy)
        reduce.sum64[2, 64](x, fine, 128)
        results[order] = racy.tolist()
        assert fine.tolist() == correct
    assert results["forward"] != results["reverse"]
    monkeypatch.setenv("BNB_EMU_ORDER", "sideways")
    with pytest.raises(EmulationError, match="BNB_EMU_ORDER must be 'forward' or 'reverse', got 'sideways'"):
        bugs.sum_missing_barrier[2, 64](x, torch.zeros(2))


def test_barrier_in_divergent_code_is_a_deadlock_error_not_a_hang(bugs):
    with pytest.raises(EmulationError) as e:
        bugs.divergent_barrier[1, 32](torch.zeros(32))
    msg = str(e.value)
    assert "kernel 'divergent_barrier'" in msg and "block (0,0,0)" in msg
    assert re.search(r"16 lanes \(0-15\) wait in __syncthreads at .*bugs\.cu:21", msg)
    assert "lanes 16-31 have exited" in msg


def test_lanes_returning_before_a_barrier_are_reported(bugs):
    with pytest.raises(EmulationError, match=r"block \(1,0,0\).*72 lanes \(0-71\) wait in __syncthreads"):
        bugs.early_exit_barrier[2, 128](torch.zeros(200), torch.zeros(200), 200)
    # With n a multiple of the block size no lane exits early, and the kernel is fine.
    x = torch.arange(256, dtype=torch.float32)
    out = torch.zeros(256)
    bugs.early_exit_barrier[2, 128](x, out, 256)
    assert torch.equal(out.view(2, 128), torch.roll(x.view(2, 128), -1, dims=1))


def test_out_of_bounds_read_names_the_buffer(bugs):
    with pytest.raises(EmulationError) as e:
        bugs.copy_unguarded[2, 64](torch.zeros(100), torch.zeros(128))
    msg = str(e.value)
    assert "block (1,0,0), thread (36,0,0)" in msg
    assert "out-of-bounds read near buffer 'src (float32[100])' (+0 bytes past its end" in msg
    assert msg.startswith("kernel 'copy_unguarded'")


def test_out_of_bounds_write_names_the_buffer(bugs):
    with pytest.raises(EmulationError, match=r"write.*buffer 'dst \(float32\[100\]\)'"):
        bugs.copy_unguarded[2, 64](torch.zeros(128), torch.zeros(100))


@pytest.mark.parametrize("n", [49, 50, 64])
def test_off_by_one_write_is_caught_whatever_the_alignment_slack(bugs, n):
    dst = torch.zeros(n)
    with pytest.raises(EmulationError, match=rf"out-of-bounds write near buffer 'dst \(float32\[{n}\]\)' \(\+0 bytes"):
        bugs.write_past_end[1, 128](dst, n)
    assert torch.equal(dst, torch.zeros(n))  # a failed launch copies nothing back


@pytest.mark.parametrize("offset", [-1, -3000])
def test_write_before_the_start_is_caught(bugs, offset):
    with pytest.raises(EmulationError, match=r"before (its start|buffer 'dst)"):
        bugs.write_before_start[1, 1](torch.zeros(8), offset)


def test_dynamic_shared_memory_is_bounds_checked(bugs):
    out = torch.zeros(1)
    bugs.shared_overflow[1, 32, 4 * 100](out, 100)
    assert out.item() == 99.0
    with pytest.raises(EmulationError, match=r"out-of-bounds (write|access) near buffer 'dynamic shared memory'"):
        bugs.shared_overflow[1, 32, 4 * 100](out, 101)


def test_shuffle_from_a_lane_outside_the_mask(bugs):
    ints = torch.zeros(32, dtype=torch.int32)
    with pytest.raises(EmulationError, match=r"__shfl_down_sync at .*bugs\.cu:\d+: lane 8 reads lane 16, which is not"):
        bugs.shuffle_outside_mask[1, 32](ints, ints.clone())


def test_collective_naming_an_exited_lane(bugs):
    ints = torch.zeros(32, dtype=torch.int32)
    with pytest.raises(EmulationError, match=r"mask 0xffffffff names lane 16, which has exited"):
        bugs.shuffle_after_exit[1, 32](ints, ints.clone())


def test_a_spinning_lane_times_out_instead_of_hanging(bugs, monkeypatch):
    monkeypatch.setenv("BNB_EMU_TIMEOUT", "0.5")
    with pytest.raises(EmulationError, match=r"block \(0,0,0\).*did not finish within 0.5 s \(BNB_EMU_TIMEOUT\)"):
        bugs.wait_for_next_block[2, 32](torch.zeros(1, dtype=torch.int32))
    # The flag is set before the spin when block 0 finds it already raised.
    bugs.wait_for_next_block[2, 32](torch.ones(1, dtype=torch.int32))


def test_the_module_still_works_after_a_failed_launch(bugs):
    with pytest.raises(EmulationError):
        bugs.divergent_barrier[1, 32](torch.zeros(32))
    out = torch.zeros(256)
    bugs.early_exit_barrier[2, 128](torch.ones(256), out, 256)
    assert torch.equal(out, torch.ones(256))


def test_arguments_are_checked_against_the_kernel_signature(bugs):
    k = bugs.write_past_end  # (float* dst, int n)
    with pytest.raises(TypeError, match=r"write_past_end takes 2 arguments \(dst, n\), got 1"):
        k[1, 32](torch.zeros(4))
    with pytest.raises(TypeError, match=r"argument 0 \(dst, float32\*\) cannot take a torch.float64 tensor"):
        k[1, 32](torch.zeros(4, dtype=torch.float64), 4)
    with pytest.raises(ValueError, match=r"argument 0 \(dst, float32\*\) must be contiguous"):
        k[1, 32](torch.zeros(4, 2).t(), 4)
    with pytest.raises(TypeError, match=r"argument 1 \(n, int32\) must be an int, got 4.0"):
        k[1, 32](torch.zeros(4), 4.0)
    with pytest.raises(ValueError, match=r"argument 1 \(n, int32\) must be in \[-2147483648, 2147483647\]"):
        k[1, 32](torch.zeros(4), 2**31)
    with pytest.raises(TypeError, match=r"must be a torch.Tensor \(or None\), got list"):
        k[1, 32]([0.0], 1)
    with pytest.raises(ValueError, match=r"block must be 1 to 3 ints >= 1"):
        k[1, 0](torch.zeros(4), 4)
    with pytest.raises(EmulationError, match=r"2048 threads per block"):
        k[1, 2048](torch.zeros(4), 4)
