"""The runtime's last-error state: a failure this library handled is never reported again by a later launch.

Each launcher returns ``cudaGetLastError()``; that state also holds the failures of this library's own
earlier calls (a failed ``cudaFuncGetAttributes`` probe, a refused prefetch). The generated text is
checked for the clear ahead of every launch (the real branch, which only a GPU runs), and the emulated
library, whose shim keeps the same per-thread state (``bnb_emu/cuda.h``), runs the sequence "a failed
call left an error, then a good launch" through one of upstream's entry points.
"""

from __future__ import annotations

import ctypes
import re
from pathlib import Path

import pytest
import torch

import bitsandbytes.functional as F
import bitsandbytes_emu as emu
from bitsandbytes._reference import REFERENCE
from bitsandbytes_cuda import _generate, tables, upstream_api

CSRC = Path(__file__).resolve().parents[1] / "csrc"
NO_KERNEL_IMAGE = 209  # cudaErrorNoKernelImageForDevice, what a failed probe leaves
BAD_DEVICE = 101  # cudaErrorInvalidDevice, what a refused prefetch leaves


def _branches(text: str) -> tuple[str, str]:
    """(emulated, real) parts of one generated launcher, each with the lines shared by both."""
    head, rest = text.split("#ifdef BNB_EMU\n")
    emulated, rest = rest.split("#else\n")
    real, tail = rest.split("#endif\n")
    return head + emulated + tail, head + real + tail


@pytest.mark.parametrize("kernel", sorted(tables.all_kernels()), ids=str)
def test_every_launcher_clears_the_last_error_before_launching(kernel):
    k = tables.get(kernel)
    emulated, real = _branches(_generate.launcher(k))
    for branch in (emulated, real):
        clear = branch.index("(void)cudaGetLastError();")
        launch = branch.index("<<<") if branch is real else branch.index("::bnb_emu::cuda::launch(")
        assert clear < launch
        assert branch.rstrip().endswith("return static_cast<int>(cudaGetLastError());\n}")
    # A refused shared-memory opt-in returns its error and clears it, so the next launch does not repeat it.
    refused = re.search(r"if \(e != cudaSuccess\) \{(.*?)\}", real, re.S).group(1)
    assert "(void)cudaGetLastError();" in refused and "return static_cast<int>(e);" in refused


@pytest.mark.parametrize("source", ["library.cu", "paged.cu"])
def test_entry_points_clear_the_error_they_report(source):
    text = (CSRC / source).read_text()
    calls = re.findall(r"cuda(?:FuncGetAttributes|MallocManaged|Free|DeviceGetAttribute|MemPrefetchAsync)\(", text)
    assert calls, source
    # Every runtime call's result goes through a path that clears the state on failure.
    if source == "paged.cu":
        assert text.count("return handled(cuda") == len(calls)
        assert "if (e != cudaSuccess) (void)cudaGetLastError();" in text
    else:
        assert "if (e != cudaSuccess) (void)cudaGetLastError();" in text


@pytest.fixture(scope="module")
def lib():
    emu.skip_unless_available()
    library = upstream_api.emulated_library()
    library.bnb_cuda_emu_leave_error.argtypes = [ctypes.c_int]
    return library


@pytest.mark.parametrize("left", [NO_KERNEL_IMAGE, BAD_DEVICE])
def test_a_good_launch_after_a_handled_failure_succeeds(lib, left):
    code = F.create_dynamic_map()
    A = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    q, absmax = REFERENCE["quantize_blockwise"](A, code, 256)
    out = torch.full((1000,), float("nan"))
    lib.bnb_cuda_emu_leave_error(left)
    assert lib.bnb_cuda_emu_peek_error() == left  # the shim keeps the state like the runtime
    rc = lib.cdequantize_blockwise_fp32(F.get_ptr(code), F.get_ptr(q), F.get_ptr(absmax), F.get_ptr(out),
                                        ctypes.c_int(256), ctypes.c_int(1000), None)  # fmt: skip
    assert rc == 0
    assert lib.bnb_cuda_emu_peek_error() == 0
    assert torch.equal(out, REFERENCE["dequantize_blockwise"](q, absmax, code, 256, torch.float32))
