"""The NEON kernels, run here: tests/native/neon_driver.cpp cross-compiled for aarch64 and run under
qemu-aarch64, checks every arm64 ISA level against the scalar level (bytes where the format defines
them, a stated tolerance for gemv). Needs an aarch64 cross compiler and qemu user emulation."""

from __future__ import annotations

import importlib.util
import signal
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("neon_build_driver", HERE / "native" / "build_driver.py")
build_driver = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(build_driver)

pytestmark = [
    pytest.mark.skipif(build_driver.compiler() is None, reason="needs aarch64-linux-gnu-g++ (g++-aarch64-linux-gnu)"),
    pytest.mark.skipif(build_driver.qemu() is None, reason="needs qemu-aarch64 user emulation (qemu-user-static)"),
]


@pytest.fixture(scope="module")
def driver() -> Path:
    # Under the backend's (ignored) build folder: rebuilt incrementally, so a rerun costs only the run.
    return build_driver.build(HERE.parent / "build" / "neon-driver")


def test_every_neon_level_matches_scalar(driver):
    r = build_driver.run(driver, "max", [])
    assert r.returncode == 0, r.stdout + r.stderr
    for level in ("neon", "neon_dotprod", "neon_bf16"):
        assert f"{level}: ok" in r.stdout
    assert " 0 failures" in r.stdout


def test_neon_level_runs_on_armv8_0(driver):
    # cortex-a72 is Armv8.0-A: the baseline level must not use DotProd, BF16 or FHM instructions.
    r = build_driver.run(driver, "cortex-a72", ["neon"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "neon: ok" in r.stdout


def test_arm64_results_are_the_hosts_bytes(driver):
    # The same inputs through this machine's (x86) scalar kernels: their outputs' digest (NaNs made
    # canonical: which NaN an operation creates is the architecture's) equals the arm64 scalar level's,
    # and every NEON level matched that level byte for byte in the run above.
    host = build_driver.build_host(HERE.parent / "build" / "neon-driver" / "host")
    h = subprocess.run([str(host)], capture_output=True, text=True, check=False)
    assert h.returncode == 0, h.stdout + h.stderr
    r = build_driver.run(driver, "max", ["neon"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert build_driver.digest(r.stdout) == build_driver.digest(h.stdout)


@pytest.mark.parametrize("level", ["neon_dotprod", "neon_bf16"])
def test_higher_levels_use_their_extensions(driver, level):
    # Their kernels do execute DotProd / BF16 / FHM instructions: an Armv8.0 CPU faults on them.
    r = build_driver.run(driver, "cortex-a72", [level])
    assert r.returncode in (-signal.SIGILL, 128 + signal.SIGILL), (r.returncode, r.stdout + r.stderr)
