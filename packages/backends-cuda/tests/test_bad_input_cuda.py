"""The bad-input matrix (packages/core/tests/reliability/bad_input_cases.py) on this package's kernels in the
emulator: every case that reaches an op of ``bitsandbytes_cuda.ops``, through torch.ops with those functions
registered as the ``cpu`` kernels and by calling them directly. A case must end as it does on the reference
(a clear error naming the argument, or the documented result); an emulated out-of-bounds access, deadlock
or wrong launch fails it. The rows join the matrix's printed table."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from bitsandbytes.testing import emu
from bitsandbytes.testing.emu.errors import EmulationError
from bitsandbytes_cuda import launch, ops

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "packages" / "core" / "tests" / "reliability"))
import bad_input_cases as cases
import matrix_table

BACKEND = "cuda (emulated)"
IMPLS = ops.all_ops()


@pytest.fixture(scope="module")
def reached(request):
    emu.skip_unless_available()  # names the missing C++ compiler
    matrix_table.install(request.config)
    old = launch.use_emulator(True)
    try:
        with cases.registered_for_cpu(IMPLS) as called:
            yield called
    finally:
        launch.use_emulator(old)


@pytest.mark.parametrize(("case", "mode"), cases.backend_params(IMPLS))
def test_bad_input(reached, case, mode):
    outcome = cases.run_on_backend(case, mode, IMPLS, reached)
    matrix_table.record(BACKEND, f"{case.group} [{mode}]", case.name, outcome)


def test_every_op_has_rows():
    rows = {op for c in cases.for_backend(IMPLS) for op in c.ops}
    missing = {op.split(".")[0] for op in IMPLS} - rows
    assert not missing, f"ops of bitsandbytes_cuda without a bad-input row: {sorted(missing)}"


def test_registration_reaches_the_backend(reached):
    reached.clear()
    torch.ops.bitsandbytes.quantize_4bit(torch.ones(64), 64, "nf4", torch.uint8)
    assert reached == {"quantize_4bit"}


def test_emulator_names_an_out_of_bounds_buffer(reached):
    """The matrix can fail on an out-of-bounds access: a launch told of 64 values for a 16-byte buffer."""
    A, absmax, out = torch.zeros(16, dtype=torch.uint8), torch.ones(1), torch.empty(32)
    with pytest.raises(EmulationError, match=r"out-of-bounds read near buffer 'A \(uint8\[16\]\)'"):
        launch.launch("dequantize_4bit_nf4_f32", 1, 256, 0, A, absmax, out, 64, 64)
    matrix_table.record(BACKEND, "emulator self-check", "n past a buffer", "raises: EmulationError")
