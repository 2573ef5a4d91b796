"""The bad-input matrix (cases in bad_input_cases.py) on the device ``cpu`` kernels: the reference under
``BNB_BACKENDS=none``, else the CPU backend's. Each row: a clear exception naming the argument, or the
documented result; the conftest prints the rows as a table."""

from __future__ import annotations

import pytest
import torch
from bad_input_cases import CASES, OP_NAMES, run
from matrix_table import record


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(case):
    record("core (cpu)", case.group, case.name, run(case))


def test_matrix_covers_every_op():
    """Every registered torch.ops.bitsandbytes op is reached by at least one row."""
    covered = set().union(*(c.ops for c in CASES))
    assert not OP_NAMES - covered, f"ops without a bad-input row: {sorted(OP_NAMES - covered)}"


def test_registered_for_cpu_is_undone():
    """The backends' rows swap their functions in as the cpu kernels; afterwards the previous ones serve again."""
    from bad_input_cases import registered_for_cpu

    A = torch.ones(64)
    before = torch.ops.bitsandbytes.quantize_4bit(A, 64, "nf4", torch.uint8)
    marker = (torch.full((1,), 7, dtype=torch.uint8), torch.zeros(1))
    with registered_for_cpu({"quantize_4bit": lambda *args: marker}) as reached:
        assert torch.equal(torch.ops.bitsandbytes.quantize_4bit(A, 64, "nf4", torch.uint8)[0], marker[0])
    assert reached == {"quantize_4bit"}
    after = torch.ops.bitsandbytes.quantize_4bit(A, 64, "nf4", torch.uint8)
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


def test_a_harness_error_is_never_an_expected_outcome():
    """A backend's harness error (the emulator's EmulationError subclasses RuntimeError) fails a row even
    where the row expects a RuntimeError; without it passed in, the same exception is the expected one."""
    from bad_input_cases import Raises, local_case

    class HarnessError(RuntimeError):
        pass

    def oob():
        raise HarnessError("out-of-bounds read near buffer 'A'")

    case = local_case("harness", "out of bounds", oob, Raises(RuntimeError, "buffer 'A'"))
    assert run(case) == "raises: HarnessError"
    with pytest.raises(HarnessError):
        run(case, harness_errors=(HarnessError,))
