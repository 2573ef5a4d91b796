"""The bad-input matrix's harness (``bitsandbytes.testing.bad_inputs``); its rows run in the conformance
suite (``conformance/test_bad_inputs.py``) on the device under test."""

from __future__ import annotations

import pytest
import torch

from bitsandbytes.testing.bad_inputs import Raises, local_case, registered_for_cpu, run


def test_registered_for_cpu_is_undone():
    """The backends' rows swap their functions in as the cpu kernels; afterwards the previous ones serve again."""
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

    class HarnessError(RuntimeError):
        pass

    def oob():
        raise HarnessError("out-of-bounds read near buffer 'A'")

    case = local_case("harness", "out of bounds", oob, Raises(RuntimeError, "buffer 'A'"))
    assert run(case) == "raises: HarnessError"
    with pytest.raises(HarnessError):
        run(case, harness_errors=(HarnessError,))
