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
from pathlib import Path

import pytest

# The session's -fsanitize list (ci/sanitize/run.py passes it on); each check needs its sanitizer in it.
SANITIZE = os.environ.get("BNB_EMU_SANITIZE", "").split(",")
if SANITIZE == [""] or ("address" in SANITIZE and not hasattr(ctypes.CDLL(None), "__asan_init")):
    pytest.fail("run these through ci/sanitize/run.py (sanitizer list and preloaded runtime)", pytrace=False)


def needs(sanitizer: str):
    return pytest.mark.skipif(sanitizer not in SANITIZE, reason=f"the session's build has no -fsanitize={sanitizer}")


def _child(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(
    ("sanitizer", "symbol"), [("address", b"__asan_report_load"), ("undefined", b"__ubsan_handle_")]
)
def test_cpu_extension_is_instrumented(sanitizer, symbol):
    """The installed extension calls into the runtime: CMake's BNB_SANITIZE reached its compiles."""
    if sanitizer not in SANITIZE:
        pytest.skip(f"the session's build has no -fsanitize={sanitizer}")
    origin = importlib.util.find_spec("bitsandbytes_cpu._C").origin
    assert symbol in Path(origin).read_bytes(), f"{origin} is not built with -fsanitize={sanitizer}"


def test_cpu_backend_is_the_one_loaded():
    import bitsandbytes.backends as backends

    record = {r.name: r for r in backends.records()}.get("cpu")
    assert record is not None and record.status == "loaded", record


# A TU built with the flags CMakeLists.txt's BNB_SANITIZE adds, loaded into Python as the extension is.
CANARY = r"""
#include <cstdlib>
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
    flags = [f"-fsanitize={','.join(SANITIZE)}", "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer"]
    compiler_env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    subprocess.run(
        [cxx, *flags, "-O1", "-g", "-shared", "-fPIC", str(src), "-o", str(lib)], check=True, env=compiler_env
    )
    return lib


@needs("address")
def test_heap_overflow_is_caught(canary):
    assert ctypes.CDLL(str(canary)).heap_read(3) == 3
    bad = _child(f"import ctypes; ctypes.CDLL({str(canary)!r}).heap_read(4)")
    assert bad.returncode != 0 and "AddressSanitizer: heap-buffer-overflow" in bad.stderr, bad.stderr[-3000:]


@needs("undefined")
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
__global__ void divergent_barrier(float* out, int i) {
  if (threadIdx.x < 16) __syncthreads();
  out[threadIdx.x] = 1.f;
}
__global__ void write_past_end(float* out, int i) { out[threadIdx.x + i] = 1.f; }
"""
KERNELS = ["local_oob", "table_oob", "wide_shift", "divergent_barrier", "write_past_end"]


LAUNCH = """
import torch
import bitsandbytes_emu as emu
mod = emu.load_cuda("sanitize_live.cu", KERNELS, code=KERNEL)
out = torch.zeros(32, dtype=torch.int32 if kernel == "wide_shift" else torch.float32)
mod[kernel][1, 32](out, arg)
"""


def _emulated_here(kernel: str, arg: int) -> float:
    scope = {"KERNEL": KERNEL, "KERNELS": KERNELS, "kernel": kernel, "arg": arg}
    exec(LAUNCH, scope)
    return scope["out"][1].item()


def _emulated_child(kernel: str, arg: int) -> subprocess.CompletedProcess:
    return _child(f"KERNEL, KERNELS, kernel, arg = {KERNEL!r}, {KERNELS!r}, {kernel!r}, {arg}\n{LAUNCH}")


@needs("address")
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


@needs("undefined")
def test_emulated_kernel_undefined_behaviour_is_caught():
    assert _emulated_here("wide_shift", 30) == 1 << 30
    caught = _emulated_child("wide_shift", 40)
    assert caught.returncode != 0 and "runtime error: shift exponent 40" in caught.stderr, caught.stderr[-3000:]


@needs("address")
def test_emulator_errors_leave_asan_consistent():
    """Launches the emulator aborts from inside a lane (a barrier not every lane reaches; a fault past a
    buffer, taken on the signal stack) jump off the lane's stack; with the fiber annotations ASan follows,
    so it neither warns that it lost track of the stack nor reports false errors in the launches after."""
    code = f"""
import torch
import bitsandbytes_emu as emu
mod = emu.load_cuda("sanitize_live.cu", {KERNELS!r}, code={KERNEL!r})
out = torch.zeros(32)
for bad in ("divergent_barrier", "write_past_end") * 3:
    try:
        mod[bad][1, 32](out, 1)
        raise SystemExit(bad + " was not reported")
    except emu.EmulationError:
        pass
    mod.local_oob[1, 32](out, 3)
    assert out[1].item() == 4.0
print("clean")
"""
    run = _child(code)
    assert run.returncode == 0 and run.stdout.strip() == "clean", run.stderr[-3000:]
    assert "Sanitizer" not in run.stderr and "ASan" not in run.stderr, run.stderr[-3000:]
