"""The bad-input matrix's backend-specific rows on this package's Metal kernels in the emulator: the glue's
launch arithmetic at sizes past int32, that the registration reaches these functions, and that the
emulator names an out-of-bounds access. The matrix itself (``bitsandbytes.testing.bad_inputs``) runs in
the conformance suite (``conformance/test_bad_inputs.py``) on these kernels, registered for ``cpu`` by
``bitsandbytes_mps.testing.emulated``, which declares the emulator's errors as harness errors. The rows
join the matrix's printed table."""

from __future__ import annotations

import pytest
import torch

import bitsandbytes_emu as emu
from bitsandbytes.testing import bad_input_table
from bitsandbytes.testing import bad_inputs as cases
from bitsandbytes_emu.errors import EmulationError
from bitsandbytes_mps import library, ops
from bitsandbytes_mps.ops import _common, _quantize

BACKEND = "mps (emulated)"
# Every op a module declares: in emulation every Metal source must load (checked by the fixture).
IMPLS = ops.all_ops()


@pytest.fixture(scope="module")
def reached(request):
    emu.skip_unless_available()  # names the missing C++ compiler
    bad_input_table.install(request.config)
    old = library.use_emulator(True)
    library.reset()
    try:
        assert ops.native_ops().keys() == IMPLS.keys(), library.status().as_dict()
        with cases.registered_for_cpu(IMPLS) as called:
            yield called
    finally:
        library.use_emulator(old)
        library.reset()


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
    bad_input_table.record(BACKEND, case.group, case.name, cases.run(case, harness_errors=(EmulationError,)))


def test_registration_reaches_the_backend(reached):
    reached.clear()
    torch.ops.bitsandbytes.quantize_4bit(torch.ones(64), 64, "nf4", torch.uint8)
    assert reached == {"quantize_4bit"}


def test_emulator_names_an_out_of_bounds_buffer(reached):
    """The matrix can fail on an out-of-bounds access: a dispatch told of 64 values for a 16-byte buffer."""
    A, absmax, out = torch.zeros(16, dtype=torch.uint8), torch.ones(1), torch.empty(32)
    with pytest.raises(EmulationError, match=r"out-of-bounds read near buffer 'A \(buffer 0\)'"):
        library.dispatch("dequantize_4bit_nf4_f32", A, absmax, out, 64, 64, threads=8, group_size=8)
    bad_input_table.record(BACKEND, "emulator self-check", "n past a buffer", "raises: EmulationError")
