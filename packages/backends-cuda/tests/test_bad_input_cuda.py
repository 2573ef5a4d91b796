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

import bitsandbytes_emu as emu
from bitsandbytes_cuda import launch, ops
from bitsandbytes_cuda.ops import _common
from bitsandbytes_cuda.ops import blockwise as quant_ops
from bitsandbytes_emu.errors import EmulationError

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
    outcome = cases.run_on_backend(case, mode, IMPLS, reached, harness_errors=(EmulationError,))
    matrix_table.record(BACKEND, f"{case.group} [{mode}]", case.name, outcome)


# The glue's own arithmetic at sizes past int32 (2**40 values; nothing is allocated): every launch it would
# make stays within CUDA's grid and block limits, which launch() enforces (ValueError naming the dimension).
_HUGE = 2**40


def _fits(geometry) -> bool:
    grid, block = geometry
    b = launch.normalize_dim(block, "block", launch._MAX_BLOCK)
    launch.normalize_dim(grid, "grid", launch._MAX_GRID)
    return b[0] * b[1] * b[2] <= 1024


_WITHIN = cases.Gives(_fits, "grid and block within CUDA's limits")


def _glue(name, fn, expect):
    return cases.local_case("launch geometry, 2**40 values", name, fn, expect)


GLUE = [
    _glue("quantize, blocksize 32", lambda: quant_ops.quantize_geometry(_HUGE, 32), _WITHIN),
    _glue("quantize, blocksize 4096", lambda: quant_ops.quantize_geometry(_HUGE, 4096), _WITHIN),
    _glue("dequantize", lambda: quant_ops.dequantize_geometry(_HUGE), _WITHIN),
    _glue("rows x 8 columns", lambda: _common.rows_cols_geometry(_HUGE // 8, 8), _WITHIN),
    _glue("8 rows x columns", lambda: _common.rows_cols_geometry(8, 2**31 - 1), _WITHIN),
    _glue("elementwise", lambda: (_common.elementwise_grid(_HUGE), 256), _WITHIN),
]


@pytest.mark.parametrize("case", GLUE, ids=[c.id for c in GLUE])
def test_glue(case, request):
    matrix_table.install(request.config)
    matrix_table.record(BACKEND, case.group, case.name, cases.run(case, harness_errors=(EmulationError,)))


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
