"""Run a function on N real ranks (separate processes joined by a gloo group) with bounded time.

Each rank is a fresh process that has only imported torch, torch.distributed and bitsandbytes: a fork of
a forkserver (a clean interpreter started once, never the pytest process, that imports those and runs
nothing), else a spawned interpreter where there is no forkserver. Module state never leaks between ranks,
between runs or from the pytest process; what the forkserver saves is each rank's ~5 CPU-seconds of
importing torch (most of this folder's time on a 2-core CI machine). Ranks meet through a FileStore in
a temporary folder (no ports to collide between parallel test runs). Every collective has a timeout,
and the parent kills all ranks when the whole run overstays its deadline, so a rank that hangs
fails the test instead of the CI job.
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

# What the forkserver imports once for every rank (importing runs no kernels and starts no threads).
PRELOAD = ["torch", "torch.distributed", "torch.distributed.fsdp", "torch.distributed.checkpoint", "bitsandbytes"]

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


def _context():
    if "forkserver" not in mp.get_all_start_methods():  # Windows
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)  # read when the server starts, i.e. by the first run only
    return ctx


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
    ctx = _context()
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
