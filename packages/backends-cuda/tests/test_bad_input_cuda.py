"""Bad input on this package's glue and kernels, beyond the shipped bad-input matrix.

The matrix itself (``bitsandbytes.testing.bad_inputs``) is the conformance suite's ``test_bad_inputs.py``,
which the emulated session runs on these kernels (``-p bitsandbytes_cuda.testing.emulated``, whose
``pytest_bnb_harness_errors`` makes an emulated out-of-bounds access or deadlock fail a row). Here: the
launch geometry at sizes past int32, and that the emulator does catch an out-of-bounds launch. The rows
join the matrix's printed table."""

from __future__ import annotations

import pytest
import torch

from bitsandbytes.testing import bad_input_table
from bitsandbytes.testing.bad_inputs import Gives, local_case, run
from bitsandbytes_cuda import launch
from bitsandbytes_cuda.ops import _common
from bitsandbytes_cuda.ops import blockwise as quant_ops
from bitsandbytes_emu.errors import EmulationError

BACKEND = "cuda (emulated)"


# The glue's own arithmetic at sizes past int32 (2**40 values; nothing is allocated): every launch it would
# make stays within CUDA's grid and block limits, which launch() enforces (ValueError naming the dimension).
_HUGE = 2**40


def _fits(geometry) -> bool:
    grid, block = geometry
    b = launch.normalize_dim(block, "block", launch._MAX_BLOCK)
    launch.normalize_dim(grid, "grid", launch._MAX_GRID)
    return b[0] * b[1] * b[2] <= 1024


_WITHIN = Gives(_fits, "grid and block within CUDA's limits")


def _glue(name, fn, expect):
    return local_case("launch geometry, 2**40 values", name, fn, expect)


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
    bad_input_table.install(request.config)
    bad_input_table.record(BACKEND, case.group, case.name, run(case, harness_errors=(EmulationError,)))


def test_emulator_names_an_out_of_bounds_buffer(emulated, request):
    """The matrix can fail on an out-of-bounds access: a launch told of 64 values for a 16-byte buffer."""
    bad_input_table.install(request.config)
    A, absmax, out = torch.zeros(16, dtype=torch.uint8), torch.ones(1), torch.empty(32)
    with pytest.raises(EmulationError, match=r"out-of-bounds read near buffer 'A \(uint8\[16\]\)'"):
        launch.launch("dequantize_4bit_nf4_f32", 1, 256, 0, A, absmax, out, 64, 64)
    bad_input_table.record(BACKEND, "emulator self-check", "n past a buffer", "raises: EmulationError")
