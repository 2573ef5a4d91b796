"""End to end: the 4-bit conformance cases run against emulated Metal kernels, with the one command the
docs give (emulated_mps_backend.py registers kernels/metal_fourbit.metal as the ops' cpu kernels)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bitsandbytes_emu.build import unavailable_reason

HERE = Path(__file__).parent


@pytest.mark.skipif(unavailable_reason() is not None, reason=unavailable_reason() or "")
def test_fourbit_conformance_cases_run_on_emulated_metal_kernels():
    env = dict(os.environ, BNB_BACKENDS="none")
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), *filter(None, [env.get("PYTHONPATH")])])
    cmd = [sys.executable, "-m", "bitsandbytes.testing", "--device", "cpu", "-p", "emulated_mps_backend", "-q"]
    # The docs' command runs every 4-bit case; here the blocksize sweep keeps its two ends (64, 4096).
    select = "fourbit and not gemv and not gemm and (not test_quantize or b64- or b4096-)"
    proc = subprocess.run([*cmd, "-k", select], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    passed = int(re.search(r"(\d+) passed", proc.stdout).group(1))
    assert passed >= 40 and "failed" not in proc.stdout
    # The cases went through the emulated kernels (the reference alone would pass them too).
    calls = int(proc.stdout.split("emulated Metal kernel calls: ")[1].split()[0])
    assert calls >= 2 * 24
