"""The template's own tests, run against the installed distribution (pip install .[test]; pytest).

Everything that depends on discovery runs in a fresh interpreter with ``BNB_BACKENDS=template``: the
plugin is then the only backend, whatever else is installed, and ``BNB_STRICT_BACKENDS=1`` turns a
rejected plugin into an error instead of a warning.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch
from bnb_backend_template.kernels import KERNELS

from bitsandbytes._ops import OPS
from bitsandbytes._reference import REFERENCE

NAME = "template"
NATIVE = sorted(KERNELS)
# The conformance tests that exercise those ops (pytest -k); the suite runs the rest on the reference.
# Every 4-bit test but the matmuls dequantizes; of the int8 ones, these two.
CONFORMANCE_K = (
    "dequantize_4bit or vectorwise_dequant or (test_fourbit and not gemv and not gemm)"
    " or (test_int8 and test_nonfinite_input)"
)


def run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "BNB_BACKENDS": NAME, "BNB_STRICT_BACKENDS": "1"}
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=300)


def test_python_m_bitsandbytes_lists_the_backend():
    proc = run("-m", "bitsandbytes")
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert re.search(rf"^  {NAME}\s+bnb-backend-template 0\.1\.0\s+Backend\s+cpu\s+loaded$", out, re.M), out
    for op in NATIVE:
        assert re.search(rf"^  {op}\s+native \({NAME}\)\s", out, re.M), out
    # diagnostics() is printed under the backend's name
    assert re.search(rf"^    kernels\s+{', '.join(KERNELS)}$", out, re.M), out


def test_conformance_of_the_ops_it_implements():
    proc = run("-m", "bitsandbytes.testing", "--device", "cpu", "-q", "-k", CONFORMANCE_K)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "RuntimeWarning" not in proc.stdout, proc.stdout  # e.g. NumPy warning about specified NaNs
    passed = re.search(r"^(\d+) passed, \d+ deselected", proc.stdout, re.M)
    # A selection that matched nothing would also exit 5, not 0; this pins that it tested something real.
    assert passed and int(passed[1]) >= 130, proc.stdout


# A round trip through the public API: quantize_4bit on the reference kernel, dequantize_4bit on ours.
FALLBACK = """
import json, torch
import bitsandbytes.functional as F
from bitsandbytes._reference import REFERENCE
from bitsandbytes.backends import coverage, records

(record,) = [r for r in records() if r.name == "template"]
A = torch.randn(8, 64)
packed, state = F.quantize_4bit(A, blocksize=64, quant_type="nf4")
ref_packed, ref_absmax = REFERENCE["quantize_4bit"](A, 64, "nf4", torch.uint8)
ref = REFERENCE["dequantize_4bit"](ref_packed, ref_absmax, 64, "nf4", [8, 64], torch.float32)
print(json.dumps({
    "status": record.status,
    "kernels": sorted(op for op, _ in record.kernels),
    "cpu": {op: row["cpu"] for op, row in coverage(("cpu",)).items()},
    "round trip equals the reference": torch.equal(F.dequantize_4bit(packed, state), ref),
}))
"""


def test_every_other_op_falls_back_to_the_reference():
    proc = run("-c", FALLBACK)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    seen = json.loads(proc.stdout.splitlines()[-1])
    assert seen["status"] == "loaded"
    assert seen["kernels"] == NATIVE  # what the dispatcher holds from this plugin, nothing more
    # Read back from the dispatcher: a kernel of ours for NATIVE, the core's reference for every other op.
    assert seen["cpu"] == {op: "native" if op in NATIVE else "reference" for op in OPS}
    assert seen["round trip equals the reference"]


@pytest.mark.parametrize("op", list(KERNELS))
def test_bad_input_raises_what_the_reference_raises(op):
    # Calls the kernel itself, not the dispatcher: its own argument check must be the op's contract.
    kernel = KERNELS[op]
    if op == "int8_vectorwise_dequant":
        args = (torch.zeros(3, 4, dtype=torch.int8), torch.ones(2))  # one stat short
    else:
        args = (torch.zeros(8, 1, dtype=torch.uint8), torch.ones(1), 64, "nf5", [16], torch.float16)
        if op.endswith(".out"):
            args = (*args, torch.empty(16, dtype=torch.float16))
    with pytest.raises((TypeError, ValueError)) as ours:
        kernel(*args)
    with pytest.raises(type(ours.value)) as ref:
        REFERENCE[op](*args)
    assert str(ours.value) == str(ref.value)


def test_importing_registers_nothing():
    # Only load() registers: with the plugin not selected, importing it leaves the dispatcher as it was.
    code = (
        "import bnb_backend_template\n"
        "from bitsandbytes.backends.dispatch import has_kernel\n"
        "print([op for op in bnb_backend_template.KERNELS if has_kernel(op, 'CPU')])"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, "BNB_BACKENDS": "none"}, capture_output=True, text=True
    )
    assert proc.stdout.strip() == "[]", proc.stdout + proc.stderr
