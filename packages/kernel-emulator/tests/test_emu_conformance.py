"""End to end: an op's conformance cases run against an emulated CUDA kernel, with the one command the
docs give (emulated_cuda_backend.py registers kernels/int8_dequant.cu as the op's cpu kernel)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import bitsandbytes_emu as emu

HERE = Path(__file__).parent


def test_conformance_cases_run_on_the_emulated_kernel():
    emu.skip_unless_available()
    env = dict(os.environ, BNB_BACKENDS="none")
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), *filter(None, [env.get("PYTHONPATH")])])
    cmd = [sys.executable, "-m", "bitsandbytes.testing", "--device", "cpu", "-p", "emulated_cuda_backend"]
    proc = subprocess.run([*cmd, "-k", "vectorwise_dequant", "-q"], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # The cases ran, and through the emulated kernel (not the reference, which would pass anything).
    # At least the op's 5 family cases (the suite also holds its bad-input rows, which grow with it).
    passed = re.search(r"(\d+) passed", proc.stdout)
    assert passed and int(passed.group(1)) >= 5 and "failed" not in proc.stdout, proc.stdout
    calls = int(proc.stdout.split("emulated CUDA kernel calls: ")[1].split()[0])
    assert calls >= 3
