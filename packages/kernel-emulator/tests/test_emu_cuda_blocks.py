"""Block-level behaviour of the emulated CUDA kernels: reductions through shared memory and barriers,
tail blocks, 2-D launches, atomics from many lanes and blocks, and determinism."""

from __future__ import annotations

import ctypes

import pytest
import torch

import bitsandbytes_emu as emu

REDUCE = {"sum128": "block_sum<128>", "sum256": "block_sum<256>", "warp_block_sum": "warp_block_sum"}


@pytest.fixture(scope="module")
def reduce(cuda_kernels):
    return cuda_kernels("reduce.cu", REDUCE)


@pytest.mark.parametrize("n", [1, 127, 128, 1000, 1024])
def test_block_reduction_through_shared_memory(reduce, n):
    x = torch.randn(n, generator=torch.Generator().manual_seed(n))
    blocks = (n + 127) // 128
    out = torch.full((blocks,), float("nan"))
    reduce.sum128[blocks, 128](x, out, n)
    expected = torch.nn.functional.pad(x, (0, blocks * 128 - n)).view(blocks, 128).double().sum(1)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)


def test_warp_shuffle_reduction_with_dynamic_shared_memory(reduce):
    x = torch.randn(3000, generator=torch.Generator().manual_seed(1))
    out = torch.zeros(1)
    # 256 threads = 8 warps: one float of dynamic shared memory per warp.
    reduce.warp_block_sum[12, 256, 8 * 4](x, out, x.numel())
    torch.testing.assert_close(out.double(), x.double().sum().view(1), rtol=1e-5, atol=1e-4)


def test_input_buffers_are_not_written_back_and_outputs_are(reduce):
    x = torch.ones(256)
    before = x.clone()
    out = torch.zeros(2)
    reduce.sum128[2, 128](x, out, 256)
    assert torch.equal(x, before) and out.tolist() == [128.0, 128.0]


@pytest.fixture(scope="module")
def elementwise(cuda_kernels):
    return cuda_kernels("elementwise.cu", ["axpy", "add_rowcol", "scale4"])


@pytest.mark.parametrize("n", [0, 1, 255, 256, 257, 1000])
def test_tail_block_covers_exactly_n_elements(elementwise, n):
    g = torch.Generator().manual_seed(n)
    x, y = torch.randn(n, generator=g), torch.randn(n, generator=g)
    expected = 2.5 * x + y
    elementwise.axpy[(n + 255) // 256, 256](2.5, x, y, n)
    # fmaf rounds once; the float reference rounds twice, hence one ulp of slack.
    torch.testing.assert_close(y, expected, rtol=2e-7, atol=1e-6)


def test_two_dimensional_grid_and_blocks_with_tails(elementwise):
    rows, cols = 37, 53
    g = torch.Generator().manual_seed(0)
    m, r, c = torch.randn(rows, cols, generator=g), torch.randn(rows, generator=g), torch.randn(cols, generator=g)
    out = torch.full((rows, cols), float("nan"))
    elementwise.add_rowcol[((cols + 15) // 16, (rows + 7) // 8), (16, 8)](m, r, c, out, rows, cols)
    torch.testing.assert_close(out, m + r[:, None] + c[None, :], rtol=0, atol=1e-6)


@pytest.mark.parametrize("n", [16, 17, 1030])
def test_vector_loads_through_float4_with_a_scalar_tail(elementwise, n):
    x = torch.randn(n, generator=torch.Generator().manual_seed(n))
    y = torch.zeros(n)
    threads = n // 4 + n % 4
    elementwise.scale4[(threads + 63) // 64, 64](x, y, 3.0, n)
    assert torch.equal(y, x * 3.0)


@pytest.fixture(scope="module")
def atomics(cuda_kernels):
    return cuda_kernels("atomics.cu", ["histogram", "reduce_atomics", "tickets"])


def test_atomic_histogram_from_many_lanes_and_blocks(atomics):
    values = torch.randint(-2, 20, (5000,), generator=torch.Generator().manual_seed(0), dtype=torch.int32)
    bins = torch.zeros(16, dtype=torch.int32)
    atomics.histogram[7, 96](values, values.numel(), bins, 16)
    kept = values[(values >= 0) & (values < 16)]
    assert torch.equal(bins, torch.bincount(kept, minlength=16).to(torch.int32))


def test_atomic_add_max_and_cas_loop(atomics):
    x = torch.randn(777, generator=torch.Generator().manual_seed(3))
    total, imax = torch.zeros(1), torch.full((1,), -(2**31), dtype=torch.int32)
    fmax, count = torch.full((1,), float("-inf")), torch.zeros(1, dtype=torch.int64)
    atomics.reduce_atomics[(777 + 63) // 64, 64](x, 777, total, imax, fmax, count)
    torch.testing.assert_close(total.double(), x.double().sum().view(1), rtol=1e-5, atol=1e-4)
    assert imax.item() == int((x * 1000).trunc().max().item())
    assert fmax.item() == x.max().item() and count.item() == 777


def test_atomics_return_the_old_value(atomics):
    n = 200
    nxt, got = torch.zeros(1, dtype=torch.int32), torch.full((n,), -1, dtype=torch.int32)
    lowest, bits = torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    atomics.tickets[4, 50](nxt, got, lowest, bits)
    # Each lane got a distinct ticket: the value before its own increment.
    assert sorted(got.tolist()) == list(range(n)) and nxt.item() == n
    assert lowest.item() == -(n - 1) and bits.item() == -1  # all 32 bits set


def test_same_result_every_run(reduce, atomics, cuda_kernels):
    x = torch.randn(4096, generator=torch.Generator().manual_seed(5)) * 1e4
    results = []
    for _ in range(3):
        total = torch.zeros(1)
        atomics.reduce_atomics[64, 64](
            x, x.numel(), total, torch.zeros(1, dtype=torch.int32), torch.zeros(1), torch.zeros(1, dtype=torch.int64)
        )
        warp_total = torch.zeros(1)
        reduce.warp_block_sum[16, 256, 32](x, warp_total, x.numel())
        results.append((total.view(torch.int32).item(), warp_total.view(torch.int32).item()))
    assert results[0] == results[1] == results[2]


def test_host_code_launches_with_bnb_emu_launch(cuda_kernels, tmp_path):
    code = """
__global__ void fill(float* out, float v) { out[blockIdx.x * blockDim.x + threadIdx.x] = v; }
extern "C" __attribute__((visibility("default"))) int host_fill(float* out) {
  return BNB_EMU_LAUNCH(fill, dim3(2), dim3(32), 0, out, 2.5f);  // fill<<<2, 32>>>(out, 2.5f)
}
"""
    mod = emu.load_cuda(tmp_path / "host.cu", ["fill"], code=code)
    out = torch.zeros(64)
    assert ctypes.CDLL(str(mod.path)).host_fill(ctypes.c_void_p(out.data_ptr())) == 0
    assert torch.equal(out, torch.full((64,), 2.5))
