"""torch.library.opcheck on this package's Metal kernels, run in the kernel emulator on CPU tensors.

For the duration of this module every native op of ``bitsandbytes_mps.ops`` is the ``CPU`` kernel of its
op (as ``-p bitsandbytes_mps.testing.emulated`` does for the conformance suite), through a
``torch.library.Library`` of its own that is destroyed afterwards, so the other tests keep their kernels.
"""

import pytest

import bitsandbytes_emu as emu
from bitsandbytes.testing.samples import opcheck_failures, served_as_cpu_kernels
from bitsandbytes_mps import library, ops

OPS = sorted(ops.all_ops())


@pytest.fixture(scope="module")
def calls():
    emu.skip_unless_available()  # names the missing C++ compiler
    old = library.use_emulator(True)
    library.reset()
    try:
        library.load()
        native = ops.native_ops()
        # In emulation every Metal source compiles: an op missing here is a kernel that failed to load.
        assert sorted(native) == OPS, f"not loaded in emulation: {sorted(set(OPS) - set(native))}"
        with served_as_cpu_kernels(native) as counted:
            yield counted
    finally:
        library.use_emulator(old)
        library.reset()


@pytest.mark.parametrize("op", OPS)
def test_opcheck_emulated_metal_kernel(calls, op):
    before = calls[op]
    assert opcheck_failures(op, "cpu") == []
    assert calls[op] > before
