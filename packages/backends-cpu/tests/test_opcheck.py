"""torch.library.opcheck on the native CPU kernels: the fake kernels, schemas and autograd registration
of the core hold for what this backend computes (the core's own test_opcheck runs the reference)."""

import pytest
import torch

from bitsandbytes._ops import OPS
from bitsandbytes.testing.samples import opcheck_failures
from bitsandbytes_cpu.ops import all_ops

IMPLEMENTED = sorted(all_ops())


def test_the_backend_implements_ops():
    assert IMPLEMENTED and set(IMPLEMENTED) <= set(OPS)


@pytest.mark.parametrize("op", IMPLEMENTED)
def test_opcheck_native_kernel(op):
    # The dispatcher's CPU entry is this backend's kernel, not the reference (the default kernel).
    assert torch._C._dispatch_has_kernel_for_dispatch_key(f"bitsandbytes::{op}", "CPU"), f"{op}: no CPU kernel"
    assert opcheck_failures(op, "cpu") == []
