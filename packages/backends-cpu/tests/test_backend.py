"""The CPU backend as a whole: coverage, ISA control, threads, concurrency, fork, C++ re-checks."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import threading

import pytest
import torch

import bitsandbytes.functional as F
from bitsandbytes import _ops
from bitsandbytes.backends import coverage
from bitsandbytes_cpu import _C


def test_every_op_is_native_on_cpu():
    matrix = coverage()
    missing = [op for op in _ops.OPS if not matrix[op]["cpu"].startswith("native")]
    assert not missing, f"ops still running the reference on cpu: {missing}"


def test_isa_levels_are_reported_and_settable():
    levels = _C.supported_isas()
    assert levels[0] == "scalar" and _C.best_isa() == levels[-1]
    before = _C.isa()
    try:
        for level in levels:
            _C.set_isa(level)
            assert _C.isa() == level
    finally:
        _C.set_isa(before)
    with pytest.raises(ValueError, match="got 'sse9'"):
        _C.set_isa("sse9")


def test_unsupported_isa_in_environment_fails_the_backend_clearly():
    env = {**os.environ, "BNB_CPU_ISA": "sse9", "BNB_STRICT_BACKENDS": "1"}
    proc = subprocess.run([sys.executable, "-c", "import bitsandbytes"], env=env, capture_output=True, text=True)
    assert proc.returncode != 0 and "sse9" in proc.stderr


def _all_bits(dtype: torch.dtype) -> torch.Tensor:
    return torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_conversions_match_torch_bit_for_bit(dtype):
    # Every 16-bit pattern up to float32 and back; and float32 values around every rounding boundary.
    halves = _all_bits(dtype)
    widened = torch.empty(halves.shape, dtype=torch.float32)
    _C._convert(halves, widened)
    assert torch.equal(widened.view(torch.int32), halves.float().view(torch.int32)) or torch.equal(
        widened.isnan(), halves.float().isnan()
    )
    finite = ~halves.float().isnan()
    assert torch.equal(widened[finite].view(torch.int32), halves.float()[finite].view(torch.int32))
    wide = halves.float()[finite]
    probes = torch.cat([wide, wide.nextafter(wide + 1), wide.nextafter(wide - 1), torch.randn(100_000) * 1e4])
    probes = torch.cat([probes, (wide[:-1] + wide[1:]) / 2])  # exact ties
    narrowed = torch.empty(probes.shape, dtype=dtype)
    _C._convert(probes, narrowed)
    assert torch.equal(narrowed.view(torch.int16), probes.to(dtype).view(torch.int16))


def test_results_do_not_depend_on_the_thread_count():
    x = torch.randn(3 * 1024 * 1024 + 77)
    saved = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = F.quantize_4bit(x, blocksize=64), F.quantize_blockwise(x)
        torch.set_num_threads(max(2, saved))
        many = F.quantize_4bit(x, blocksize=64), F.quantize_blockwise(x)
    finally:
        torch.set_num_threads(saved)
    for (q1, s1), (q2, s2) in zip(one, many, strict=True):
        assert torch.equal(q1, q2) and torch.equal(s1.absmax, s2.absmax)


def test_concurrent_calls_from_python_threads_agree_with_a_serial_call():
    inputs = [torch.randn(1 << 20) * (i + 1) for i in range(6)]
    expected = [F.quantize_blockwise(x)[0] for x in inputs]
    results: dict[int, torch.Tensor] = {}

    def work(i: int) -> None:
        for _ in range(3):
            results[i] = F.quantize_blockwise(inputs[i])[0]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, want in enumerate(expected):
        assert torch.equal(results[i], want)


def _quantize_in_child(queue, x, code, expected) -> None:
    # torch's own OpenMP pool cannot be used in a forked child (a known libgomp limitation, independent
    # of bitsandbytes), so the child keeps torch single-threaded and drives our pool directly.
    torch.set_num_threads(1)
    out = torch.empty(x.shape, dtype=torch.uint8)
    absmax = torch.empty(x.numel() // 4096, dtype=torch.float32)
    _C.quantize_blockwise(x, code, 4096, out, absmax, 2)
    queue.put(bool(torch.equal(out, expected)))


def test_kernels_work_in_a_forked_child_after_the_pool_started():
    x = torch.randn(1 << 20)
    code = F.create_dynamic_map()
    expected = F.quantize_blockwise(x, code=code, blocksize=4096)[0]  # starts our worker threads here
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_quantize_in_child, args=(queue, x, code, expected))
    child.start()
    child.join(timeout=60)
    if child.exitcode is None:
        child.kill()
    assert child.exitcode == 0 and queue.get(timeout=5)


def test_cpp_rechecks_sizes_behind_the_python_glue():
    x = torch.randn(1000)
    code = F.create_dynamic_map()
    with pytest.raises(ValueError, match="out must have 1000 elements"):
        _C.quantize_blockwise(x, code, 64, torch.empty(999, dtype=torch.uint8), torch.empty(16), 1)
    with pytest.raises(ValueError, match="absmax must have 16 elements"):
        _C.quantize_blockwise(x, code, 64, torch.empty(1000, dtype=torch.uint8), torch.empty(15), 1)
    with pytest.raises(ValueError, match="blocksize"):
        _C.quantize_blockwise(x, code, 48, torch.empty(1000, dtype=torch.uint8), torch.empty(21), 1)
    with pytest.raises(ValueError, match="code must have 256"):
        _C.quantize_blockwise(x, code[:255], 64, torch.empty(1000, dtype=torch.uint8), torch.empty(16), 1)
    with pytest.raises(ValueError, match="A must be contiguous"):  # never a silent copy
        _C.quantize_blockwise(
            torch.randn(64, 64).t(), code, 64, torch.empty(4096, dtype=torch.uint8), torch.empty(64), 1
        )
