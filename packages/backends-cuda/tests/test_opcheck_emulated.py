"""torch.library.opcheck on this package's CUDA kernels, run in the kernel emulator on CPU tensors.

For the duration of this module every op of ``bitsandbytes_cuda.ops`` is the ``CPU`` kernel of its op
(as ``-p bitsandbytes_cuda.testing.emulated`` does for the conformance suite), through a
``torch.library.Library`` of its own that is destroyed afterwards, so the other tests keep their kernels.
"""

from collections import Counter

import pytest
import torch

from bitsandbytes._ops import OPS
from bitsandbytes.testing import emu
from bitsandbytes.testing.samples import opcheck_failures
from bitsandbytes_cuda import launch, ops

KERNELS = ops.all_ops()
CALLS: Counter = Counter()


def counted(op, fn):
    # opcheck must exercise the emulated kernel, not whatever else the dispatcher holds for CPU.
    def kernel(*args, **kwargs):
        CALLS[op] += 1
        return fn(*args, **kwargs)

    return kernel


@pytest.fixture(scope="module")
def emulated_cpu_kernels():
    emu.skip_unless_available()  # names the missing C++ compiler
    old = launch.use_emulator(True)
    lib = torch.library.Library("bitsandbytes", "IMPL")
    for op, fn in KERNELS.items():
        lib.impl(op, counted(op, fn), "CPU")
    yield
    lib._destroy()
    launch.use_emulator(old)


def test_every_op_has_a_cuda_kernel():
    assert set(KERNELS) == set(OPS)


@pytest.mark.parametrize("op", sorted(KERNELS))
def test_opcheck_emulated_cuda_kernel(emulated_cpu_kernels, op):
    before = CALLS[op]
    assert opcheck_failures(op, "cpu") == []
    assert CALLS[op] > before
