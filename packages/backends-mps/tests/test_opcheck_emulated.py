"""torch.library.opcheck on this package's Metal kernels, run in the kernel emulator on CPU tensors.

For the duration of this module every native op of ``bitsandbytes_mps.ops`` is the ``CPU`` kernel of its
op (as ``-p bitsandbytes_mps.testing.emulated`` does for the conformance suite), through a
``torch.library.Library`` of its own that is destroyed afterwards, so the other tests keep their kernels.
"""

from collections import Counter

import pytest
import torch

from bitsandbytes.testing import emu
from bitsandbytes.testing.samples import opcheck_failures
from bitsandbytes_mps import library, ops

OPS = sorted(ops.all_ops())
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
    old = library.use_emulator(True)
    library.reset()
    library.load()
    native = ops.native_ops()
    # In emulation every Metal source compiles: an op missing here is a kernel that failed to load.
    assert sorted(native) == OPS, f"not loaded in emulation: {sorted(set(OPS) - set(native))}"
    lib = torch.library.Library("bitsandbytes", "IMPL")
    for op, fn in native.items():
        lib.impl(op, counted(op, fn), "CPU")
    yield
    lib._destroy()
    library.use_emulator(old)
    library.reset()


@pytest.mark.parametrize("op", OPS)
def test_opcheck_emulated_metal_kernel(emulated_cpu_kernels, op):
    before = CALLS[op]
    assert opcheck_failures(op, "cpu") == []
    assert CALLS[op] > before
