"""The optimizer kernels (csrc/kernels/optimizers.cu): what is particular to the CUDA sources.

Their steps against the reference (every rule, dtype and map, odd sizes, NaN, strided absmax, bad
arguments) are the shipped suite's ``conformance/test_optimizers_strict.py``, which the emulated session
runs on these kernels with ``--bnb-bitexact``: the kernels repeat the reference's float32 operations in its
order with explicitly rounded intrinsics (no FMA contraction), so the new states are the reference's bits.
Here: the vector and scalar load paths agree, and nvcc compiles every table entry without contraction.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import torch

import bitsandbytes
from bitsandbytes._ops import OPTIMIZER_BLOCKSIZE
from bitsandbytes.testing.compare import assert_equal
from bitsandbytes.testing.conformance.test_optimizers_strict import args32, grad, state32
from bitsandbytes_cuda import launch
from bitsandbytes_cuda.ops import optimizers as ops

pytestmark = pytest.mark.usefixtures("emulated")  # conftest.py: launch() runs in the emulator

CSRC = Path(__file__).parents[1] / "csrc"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", ["adam", "ademamix", "rmsprop"])
def test_32bit_vector_and_scalar_paths_agree(name, dtype, monkeypatch):
    """Aligned buffers take 4-element vector loads, misaligned views the scalar loop: same bits."""
    flags = []

    def spy(kernel, *args):
        if kernel.startswith("optimizer_32bit_") and "norm" not in kernel:
            flags.append(args[9] & ops._VECTOR)
        launch.launch(kernel, *args)

    monkeypatch.setattr(ops, "launch", spy)
    n = 3 * OPTIMIZER_BLOCKSIZE + 4  # a multiple of 4: ademamix may vectorize too
    runs = []
    for offset in (0, 1):
        # The same values, at an offset of `offset` elements into their storage.
        def at(t, offset=offset):
            return torch.cat([t.new_zeros(offset), t])[offset:] if t is not None else None

        p = at(torch.randn(n, generator=torch.Generator().manual_seed(2)).to(dtype))
        st = {k: at(v) for k, v in state32(name, n, 3).items()}
        for step in (1, 2):
            g = at(grad(n, dtype, step))
            ops.optimizer_update_32bit(*args32(name, g, p, st, step, max_unorm=0.0, wd=0.01, skip=step == 2))
        runs.append([p, *st.values()])
    assert flags == [ops._VECTOR] * 2 + [0] * 2
    for got, want in zip(runs[1], runs[0], strict=True):
        if want is not None:
            assert_equal(got, want, f"{name} {dtype}")


# ---------------------------------------------------------------------------------------------------
# The sources are real CUDA


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA toolkit)")
def test_kernels_compile_with_nvcc(tmp_path):
    from bitsandbytes_cuda.tables import optimizers as table

    # Taking each table entry's address instantiates it, as the generated launchers do.
    refs = ", ".join(f"(void*)&{k.expr}" for k in table.KERNELS)
    src = tmp_path / "instances.cu"
    src.write_text(f'#include "kernels/optimizers.cu"\nvoid* instances[] = {{{refs}}};\n')
    include = ["-I", str(CSRC), "-I", bitsandbytes.get_include(), "-I", str(CSRC / "kernels")]
    run = subprocess.run(["nvcc", "-arch=sm_80", "-ptx", *include, str(src), "-o", str(tmp_path / "o.ptx")],
                         capture_output=True, text=True)  # fmt: skip
    assert run.returncode == 0, run.stderr
    ptx = (tmp_path / "o.ptx").read_text()
    # The element math must not be contracted or approximated (the reference's bits depend on it).
    assert "fma.rn.f32" not in ptx and ".approx.f32" not in ptx.replace("ex2.approx", "")
