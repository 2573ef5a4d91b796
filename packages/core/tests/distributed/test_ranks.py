"""The multi-rank harness itself: results come back in rank order, and a failing or hanging rank fails
the test in bounded time instead of hanging the run."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist
from ranks import RankFailed, run_ranks


def _all_reduce_rank(rank, world_size):
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    return rank, t


def _rank1_raises(rank, world_size):
    if rank == 1:
        raise ValueError("deliberate failure on rank 1")
    return rank


def _rank0_waits_forever(rank, world_size):
    if rank == 0:
        time.sleep(3600)
    return rank


def test_results_in_rank_order():
    results = run_ranks(_all_reduce_rank, 2)
    assert [(rank, t.tolist()) for rank, t in results] == [(0, [3.0]), (1, [3.0])]


def test_a_raising_rank_is_reported():
    with pytest.raises(RankFailed, match=r"rank 1 raised:(.|\n)*deliberate failure on rank 1"):
        run_ranks(_rank1_raises, 2)


def test_a_hanging_rank_fails_in_bounded_time():
    start = time.monotonic()
    with pytest.raises(RankFailed, match="rank 0: did not report within 5 s"):
        run_ranks(_rank0_waits_forever, 2, timeout_s=5)
    assert time.monotonic() - start < 30
