"""Upstream's ctypes-facing names: ``functional.get_ptr``/``is_on_gpu``/``has_avx512bf16``/``lib``,
``bitsandbytes.cextension``, ``bitsandbytes.cuda_specs``, ``bitsandbytes.consts``.

Upstream's behaviour, from its sources (bitsandbytes/functional.py, cextension.py, cuda_specs.py,
consts.py): ``get_ptr(None) is None``, else ``ctypes.c_void_p(A.data_ptr())``; ``lib.<anything>``
resolves, a missing entry point to a Python function that raises ``RuntimeError`` only when called;
``is_on_gpu`` raises ``RuntimeError`` for CPU tensors or tensors on two devices, skipping None and
paged tensors; ``get_cuda_specs()`` is None without a GPU.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from plugin_dist import make_dist, run_snippet

import bitsandbytes
import bitsandbytes.functional as F
from bitsandbytes import cextension, consts, cuda_specs
from bitsandbytes.backends import Backend, discovery

LIBC = ctypes.util.find_library("c")
needs_libc = pytest.mark.skipif(LIBC is None or sys.platform == "win32", reason="needs the C library (POSIX)")


@pytest.fixture
def served_by():
    """Serve ``lib`` from a given library for one test; the previous setting comes back afterwards."""
    previous = []

    def serve(library, origin="test library"):
        previous.append(cextension.provide_native_library(library, origin))

    yield serve
    if previous:
        cextension.provide_native_library(*previous[0])


# ------------------------------------------------------------------------------------------ get_ptr


def test_get_ptr_is_the_data_pointer_as_c_void_p():
    assert F.get_ptr(None) is None
    x = torch.arange(10, dtype=torch.float32)
    p = F.get_ptr(x)
    assert isinstance(p, ctypes.c_void_p) and p.value == x.data_ptr()
    view = x[3:]  # a view starts at its own first element, not its storage's
    assert F.get_ptr(view).value == x.data_ptr() + 3 * x.element_size()
    assert ctypes.cast(F.get_ptr(view), ctypes.POINTER(ctypes.c_float))[0] == 3.0


def test_get_ptr_refuses_what_is_not_a_tensor():
    with pytest.raises(TypeError, match=r"get_ptr: A must be a torch\.Tensor or None, got list"):
        F.get_ptr([1, 2])


# ---------------------------------------------------------------------------------------- is_on_gpu


def _fake(device: str, *, paged: bool = False):
    return SimpleNamespace(device=torch.device(device), shape=(2,), is_paged=paged)


def test_is_on_gpu_accepts_one_device_none_and_paged():
    assert F.is_on_gpu([_fake("cuda:0"), None, _fake("cuda:0")]) is True
    assert F.is_on_gpu([_fake("cuda:0"), _fake("cpu", paged=True)]) is True  # paged memory is reachable
    assert F.is_on_gpu([None]) is True


def test_is_on_gpu_refuses_cpu_tensors_and_mixed_devices():
    with pytest.raises(RuntimeError, match="some are not on a GPU"):
        F.is_on_gpu([torch.zeros(2), _fake("cuda:0")])
    with pytest.raises(RuntimeError, match="several devices"):
        F.is_on_gpu([_fake("cuda:0"), _fake("cuda:1")])
    with pytest.raises(RuntimeError, match="several devices"):
        F.is_on_gpu([_fake("cuda:0"), _fake("xpu:0")])


# ----------------------------------------------------------------------------------- has_avx512bf16


def test_has_avx512bf16_tells_what_the_cpu_reports():
    answer = F.has_avx512bf16()
    assert isinstance(answer, bool)
    if sys.platform.startswith("linux") and F.lib._lib is None:
        flags = {f for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")
                 for f in line.split(":", 1)[1].split()}  # fmt: skip
        assert answer == ("avx512_bf16" in flags)


# ------------------------------------------------------------------------------------------------ lib


def test_lib_is_upstreams_name_in_both_modules():
    assert F.lib is cextension.lib is cextension.get_native_library()
    assert isinstance(F.lib, cextension.BNBNativeLibrary)


def test_without_a_library_every_name_resolves_and_raises_only_when_called(served_by):
    served_by(lambda: None, "nothing (test)")
    handle = F.lib.cdequantize_blockwise_fp32
    assert callable(handle) and not hasattr(handle, "restype")  # unsloth's test for "not a real kernel"
    assert F.lib.cdequantize_blockwise_fp32 is handle and F.lib["cdequantize_blockwise_fp32"] is handle
    with pytest.raises(RuntimeError) as info:
        handle(None, None, None, None, ctypes.c_int(64), ctypes.c_int(0), None)
    message = str(info.value)
    assert "lib.cdequantize_blockwise_fp32() was called" in message and "no native library" in message
    assert "CUDA backend (bitsandbytes-cuda" in message
    assert "torch.ops.bitsandbytes.dequantize_blockwise" in message
    for name, op in [
        ("cdequantize_blockwise_bf16_nf4", "dequantize_4bit"),
        ("cgemm_4bit_inference_naive_fp16", "gemv_4bit"),
        ("cquantize_blockwise_fp16_fp4", "quantize_4bit"),
        ("cquantize_blockwise_fp32", "quantize_blockwise"),
    ]:
        with pytest.raises(RuntimeError, match=rf"lib\.{name}\(\).*torch\.ops\.bitsandbytes\.{op} "):
            F.lib[name]()
    with pytest.raises(RuntimeError, match=r"cadam32bit_grad_fp32.*the functional API"):
        F.lib.cadam32bit_grad_fp32()
    with pytest.raises(AttributeError):
        F.lib.__array_interface__  # noqa: B018  (probes of dunders must not find a stand-in)
    assert F.lib._lib is None and not F.lib.compiled_with_cuda
    assert "none" in repr(F.lib)


@needs_libc
def test_with_a_library_its_functions_are_lib_and_the_rest_stand_ins(served_by):
    libc = ctypes.CDLL(LIBC)
    served_by(libc, "libc (test)")
    assert F.lib._lib is libc and F.lib.compiled_with_cuda
    strlen = F.lib.strlen
    assert hasattr(strlen, "restype") and strlen(b"abcd") == 4
    with pytest.raises(RuntimeError, match=r"lib\.cdequantize_blockwise_fp32\(\).*libc \(test\) does not export"):
        F.lib.cdequantize_blockwise_fp32()
    assert cextension.get_cuda_bnb_library_path() == Path(libc._name)


def test_a_library_that_fails_to_open_is_named_when_called(served_by):
    def broken():
        raise OSError("libwhatever.so: cannot open shared object file")

    served_by(broken, "broken provider")
    with pytest.raises(RuntimeError, match="broken provider could not open its library: OSError: libwhatever"):
        F.lib.cdequantize_blockwise_fp32()


@needs_libc
def test_lib_comes_from_a_loaded_backend_and_only_a_loaded_one(monkeypatch):
    libc = ctypes.CDLL(LIBC)
    away = Backend("away", ["cpu"], api_version="1.0", native_library=lambda: pytest.fail("not loaded: never asked"))
    broken = Backend("broken", ["cpu"], api_version="1.0", native_library=lambda: 1 / 0)
    serving = Backend("serving", ["cpu"], api_version="1.0", native_library=lambda: libc)
    rec = discovery.BackendRecord
    records = [
        rec("away", "m:away", status=discovery.SKIPPED, reason=discovery.UNAVAILABLE, backend=away),
        rec("plain", "m:plain", status=discovery.LOADED, backend=Backend("plain", ["cpu"], api_version="1.0")),
        rec("broken", "m:broken", status=discovery.LOADED, backend=broken),
    ]
    monkeypatch.setattr(discovery, "RECORDS", records)
    monkeypatch.setattr(cextension, "_provided", None)
    cextension.lib._reset()
    try:
        assert F.lib._lib is None
        with pytest.raises(RuntimeError) as info:
            F.lib.cdequantize_blockwise_fp32()
        message = str(info.value)
        assert "backend 'broken' could not open its native library: ZeroDivisionError" in message
        assert "loaded backends: plain, broken" in message and "not loaded: away (skipped: not available" in message

        stale = F.lib.cdequantize_blockwise_fp32
        # A backend that loads after lib was first read (no reset): "no library" is never kept.
        records.append(rec("serving", "m:serving", status=discovery.LOADED, backend=serving))
        assert F.lib._lib is libc and F.lib.strlen(b"xyz") == 3
        assert "backend 'serving'" in repr(F.lib)
        fresh = F.lib.cdequantize_blockwise_fp32
        assert fresh is not stale and fresh is F.lib.cdequantize_blockwise_fp32
        with pytest.raises(RuntimeError, match=r"backend 'serving' .* does not export cdequantize_blockwise_fp32"):
            fresh()
    finally:
        cextension.lib._reset()


PLUGIN = """
import ctypes, ctypes.util
from bitsandbytes.backends import Backend

def _libc():
    return ctypes.CDLL(ctypes.util.find_library("c"))

def _never():
    raise AssertionError("an unavailable backend's native library was asked for")

serving = Backend("serving", ["cpu"], api_version="1.0", native_library=_libc)
away = Backend("away", ["cpu"], api_version="1.0", is_available=lambda: False, native_library=_never)
"""

SERVED = """
import bitsandbytes.functional as F
try:
    F.lib.cdequantize_blockwise_fp32()
    missing = None
except RuntimeError as e:
    missing = str(e)
emit({"strlen": F.lib.strlen(b"hello"), "real": hasattr(F.lib.strlen, "restype"), "repr": repr(F.lib),
      "missing": missing})
"""


@needs_libc
def test_an_installed_plugin_serves_lib_through_its_backend_object(tmp_path):
    site = make_dist(tmp_path / "site", "bnb-libplugin", "0.1", {"serving": "bnb_libplugin:serving",
                     "away": "bnb_libplugin:away"}, {"bnb_libplugin": PLUGIN})  # fmt: skip
    result = run_snippet(SERVED, site, BNB_BACKENDS="serving,away")
    assert result["strlen"] == 5 and result["real"]
    assert "backend 'serving'" in result["repr"]
    assert (
        "backend 'serving'" in result["missing"] and "does not export cdequantize_blockwise_fp32" in result["missing"]
    )


# ------------------------------------------------------------------------------ cextension, cuda_specs, consts


def test_cextension_environment_names():
    assert cextension.HIP_ENVIRONMENT is bool(torch.version.hip)
    expected = "ROCm" if torch.version.hip else ("CUDA" if torch.cuda.is_available() else None)
    if expected is not None:
        assert cextension.BNB_BACKEND == expected
    else:
        assert cextension.BNB_BACKEND in ("XPU", "CPU")
    assert cextension.ROCM_GPU_ARCH == "unknown" or cextension.ROCM_GPU_ARCH.startswith("gfx")


def test_cuda_library_path_without_a_served_library(served_by):
    served_by(lambda: None, "nothing (test)")
    path = cextension.get_cuda_bnb_library_path()
    assert isinstance(path, Path)
    try:
        from importlib.metadata import distribution

        distribution("bitsandbytes-cuda")
        installed = True
    except Exception:
        installed = False
    if installed:  # the library the CUDA backend installed, found without importing it
        assert path.name.split(".")[0] in ("libbnb_cuda", "bnb_cuda") and path.is_file()
    else:  # upstream's shape: a path that does not exist, for the caller's "not found" message
        assert path.parent == consts.PACKAGE_DIR and not path.exists()


def test_cuda_specs_without_and_with_a_gpu(monkeypatch):
    if not torch.cuda.is_available():
        assert cuda_specs.get_cuda_specs() is None
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setattr(torch.version, "hip", None)
    cuda_specs.get_cuda_version_tuple.cache_clear()
    try:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: [(8, 6), (7, 0)][i])
        specs = cuda_specs.get_cuda_specs()
        assert specs == cuda_specs.CUDASpecs((8, 6), "124", (12, 4)) and specs.has_imma
        assert cuda_specs.get_compute_capabilities() == [(7, 0), (8, 6)]
        assert not cuda_specs.CUDASpecs((7, 0), "124", (12, 4)).has_imma
        assert cuda_specs.get_rocm_warpsize() == 32 and cuda_specs.get_rocm_gpu_arch() == "unknown"
        monkeypatch.setattr(torch.version, "cuda", None)
        cuda_specs.get_cuda_version_tuple.cache_clear()
        assert cuda_specs.get_cuda_version_tuple() is None and cuda_specs.get_cuda_version_string() is None
        assert cuda_specs.get_cuda_specs() is None
    finally:
        cuda_specs.get_cuda_version_tuple.cache_clear()


def test_consts():
    assert consts.PACKAGE_DIR == Path(bitsandbytes.__file__).parent
    suffix = {"Linux": ".so", "Darwin": ".dylib", "Windows": ".dll"}.get(platform.system(), ".so")
    assert consts.DYNAMIC_LIBRARY_SUFFIX == suffix
    assert bitsandbytes.cextension is cextension and bitsandbytes.cuda_specs is cuda_specs
