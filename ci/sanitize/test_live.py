"""Proof that the sanitizer run can fail: run by ci/sanitize/run.py (under the preloaded runtime) first.

Each deliberate error runs in a child process (a report aborts it) and must be reported by name; the
same code with a valid argument runs clean in this process, so a report is the error's, not the setup's.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SANITIZE = os.environ.get("BNB_EMU_SANITIZE", "")
pytestmark = pytest.mark.skipif(
    not hasattr(ctypes.CDLL(None), "__asan_init"), reason="needs the ASan runtime preloaded: run ci/sanitize/run.py"
)


def _child(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300)


def test_cpu_extension_is_instrumented():
    """The installed extension calls into both runtimes: CMake's BNB_SANITIZE reached its compiles."""
    origin = importlib.util.find_spec("bitsandbytes_cpu._C").origin
    binary = Path(origin).read_bytes()
    assert b"__asan_report_load" in binary, f"{origin} is not built with -fsanitize=address"
    assert b"__ubsan_handle_" in binary, f"{origin} is not built with -fsanitize=undefined"


def test_cpu_backend_is_the_one_loaded():
    import bitsandbytes.backends as backends

    record = {r.name: r for r in backends.records()}.get("cpu")
    assert record is not None and record.status == "loaded", record


# A TU built with the flags CMakeLists.txt's BNB_SANITIZE adds, loaded into Python as the extension is.
CANARY = r"""
#include <cstdlib>
#include <climits>
extern "C" int heap_read(int i) {
  int* p = static_cast<int*>(std::malloc(4 * sizeof(int)));
  for (int k = 0; k < 4; ++k) p[k] = k;
  int* volatile opaque = p;  // hides the size from UBSan's bounds checks: ASan alone must catch it
  int v = opaque[i];
  std::free(p);
  return v;
}
extern "C" int add(int a, int b) { return a + b; }
"""


@pytest.fixture(scope="module")
def canary(tmp_path_factory):
    out = tmp_path_factory.mktemp("canary")
    src, lib = out / "canary.cpp", out / "canary.so"
    src.write_text(CANARY)
    cxx = os.environ.get("CXX", "c++")
    flags = ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer", "-O1", "-g"]
    subprocess.run([cxx, *flags, "-shared", "-fPIC", str(src), "-o", str(lib)], check=True, env=_no_preload())
    return lib


def _no_preload() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}


def test_heap_overflow_is_caught(canary):
    assert ctypes.CDLL(str(canary)).heap_read(3) == 3
    bad = _child(f"import ctypes; ctypes.CDLL({str(canary)!r}).heap_read(4)")
    assert bad.returncode != 0 and "AddressSanitizer: heap-buffer-overflow" in bad.stderr, bad.stderr[-3000:]


def test_signed_overflow_is_caught(canary):
    assert ctypes.CDLL(str(canary)).add(2**31 - 2, 1) == 2**31 - 1
    bad = _child(f"import ctypes; ctypes.CDLL({str(canary)!r}).add(2**31 - 1, 1)")
    assert bad.returncode != 0 and "runtime error: signed integer overflow" in bad.stderr, bad.stderr[-3000:]


# An emulated CUDA kernel built the way the emulated backends' kernels are: a local array read past its end
# (the emulator's own guard pages cover only the staged buffers), a table in constant memory read past its
# end (both through an opaque pointer, so that ASan and not UBSan's bounds check catches them), a shift
# wider than the type.
KERNEL = r"""
__constant__ float table[4] = {0.f, 1.f, 2.f, 3.f};
__global__ void local_oob(float* out, int i) {
  float local[4];
  for (int k = 0; k < 4; ++k) local[k] = static_cast<float>(k + threadIdx.x);
  float* volatile opaque = local;
  out[threadIdx.x] = opaque[i];
}
__global__ void table_oob(float* out, int i) {
  const float* volatile opaque = table;
  out[threadIdx.x] = opaque[i];
}
__global__ void wide_shift(int* out, int s) { out[threadIdx.x] = 1 << s; }
"""


LAUNCH = """
import torch
from bitsandbytes.testing import emu
mod = emu.load_cuda("sanitize_live.cu", ["local_oob", "table_oob", "wide_shift"], code=KERNEL)
out = torch.zeros(32, dtype=torch.int32 if kernel == "wide_shift" else torch.float32)
mod[kernel][1, 32](out, arg)
"""


def _emulated_here(kernel: str, arg: int) -> float:
    scope = {"KERNEL": KERNEL, "kernel": kernel, "arg": arg}
    exec(LAUNCH, scope)
    return scope["out"][1].item()


def _emulated_child(kernel: str, arg: int) -> subprocess.CompletedProcess:
    return _child(f"KERNEL, kernel, arg = {KERNEL!r}, {kernel!r}, {arg}\n{LAUNCH}")


@pytest.mark.skipif("address" not in SANITIZE.split(","), reason="BNB_EMU_SANITIZE does not include address")
@pytest.mark.parametrize(
    ("kernel", "good", "expected", "bad", "report"),
    [
        ("local_oob", 3, 4.0, 4, "AddressSanitizer: stack-buffer-overflow"),
        ("table_oob", 2, 2.0, 4, "AddressSanitizer: global-buffer-overflow"),
    ],
)
def test_emulated_kernel_memory_error_is_caught(kernel, good, expected, bad, report):
    assert _emulated_here(kernel, good) == expected
    caught = _emulated_child(kernel, bad)
    assert caught.returncode != 0 and report in caught.stderr, caught.stderr[-3000:]
    # The lane that did it is in the stack ASan prints: the fiber annotations keep it on the lane's stack.
    assert kernel in caught.stderr


@pytest.mark.skipif("undefined" not in SANITIZE.split(","), reason="BNB_EMU_SANITIZE does not include undefined")
def test_emulated_kernel_undefined_behaviour_is_caught():
    assert _emulated_here("wide_shift", 30) == 1 << 30
    caught = _emulated_child("wide_shift", 40)
    assert caught.returncode != 0 and "runtime error: shift exponent 40" in caught.stderr, caught.stderr[-3000:]
