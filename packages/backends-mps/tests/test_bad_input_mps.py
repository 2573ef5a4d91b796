"""The bad-input matrix (packages/core/tests/reliability/bad_input_cases.py) on this package's Metal kernels
in the emulator: every case that reaches an op of ``bitsandbytes_mps.ops``, through torch.ops with those
functions registered as the ``cpu`` kernels and by calling them directly. A case must end as it does on the
reference (a clear error naming the argument, or the documented result); an emulated out-of-bounds access,
deadlock or wrong dispatch fails it. The rows join the matrix's printed table."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import bitsandbytes_emu as emu
from bitsandbytes_emu.errors import EmulationError
from bitsandbytes_mps import library, ops
from bitsandbytes_mps.ops import _common, _quantize

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "packages" / "core" / "tests" / "reliability"))
import bad_input_cases as cases
import matrix_table

BACKEND = "mps (emulated)"
# Every op a module declares: in emulation every Metal source must load (checked by the fixture).
IMPLS = ops.all_ops()


@pytest.fixture(scope="module")
def reached(request):
    emu.skip_unless_available()  # names the missing C++ compiler
    matrix_table.install(request.config)
    old = library.use_emulator(True)
    library.reset()
    try:
        assert ops.native_ops().keys() == IMPLS.keys(), library.status().as_dict()
        with cases.registered_for_cpu(IMPLS) as called:
            yield called
    finally:
        library.use_emulator(old)
        library.reset()


@pytest.mark.parametrize(("case", "mode"), cases.backend_params(IMPLS))
def test_bad_input(reached, case, mode):
    outcome = cases.run_on_backend(case, mode, IMPLS, reached, harness_errors=(EmulationError,))
    matrix_table.record(BACKEND, f"{case.group} [{mode}]", case.name, outcome)


# The glue's own arithmetic at sizes past int32 (2**40 values; nothing is allocated): threadgroups stay
# within Apple's 1024 threads, and a launch past the kernels' 32-bit thread positions goes to the reference.
_HUGE = 2**40
_GROUP_OK = cases.Gives(lambda g: 1 <= g[1] <= 1024 and g[0] >= g[1], "threadgroup of at most 1024")


def _glue(name, fn, expect):
    return cases.local_case("launch geometry, 2**40 values", name, fn, expect)


GLUE = [
    _glue("quantize, blocksize 32", lambda: _quantize.quantize_geometry(_HUGE, 32), _GROUP_OK),
    _glue("quantize, blocksize 4096", lambda: _quantize.quantize_geometry(_HUGE, 4096), _GROUP_OK),
    _glue("dequantize", lambda: _quantize.dequantize_geometry(_HUGE), _GROUP_OK),
    _glue(
        "2**32 threads: reference",
        lambda: _common.native("dequantize_4bit_nf4_f32", 2**32),
        cases.Gives(lambda native: native is False, "not native (the reference serves it)"),
    ),
]


@pytest.mark.parametrize("case", GLUE, ids=[c.id for c in GLUE])
def test_glue(case, reached):
    matrix_table.record(BACKEND, case.group, case.name, cases.run(case, harness_errors=(EmulationError,)))


def test_every_op_has_rows():
    rows = {op for c in cases.for_backend(IMPLS) for op in c.ops}
    missing = {op.split(".")[0] for op in IMPLS} - rows
    assert not missing, f"ops of bitsandbytes_mps without a bad-input row: {sorted(missing)}"


def test_registration_reaches_the_backend(reached):
    reached.clear()
    torch.ops.bitsandbytes.quantize_4bit(torch.ones(64), 64, "nf4", torch.uint8)
    assert reached == {"quantize_4bit"}


def test_emulator_names_an_out_of_bounds_buffer(reached):
    """The matrix can fail on an out-of-bounds access: a dispatch told of 64 values for a 16-byte buffer."""
    A, absmax, out = torch.zeros(16, dtype=torch.uint8), torch.ones(1), torch.empty(32)
    with pytest.raises(EmulationError, match=r"out-of-bounds read near buffer 'A \(buffer 0\)'"):
        library.dispatch("dequantize_4bit_nf4_f32", A, absmax, out, 64, 64, threads=8, group_size=8)
    matrix_table.record(BACKEND, "emulator self-check", "n past a buffer", "raises: EmulationError")
