"""The conformance suite as a backend author runs it: one command, one device.

Runs ``python -m bitsandbytes.testing --device cpu`` (the reference kernels, or the CPU backend when
one is installed) in a subprocess, checks that a device this machine lacks gives skips that name it
rather than failures, and that a device string torch does not know is a usage error.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch

from bitsandbytes.testing.plugin import parse_device, unavailable_reason


def run(*args: str, cwd) -> subprocess.CompletedProcess:
    # From an empty directory, so the run depends on nothing but the installed package.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False
    )


def counts(output: str) -> dict[str, int]:
    summary = output.strip().splitlines()[-1]
    return {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", summary)}


def missing_device() -> str:
    for name in ("cuda", "xpu", "mps"):
        reason = unavailable_reason(torch.device(name))
        if reason is not None:
            return name
    pytest.skip("every accelerator torch knows is present here; no missing device to test with")


def test_suite_passes_on_cpu(tmp_path):
    result = run("-m", "bitsandbytes.testing", "--device", "cpu", "-q", cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-5000:]
    n = counts(result.stdout)
    assert n.get("failed", 0) == 0 and n.get("skipped", 0) == 0, result.stdout[-3000:]
    # Guard against a suite that silently collects nothing.
    assert n.get("passed", 0) >= 400, result.stdout[-3000:]


def test_missing_device_is_a_skip_that_names_it(tmp_path):
    device = missing_device()
    result = run(
        "-m", "pytest", "-p", "no:cacheprovider", "--pyargs", "bitsandbytes.testing", "--bnb-device", device,
        "-q", "-rs", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, (result.stdout + result.stderr)[-5000:]
    n = counts(result.stdout)
    assert n.get("failed", 0) == 0 and n.get("skipped", 0) >= 400, result.stdout[-3000:]
    assert f"device '{device}' is not available" in result.stdout, result.stdout[-3000:]


@pytest.mark.parametrize("device", ["nosuchdevice", "meta"])
def test_unusable_device_string_is_a_usage_error(tmp_path, device):
    result = run("-m", "bitsandbytes.testing", "--device", device, "-q", cwd=tmp_path)
    assert result.returncode == 4, (result.stdout + result.stderr)[-3000:]
    assert f"--bnb-device {device!r}" in result.stderr


def test_unavailable_reason_names_the_device():
    assert unavailable_reason(torch.device("cpu")) is None
    if not torch.cuda.is_available():
        reason = unavailable_reason(torch.device("cuda:1"))
        assert reason == "device 'cuda:1' is not available: torch.cuda.is_available() is False"
    with pytest.raises(ValueError, match="--bnb-device 'gpu0' is not a torch device"):
        parse_device("gpu0")


# A deliberately wrong "backend": CPU kernels that differ from the reference in small, realistic ways.
# The suite must catch each one, including on the reference device itself (so it cannot pass vacuously).
BROKEN_BACKEND = """
import torch
import bitsandbytes
from bitsandbytes._reference import REFERENCE

def register(op, fn):
    torch.library.register_kernel(f"bitsandbytes::{op}", "cpu")(fn)

def quantize_blockwise(A, code, blocksize):
    q, absmax = REFERENCE["quantize_blockwise"](A, code, blocksize)
    q = q.clone()
    q.view(-1)[-1:] ^= 1  # one code off by one
    return q, absmax

def int8_linear_matmul(A, B):
    return (A.float() @ B.float().T).to(torch.int32)  # fp32 accumulation: inexact past 2**24

def dequantize_4bit(A, absmax, blocksize, quant_type, shape, dtype):
    out = REFERENCE["dequantize_4bit"](A, absmax, blocksize, quant_type, shape, torch.float32)
    return (out.to(dtype).float() * 1.0001).to(dtype)  # rounded twice

def gemv_4bit(A, B, shapeB, absmax, code, blocksize):
    return REFERENCE["gemv_4bit"](A, B, shapeB, absmax, code, blocksize) * 1.01

def optimizer_update_32bit(name, g, p, *rest):
    rest = list(rest)
    rest[12] *= 1.001  # lr
    REFERENCE["optimizer_update_32bit"](name, g, p, *rest)

for _op in ("quantize_blockwise", "int8_linear_matmul", "dequantize_4bit", "gemv_4bit", "optimizer_update_32bit"):
    register(_op, globals()[_op])
"""

# test id fragment that must fail -> the broken kernel it detects
EXPECTED_FAILURES = (
    "test_blockwise.py::test_quantize[",
    "test_int8.py::test_linear_matmul[K2048-max]",
    "test_fourbit.py::test_dequantize[",
    "test_matmul_4bit.py::test_gemv_4bit[",
    "test_optimizers.py::test_steps_match_reference[adam-32-float32]",
)


def test_suite_catches_a_broken_backend(tmp_path):
    (tmp_path / "broken_backend.py").write_text(BROKEN_BACKEND)
    env_path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    selection = "test_quantize or linear_matmul or test_dequantize or gemv or test_steps_match_reference"
    result = subprocess.run(
        [sys.executable, "-m", "bitsandbytes.testing", "--device", "cpu", "-p", "broken_backend", "-q", "-k",
         selection, "-rf", "--tb=no"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": env_path}, capture_output=True, text=True, timeout=600,
        check=False,
    )  # fmt: skip
    assert result.returncode == 1, (result.stdout + result.stderr)[-3000:]
    failed = [line for line in result.stdout.splitlines() if line.startswith("FAILED")]
    for fragment in EXPECTED_FAILURES:
        assert any(fragment in line for line in failed), f"the suite did not catch the broken kernel: {fragment}"


HARNESS_PLUGIN = """
class HarnessError(RuntimeError):
    pass

def pytest_bnb_harness_errors(config):
    return (HarnessError,)
"""

HARNESS_TEST = """
import harness_plugin

def test_declared(bnb_harness_errors):
    assert bnb_harness_errors == (harness_plugin.HarnessError,)
"""


def test_a_plugin_declares_its_harness_errors(tmp_path):
    """The bad-input matrix learns a harness's exceptions from the pytest_bnb_harness_errors hook."""
    (tmp_path / "harness_plugin.py").write_text(HARNESS_PLUGIN)
    (tmp_path / "test_harness.py").write_text(HARNESS_TEST)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}  # the plugin loads by entry point
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "harness_plugin", "-p", "no:cacheprovider", "test_harness.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
