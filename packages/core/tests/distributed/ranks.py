"""Run a function on N real ranks (separate processes joined by a gloo group) with bounded time.

Each rank is a fresh spawned interpreter, so module state never leaks between ranks or into the pytest
process. Ranks meet through a FileStore in a temporary folder (no ports to collide between parallel test
runs). Every collective has a timeout, and the parent kills all ranks when the whole run overstays its
deadline, so a rank that hangs fails the test instead of the CI job.
"""

from __future__ import annotations

import datetime
import os
import pickle
import queue
import tempfile
import traceback
from collections.abc import Callable
from typing import Any

import torch.multiprocessing as mp

# A collective that waits longer than this on a CPU test of tiny models is a hang, not slowness.
COLLECTIVE_TIMEOUT_S = 60.0


class RankFailed(AssertionError):
    """A rank raised, died or did not report in time; the message carries every rank's story."""


def _rank_main(rank, world_size, store_path, fn, args, results, collective_timeout_s):
    import torch
    import torch.distributed as dist

    # Two cores shared by every rank: intra-op threads per rank would only oversubscribe them.
    torch.set_num_threads(1)
    try:
        store = dist.FileStore(store_path, world_size)
        dist.init_process_group(
            "gloo",
            store=store,
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=collective_timeout_s),
        )
        # gloo connects the ranks lazily; without this a rank that finishes early can leave before a
        # slower one has connected, which then fails to join a group that was fine.
        dist.barrier()
        try:
            out = fn(rank, world_size, *args)
        finally:
            dist.destroy_process_group()
        # Pickled here by value: tensors sent through the queue itself would live in shared memory that
        # vanishes when this process exits, before the parent reads them.
        results.put((rank, "ok", pickle.dumps(out)))
    except BaseException:
        results.put((rank, "error", traceback.format_exc()))


def run_ranks(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout_s: float = 240.0,
    collective_timeout_s: float = COLLECTIVE_TIMEOUT_S,
) -> list[Any]:
    """Call ``fn(rank, world_size, *args)`` on ``world_size`` ranks; return the results in rank order.

    ``fn`` and its results must pickle (a module-level function; tensors are fine). Raises RankFailed when
    any rank raises, exits without a result, or the run passes ``timeout_s``.
    """
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        store_path = os.path.join(tmp, "store")
        procs = [
            ctx.Process(
                target=_rank_main,
                args=(rank, world_size, store_path, fn, args, results, collective_timeout_s),
                daemon=True,
            )
            for rank in range(world_size)
        ]
        for p in procs:
            p.start()
        outcomes: dict[int, tuple[str, Any]] = {}
        deadline = datetime.datetime.now() + datetime.timedelta(seconds=timeout_s)
        try:
            while len(outcomes) < world_size:
                left = (deadline - datetime.datetime.now()).total_seconds()
                if left <= 0:
                    break
                try:
                    rank, status, payload = results.get(timeout=min(left, 1.0))
                except queue.Empty:
                    # A rank killed by a signal never reports; stop waiting once every process is gone.
                    if all(not p.is_alive() for p in procs) and results.empty():
                        break
                    continue
                outcomes[rank] = (status, payload)
        finally:
            killed = set()
            for rank, p in enumerate(procs):
                p.join(timeout=5)
                if p.is_alive():
                    p.kill()
                    p.join()
                    killed.add(rank)
    problems = []
    for rank, p in enumerate(procs):
        if rank not in outcomes:
            if rank in killed:
                problems.append(f"rank {rank}: did not report within {timeout_s:.0f} s")
            else:
                problems.append(f"rank {rank}: exited with code {p.exitcode} without reporting")
        elif outcomes[rank][0] == "error":
            problems.append(f"rank {rank} raised:\n{outcomes[rank][1]}")
    if problems:
        raise RankFailed("\n".join(problems))
    return [pickle.loads(outcomes[rank][1]) for rank in range(world_size)]
