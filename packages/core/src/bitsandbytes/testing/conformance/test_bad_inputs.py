"""The bad-input matrix (``bitsandbytes.testing.bad_inputs``) on the device under test.

Each case is one bad call: it must raise an exception naming the argument (whatever kernel is behind the
op, since every backend calls the op's contract), or give the documented result of the NaN/Inf policy,
which the device's kernels compute. The cases make their tensors on the default device, set here with
``with device:``; cases on meta tensors test the fake kernels and do the same on every device. An
exception a test harness declares (``bnb_harness_errors``) always fails a case. With ``-v`` the rows
are printed as a table at the end of the run.
"""

from __future__ import annotations

import pytest

from .. import bad_input_table
from ..bad_inputs import CASES, OP_NAMES, run


@pytest.fixture(scope="module", autouse=True)
def _table(request):
    if request.config.get_verbosity() > 0:
        bad_input_table.install(request.config)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(bnb_device, bnb_harness_errors, case):
    with bnb_device:
        outcome = run(case, harness_errors=bnb_harness_errors)
    bad_input_table.record(f"suite ({bnb_device})", case.group, case.name, outcome)


def test_matrix_covers_every_op():
    """Every torch.ops.bitsandbytes op is reached by at least one case."""
    covered = set().union(*(c.ops for c in CASES))
    assert not OP_NAMES - covered, f"ops without a bad-input case: {sorted(OP_NAMES - covered)}"
