"""torch.library.opcheck on this package's CUDA kernels, run in the kernel emulator on CPU tensors.

For the duration of this module every op of ``bitsandbytes_cuda.ops`` is the ``CPU`` kernel of its op
(as ``-p bitsandbytes_cuda.testing.emulated`` does for the conformance suite), through a
``torch.library.Library`` of its own that is destroyed afterwards, so the other tests keep their kernels.
"""

import pytest

import bitsandbytes_emu as emu
from bitsandbytes._ops import OPS
from bitsandbytes.testing.samples import opcheck_failures, served_as_cpu_kernels
from bitsandbytes_cuda import launch, ops

KERNELS = ops.all_ops()


@pytest.fixture(scope="module")
def calls():
    emu.skip_unless_available()  # names the missing C++ compiler
    old = launch.use_emulator(True)
    try:
        with served_as_cpu_kernels(KERNELS) as counted:
            yield counted
    finally:
        launch.use_emulator(old)


def test_every_op_has_a_cuda_kernel():
    assert set(KERNELS) == set(OPS)


@pytest.mark.parametrize("op", sorted(KERNELS))
def test_opcheck_emulated_cuda_kernel(calls, op):
    before = calls[op]
    assert opcheck_failures(op, "cpu") == []
    assert calls[op] > before
