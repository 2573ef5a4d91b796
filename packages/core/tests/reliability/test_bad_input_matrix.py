"""The bad-input matrix (cases in bad_input_cases.py) on the device ``cpu`` kernels: the reference under
``BNB_BACKENDS=none``, else the CPU backend's. Each row: a clear exception naming the argument, or the
documented result; the conftest prints the rows as a table."""

from __future__ import annotations

import pytest
from bad_input_cases import CASES, OP_NAMES, run
from matrix_table import record


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(case):
    record("core (cpu)", case.group, case.name, run(case))


def test_matrix_covers_every_op():
    """Every registered torch.ops.bitsandbytes op is reached by at least one row."""
    covered = set().union(*(c.ops for c in CASES))
    assert not OP_NAMES - covered, f"ops without a bad-input row: {sorted(OP_NAMES - covered)}"
