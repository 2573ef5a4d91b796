"""The bad-input matrix's backend-specific rows on this package's Metal kernels in the emulator: the glue's
launch arithmetic at sizes past int32, and that the emulator names an out-of-bounds access. The matrix
itself (``bitsandbytes.testing.bad_inputs``) runs in the conformance suite (``conformance/
test_bad_inputs.py``) on these kernels, registered for ``cpu`` by ``bitsandbytes_mps.testing.emulated``,
which declares the emulator's errors as harness errors. The rows join the matrix's printed table."""

from __future__ import annotations

import pytest
import torch

from bitsandbytes.testing import bad_input_table
from bitsandbytes.testing import bad_inputs as cases
from bitsandbytes_emu.errors import EmulationError
from bitsandbytes_mps import library
from bitsandbytes_mps.ops import _common, _quantize

BACKEND = "mps (emulated)"


@pytest.fixture(autouse=True)
def _table(request, emulated):
    bad_input_table.install(request.config)


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
def test_glue(case):
    bad_input_table.record(BACKEND, case.group, case.name, cases.run(case, harness_errors=(EmulationError,)))


def test_emulator_names_an_out_of_bounds_buffer():
    """The matrix can fail on an out-of-bounds access: a dispatch told of 64 values for a 16-byte buffer."""
    A, absmax, out = torch.zeros(16, dtype=torch.uint8), torch.ones(1), torch.empty(32)
    with pytest.raises(EmulationError, match=r"out-of-bounds read near buffer 'A \(buffer 0\)'"):
        library.dispatch("dequantize_4bit_nf4_f32", A, absmax, out, 64, 64, threads=8, group_size=8)
    bad_input_table.record(BACKEND, "emulator self-check", "n past a buffer", "raises: EmulationError")
