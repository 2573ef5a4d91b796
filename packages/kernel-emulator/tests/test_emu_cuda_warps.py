"""Warp collectives of the emulated CUDA kernels: shuffles (xor/down/up/idx, segment widths, partial
masks), votes and __syncwarp, checked lane by lane against CUDA's documented semantics."""

from __future__ import annotations

import pytest
import torch

FULL = 0xFFFFFFFF


@pytest.fixture(scope="module")
def warps(cuda_kernels):
    return cuda_kernels("shuffles.cu", ["shuffles", "shuffle_types", "votes", "warp_rotate", "block_votes"])


def _expected(values: list[int], mask: int, delta: int, width: int) -> list[list[int]]:
    """Per flavour (xor, down, up, idx), each lane's result as the CUDA programming guide defines it:
    lanes read within their width-sized segment (xor may also reach earlier segments); a source past
    the segment gives the lane its own value. Lanes outside the mask did not take part (-1)."""
    out = [[], [], [], []]
    for t, v in enumerate(values):
        lane, warp_base = t % 32, t - t % 32
        start = lane - lane % width
        if not mask >> lane & 1:
            for o in out:
                o.append(-1)
            continue
        j_xor, j_down, j_up, j_idx = lane ^ delta, lane + delta, lane - delta, start + delta % width
        out[0].append(values[warp_base + j_xor] if j_xor < start + width else v)
        out[1].append(values[warp_base + j_down] if j_down < start + width else v)
        out[2].append(values[warp_base + j_up] if j_up >= start else v)
        out[3].append(values[warp_base + j_idx])
    return out


@pytest.mark.parametrize(
    ("mask", "delta", "width"),
    [
        (FULL, 1, 32),
        (FULL, 16, 32),
        (FULL, 5, 32),
        (FULL, 3, 8),
        (FULL, 16, 16),  # xor reaches the earlier segment; down/up stay in their own
        (0x0000FFFF, 4, 16),  # partial mask: only the lower half-warp meets
        (0xFFFF0000, 1, 16),
        (0x55555555, 2, 32),  # even lanes only, reading even lanes
    ],
)
def test_shuffles_match_cuda_semantics(warps, mask, delta, width):
    blocks, threads = 2, 64
    n = blocks * threads
    values = torch.randperm(n, generator=torch.Generator().manual_seed(delta)).to(torch.int32) + 1000
    out = torch.zeros(4 * n, dtype=torch.int32)
    warps.shuffles[blocks, threads](values, out, mask, delta, width)
    got = out.view(4, n).tolist()
    want = _expected(values.tolist(), mask, delta, width)
    for name, g, w in zip(["xor", "down", "up", "idx"], got, want, strict=True):
        assert g == w, f"__shfl_{name}_sync mask={mask:#x} delta={delta} width={width}"


def test_shuffles_carry_64_and_16_bit_values(warps):
    d = torch.randn(32, dtype=torch.float64)
    h = torch.randn(32).to(torch.float16)
    d_out, h_out = torch.zeros(32, dtype=torch.float64), torch.zeros(32, dtype=torch.float16)
    warps.shuffle_types[1, 32](d, h, d_out, h_out)
    assert torch.equal(d_out[:31], d[1:]) and d_out[31] == d[31]
    assert torch.equal(h_out, h[torch.arange(32) ^ 3])


@pytest.mark.parametrize(("mask", "threads"), [(FULL, 64), (0x0F0F0F0F, 64), (FULL, 48)])
def test_ballot_any_all(warps, mask, threads):
    g = torch.Generator().manual_seed(threads)
    pred = (torch.rand(threads, generator=g) < 0.5).to(torch.int32)
    pred[32:40] = 1  # a warp slice where every lane votes yes
    ballot = torch.zeros(threads, dtype=torch.int32)
    anys, alls = torch.full((threads,), -1, dtype=torch.int32), torch.full((threads,), -1, dtype=torch.int32)
    warps.votes[1, threads](pred, ballot, anys, alls, mask)
    for t in range(threads):
        lane, base = t % 32, t - t % 32
        if not mask >> lane & 1:
            assert anys[t] == -1
            continue
        # A full mask in a short last warp names only the lanes that exist (48 threads: 16 in warp 1).
        members = [k for k in range(32) if mask >> k & 1 and base + k < threads]
        bits = sum(1 << k for k in members if pred[base + k])
        assert ballot[t].item() & 0xFFFFFFFF == bits
        assert anys[t].item() == int(bits != 0)
        assert alls[t].item() == int(bits == sum(1 << k for k in members))


def test_syncwarp_orders_shared_memory_within_a_warp(warps):
    x = torch.arange(32, dtype=torch.float32)
    out = torch.zeros(32)
    warps.warp_rotate[1, 32](x, out)
    assert torch.equal(out, torch.roll(x, -1))


def test_block_votes_and_warp_reduce(warps):
    pred = torch.zeros(3, 64, dtype=torch.int32)
    pred[0, [1, 5, 40]] = 1  # some
    pred[1] = 1  # all
    out = torch.zeros(12, dtype=torch.int32)
    warps.block_votes[3, 64](pred.flatten(), out)
    assert out.view(3, 4).tolist() == [[3, 1, 0, 2], [64, 1, 1, 32], [0, 0, 0, 0]]
