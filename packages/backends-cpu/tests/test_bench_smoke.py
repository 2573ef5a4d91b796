"""`nox -s bench` runs on this CPU: its harness at toy sizes (`run.py --smoke`), every row, with the ISA
level this process runs. The numbers are not looked at (a benchmark, not a test); what fails here is a
row that cannot run on this platform, as a bench meant for the day arm64 runs natively would otherwise
find out then. Runs in `nox -s tests` and, under qemu, in `nox -s tests-arm64`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bitsandbytes_cpu import _C

BENCH = Path(__file__).resolve().parents[1] / "bench" / "run.py"
BATCHES = (4, 16)  # the batch rows at smoke sizes (common.use_smoke_sizes)


def test_every_bench_row_runs_here(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, str(BENCH), "--smoke", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    results = json.loads((tmp_path / "cpu_bench.json").read_text())
    assert results["meta"]["smoke"] and results["meta"]["isa"] == _C.isa()
    assert f"ISA {_C.isa()}" in (tmp_path / "cpu_bench.md").read_text()
    # The decode row builds its model with transformers; every other row needs only torch and ours.
    optional = set() if importlib.util.find_spec("transformers") else {"decode/llama"}
    rows = results["cases"]
    assert len(rows) >= 20
    for r in rows:
        if r["id"] in optional:
            continue
        assert r["native"], f"{r['id']}: its op has no native cpu kernel here"
        assert "median_s" in r["times"].get("ours", {}), f"{r['id']}: {r['times'].get('ours')} {r['notes']}"
        if "reference" in r["times"]:
            assert "median_s" in r["times"]["reference"], f"{r['id']}: the reference failed: {r['notes']}"
    # The limits section's own measurements (report.LIMIT_IMPLS) ran in the rows that explain a target.
    limits = {"ours_hot": ("linear4bit/", "gemv_4bit/stream/"), "ours_1thread": ("adam8bit/", "optim8bit/",
              "optimclass/", "quantize_blockwise/"), "decode": tuple(f"gemm_4bit/{m}/" for m in BATCHES)}  # fmt: skip
    for impl, prefixes in limits.items():
        timed = [r for r in rows if r["id"].startswith(prefixes)]
        assert timed, f"no row for {impl}"
        for r in timed:
            assert "median_s" in r["times"].get(impl, {}), f"{r['id']}: {impl} {r['times'].get(impl)} {r['notes']}"


def test_smoke_and_quick_are_two_modes(tmp_path):
    done = subprocess.run(
        [sys.executable, str(BENCH), "--smoke", "--quick", "--out", str(tmp_path)], capture_output=True, text=True
    )
    assert done.returncode == 2 and "pick one" in done.stderr


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="the driver's flags are x86-64's")
@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ to compile bench/optimizer_driver.cpp")
def test_optimizer_driver_compiles_against_the_kernel_source():
    # The kernel-level A/B driver includes csrc/kernels/optimizers.cpp as it is: a change to the kernel's
    # interface must show here, not the next time someone measures with it.
    backend = BENCH.parent.parent
    done = subprocess.run(
        [
            "g++",
            "-std=c++17",
            "-fsyntax-only",
            "-mavx2",
            "-mfma",
            "-mf16c",
            "-DBNB_ISA_NS=avx2",
            "-DBNB_ISA_AVX2=1",
            "-DLEVEL=avx2",
            f"-I{backend / 'csrc'}",
            f"-I{backend.parent / 'core' / 'src' / 'bitsandbytes' / 'include'}",
            str(BENCH.parent / "optimizer_driver.cpp"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
