"""The suite covers every op and overload, and every op runs on the device under test."""

from __future__ import annotations

import pytest

from bitsandbytes._ops import OPS
from bitsandbytes._reference import REFERENCE

from ..samples import op_overload, samples
from . import test_blockwise, test_fourbit, test_int8, test_matmul_4bit, test_optimizers

MODULES = (test_blockwise, test_fourbit, test_int8, test_matmul_4bit, test_optimizers)


def test_every_op_has_conformance_tests():
    covered = {op for module in MODULES for op in module.OPS_TESTED}
    assert covered == set(OPS), f"ops without conformance tests: {sorted(set(OPS) - covered)}"


def test_every_op_has_a_reference_kernel():
    assert set(REFERENCE) == set(OPS), f"ops without a reference kernel: {sorted(set(OPS) - set(REFERENCE))}"


@pytest.mark.parametrize("op", OPS)
def test_samples_run_on_device(bnb_device, op):
    # Smoke test: each representative call runs on the device, outputs land on the device.
    for args, kwargs in samples(op, bnb_device):
        result = op_overload(op)(*args, **kwargs)
        outputs = result if isinstance(result, tuple) else (result,)
        for out in outputs:
            if out is not None:
                assert out.device.type == bnb_device.type, f"{op}: output on {out.device}, expected {bnb_device}"
