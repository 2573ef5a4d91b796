"""The launch path: kernel tables, ctypes argument types, the generated launchers (compiled with nvcc into
the library, then loaded), launch geometry and argument checks on both paths."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import bitsandbytes
from bitsandbytes import _ops
from bitsandbytes_cuda import _generate, launch, ops, plugin, tables, upstream_api
from bitsandbytes_cuda.ops._common import rows_cols_geometry
from bitsandbytes_cuda.tables import Kernel

CSRC = Path(__file__).resolve().parents[1] / "csrc"
NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="needs the CUDA compiler nvcc")


# ---------------------------------------------------------------------------------------------- tables


def test_every_table_entry_names_an_existing_source():
    kernels = tables.all_kernels()
    assert kernels, "no kernel tables were collected"
    for k in kernels.values():
        assert (CSRC / "kernels" / k.source).is_file(), k
        assert tables.get(k.name) is k


def test_every_op_module_implements_declared_ops():
    for op in ops.all_ops():
        assert op in _ops.OPS, op


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"name": "a-b"}, ValueError, "C identifier"),
        ({"source": "x.cpp"}, ValueError, "source"),
        ({"expr": " "}, ValueError, "expr"),
        ({"params": ("float*", "quad")}, ValueError, "parameter 1 'quad'"),
        ({"params": ("fancy*",)}, ValueError, "unknown type 'fancy'"),
        ({"params": (3,)}, TypeError, "params"),
    ],
)
def test_kernel_entries_are_validated(kwargs, error, match):
    fields = {"name": "k", "source": "k.cu", "expr": "k<float>", "params": ("const float*", "int")} | kwargs
    with pytest.raises(error, match=match):
        Kernel(**fields)


def test_unknown_kernel_name_suggests_the_close_ones():
    with pytest.raises(KeyError, match="did you mean int8_row_quant_f32"):
        tables.get("int8_row_quant_f23")


def test_argtypes_follow_the_table():
    k = Kernel("k", "k.cu", "k", ("const float*", "__half*", "long long", "int", "unsigned int", "float", "bool"))
    types = launch.argtypes(k)
    assert types[:8] == [ctypes.c_uint] * 7 + [ctypes.c_void_p]
    assert types[8:] == [
        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32, ctypes.c_uint32, ctypes.c_float,
        ctypes.c_bool,
    ]  # fmt: skip


# ---------------------------------------------------------------------------------------------- generator


def test_generator_writes_one_launcher_per_kernel(tmp_path):
    paths = _generate.generate(CSRC, tmp_path)
    assert sorted(p.name for p in paths) == sorted(
        f"launchers_{p.stem}.gen.cu" for p in (CSRC / "kernels").glob("*.cu")
    )
    text = (tmp_path / "launchers_int8.gen.cu").read_text()
    for k in tables.by_source()["int8.cu"]:
        assert f"int {k.symbol}(" in text and f"&{k.expr};" in text
    header = (tmp_path / "launchers.gen.h").read_text()
    for k in tables.all_kernels().values():
        assert f"int {k.symbol}(" in header  # declared for the library's own C code (upstream_api.cu)
    mtime = paths[0].stat().st_mtime_ns, (tmp_path / "launchers.gen.h").stat().st_mtime_ns
    _generate.generate(CSRC, tmp_path)
    # unchanged output is not rewritten (no rebuilds)
    assert (paths[0].stat().st_mtime_ns, (tmp_path / "launchers.gen.h").stat().st_mtime_ns) == mtime


def test_generator_rejects_a_table_naming_a_missing_source(tmp_path, monkeypatch):
    (tmp_path / "csrc" / "kernels").mkdir(parents=True)
    with pytest.raises(SystemExit, match=r"int8\.cu"):
        _generate.generate(tmp_path / "csrc", tmp_path / "out")


@pytest.fixture(scope="module")
def built_library(tmp_path_factory):
    """The library as CMake builds it (generated launchers + library.cu, static cudart), for one arch.
    One nvcc per source, as many at once as there are cores (one nvcc call would compile them in turn:
    the slowest setup of this folder), then one link."""
    if NVCC is None:
        pytest.skip("needs the CUDA compiler nvcc")
    from concurrent.futures import ThreadPoolExecutor

    out = tmp_path_factory.mktemp("lib")
    sources = [*_generate.generate(CSRC, out / "gen"), CSRC / "library.cu", CSRC / "paged.cu", CSRC / "upstream_api.cu"]
    compile_ = [
        NVCC, "-arch=sm_80", "-Xcompiler=-fPIC,-fvisibility=hidden,-Wall,-Wextra", "--Werror=all-warnings",
        "-I", str(CSRC), "-I", str(out / "gen"), "-I", bitsandbytes.get_include(),
        '-DBNB_CUDA_ARCHS_STRING="sm_80 compute_80 (PTX)"', "-c",
    ]  # fmt: skip
    objects = [out / f"{i}_{src.stem}.o" for i, src in enumerate(sources)]

    def nvcc(src: Path, obj: Path) -> subprocess.CompletedProcess:
        return subprocess.run([*compile_, str(src), "-o", str(obj)], capture_output=True, text=True)

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        for proc in pool.map(nvcc, sources, objects):
            assert proc.returncode == 0, proc.stderr
    lib = out / "libbnb_cuda.so"
    link = [NVCC, "-arch=sm_80", "-shared", "-cudart=static", *map(str, objects), "-o", str(lib)]
    proc = subprocess.run(link, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return lib


@pytest.fixture
def fresh_library(monkeypatch):
    """launch's library state reset, restored afterwards."""
    monkeypatch.setattr(launch, "_lib", None)
    monkeypatch.setattr(launch, "_fns", {})
    monkeypatch.setattr(launch, "_checked_devices", set())


@pytest.mark.skipif(sys.platform != "linux", reason="the test builds the Linux library")
def test_generated_launchers_compile_and_load(built_library, fresh_library, monkeypatch):
    monkeypatch.setenv("BNB_CUDA_LIBRARY", str(built_library))
    lib = launch.library()
    assert lib.bnb_cuda_archs() == b"sm_80 compute_80 (PTX)"
    assert lib.bnb_cuda_runtime_version() >= 11000
    for k in tables.all_kernels().values():
        assert launch._function(k).argtypes == launch.argtypes(k)
    nm = subprocess.run(["nm", "-D", "--defined-only", str(built_library)], capture_output=True, text=True)
    exported = {line.split()[-1] for line in nm.stdout.splitlines() if " T " in line}
    assert exported == {k.symbol for k in tables.all_kernels().values()} | {
        "bnb_cuda_error_string", "bnb_cuda_runtime_version", "bnb_cuda_driver_version", "bnb_cuda_archs",
        "bnb_cuda_check_device", "bnb_cuda_managed_alloc", "bnb_cuda_managed_free", "bnb_cuda_managed_prefetch",
        "bnb_cuda_concurrent_managed_access",
    } | set(upstream_api.ENTRY_POINTS)  # fmt: skip
    # The plugin hands this very library to the core as bitsandbytes.functional.lib.
    assert plugin.backend.native_library() is lib
    assert launch.error_string(35) == "CUDA driver version is insufficient for CUDA runtime version"
    if not torch.cuda.is_available():
        # No usable device: the probe reports it instead of crashing.
        assert lib.bnb_cuda_check_device() != 0


def test_missing_library_is_a_clear_error(fresh_library, monkeypatch, tmp_path):
    monkeypatch.setenv("BNB_CUDA_LIBRARY", str(tmp_path / "libnothing.so"))
    with pytest.raises(launch.LibraryError, match="does not exist"):
        launch.library()
    (tmp_path / "libbroken.so").write_text("not a library")
    monkeypatch.setenv("BNB_CUDA_LIBRARY", str(tmp_path / "libbroken.so"))
    with pytest.raises(launch.LibraryError, match="cannot be loaded"):
        launch.library()


def test_backend_is_unavailable_without_gpu_or_library(fresh_library, monkeypatch, tmp_path):
    monkeypatch.setenv("BNB_CUDA_LIBRARY", str(tmp_path / "libnothing.so"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert plugin.backend.is_available() is False
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.warns(RuntimeWarning, match="bitsandbytes-cuda is not used: .*libnothing.so does not exist"):
        assert plugin.backend.is_available() is False
    assert plugin.backend.name == "cuda" and plugin.backend.device_types == ("cuda",)


# ---------------------------------------------------------------------------------------------- launch


@pytest.mark.parametrize(
    ("grid", "block", "shmem", "error", "match"),
    [
        (0, 32, 0, ValueError, r"grid\.x must be in 1\.\."),
        ((1, 70000), 32, 0, ValueError, r"grid\.y"),
        (1, (32, 32, 2), 0, ValueError, "2048 threads"),
        (1, (1, 1, 1, 1), 0, TypeError, "block must be an int or a tuple"),
        (1.0, 32, 0, TypeError, "grid must be"),
        (1, 32, -1, ValueError, "shmem"),
        (1, 32, 0.5, TypeError, "shmem"),
    ],
)
def test_geometry_errors(emulated, grid, block, shmem, error, match):
    A, stats, out = torch.zeros(4, dtype=torch.int8), torch.ones(1), torch.zeros(4)
    with pytest.raises(error, match=match):
        launch.launch("int8_vectorwise_dequant", grid, block, shmem, A, stats, out, 1, 4)


def _dequant_args(**change):
    args = {
        "A": torch.zeros(2, 4, dtype=torch.int8),
        "stats": torch.ones(2),
        "out": torch.zeros(2, 4),
        "rows": 2,
        "cols": 4,
    }
    return list((args | change).values())


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        (
            {"stats": torch.ones(2, dtype=torch.float64)},
            TypeError,
            r"1 \(const float\*\) needs a torch.float32",
        ),
        ({"A": torch.zeros(2, 4, dtype=torch.int16)}, TypeError, "1-byte elements"),
        ({"A": torch.zeros(2, 4, dtype=torch.float32)}, TypeError, "1-byte elements"),
        ({"out": torch.zeros(4, 2).t()}, ValueError, "contiguous"),
        ({"out": torch.zeros(2, 4, device="meta")}, ValueError, "is on meta"),
        ({"rows": 2**63}, ValueError, r"argument 3 \(long long\) must be in"),
        ({"rows": 2.0}, TypeError, "must be an int"),
        ({"cols": True}, TypeError, "must be an int"),
        ({"A": [1, 2]}, TypeError, "tensor or None"),
    ],
)
def test_argument_errors(emulated, change, error, match):
    with pytest.raises(error, match=match):
        launch.launch("int8_vectorwise_dequant", 1, 32, 0, *_dequant_args(**change))


def test_argument_count(emulated):
    with pytest.raises(TypeError, match="takes 5 kernel arguments"):
        launch.launch("int8_vectorwise_dequant", 1, 32, 0, *_dequant_args()[:4])


def test_emulated_launch_runs_the_kernel(emulated):
    A = torch.tensor([[1, -2, 127], [0, 5, -127]], dtype=torch.int8)
    stats = torch.tensor([127.0, 254.0])
    out = torch.full((2, 3), float("nan"))
    launch.launch("int8_vectorwise_dequant", 1, (32,), 0, A, stats, out, 2, 3)
    torch.testing.assert_close(out, A.float() * stats[:, None] / 127, rtol=1e-6, atol=0)


def test_row_striding_covers_rows_beyond_the_grid(emulated):
    # grid.y is capped at 65535: lanes stride the rows, so a grid smaller than the row count still covers all.
    A = torch.randint(-127, 128, (10, 40), generator=torch.Generator().manual_seed(0), dtype=torch.int8)
    stats = torch.rand(10, generator=torch.Generator().manual_seed(1)) * 10
    out = torch.full((10, 40), float("nan"))
    launch.launch("int8_vectorwise_dequant", (2, 3), 32, 0, A, stats, out, 10, 40)
    torch.testing.assert_close(out, A.float() * stats[:, None] * (1 / 127), rtol=1e-6, atol=0)
    assert rows_cols_geometry(100_000, 40) == ((1, 65535), 64)
    assert rows_cols_geometry(3, 1000) == ((4, 3), 256)


def test_real_path_wants_gpu_tensors():
    assert not launch.emulating()
    with pytest.raises(ValueError, match="kernels run on the GPU take cuda tensors"):
        launch.launch("int8_vectorwise_dequant", 1, 32, 0, *_dequant_args())


def test_use_emulator_returns_the_previous_setting():
    assert launch.use_emulator(True) is False
    assert launch.emulating()
    assert launch.use_emulator(False) is True
    assert not launch.emulating()


def test_emulation_without_the_emulator_names_the_extra_that_brings_it(monkeypatch):
    # The emulator is the test extra (bitsandbytes-emu), not a dependency: a plain install lacks it.
    monkeypatch.setitem(sys.modules, "bitsandbytes_emu", None)
    with pytest.raises(ImportError, match=r"kernel emulator installed: pip install 'bitsandbytes-cuda\[test\]'"):
        launch.use_emulator(True)
    assert not launch.emulating()
    # As BNB_CUDA_EMULATE=1 at import sets it, with no module compiled yet: the first launch says the same.
    monkeypatch.setattr(launch, "_emulate", True)
    monkeypatch.setattr(launch, "_emu_modules", {})
    with pytest.raises(ImportError, match=r"bitsandbytes-cuda\[test\]"):
        launch.launch("int8_vectorwise_dequant", 1, 32, 0, *_dequant_args())


def test_checks_admit_parameters_numpy_ints_and_same_width_integers(emulated):
    import numpy as np

    A = torch.nn.Parameter(torch.tensor([[1, -2], [3, 4]], dtype=torch.int8), requires_grad=False)
    stats, out = torch.tensor([127.0, 127.0]), torch.zeros(2, 2)
    launch.launch("int8_vectorwise_dequant", 1, 32, 0, A, stats, out, np.int64(2), 2)  # the full checks convert
    torch.testing.assert_close(out, A.float())
    flags = torch.zeros(3, dtype=torch.bool)  # 1-byte integers of either kind for unsigned char*
    launch.launch("int8_outlier_cols_f32", 1, 32, 0, torch.tensor([[0.0, 5.0, 1.0]]), 2.0, flags, 1, 3)
    assert flags.tolist() == [False, True, False]


class _StubLibrary:
    """Stands for the loaded library where no GPU is: the probe and version entry points give set answers."""

    def __init__(self, probe: int, runtime: int = 13000, driver: int = 13010):
        self.probe, self.runtime, self.driver = probe, runtime, driver

    def bnb_cuda_check_device(self):
        return self.probe

    def bnb_cuda_archs(self):
        return b"sm_80 compute_80 (PTX)"

    def bnb_cuda_runtime_version(self):
        return self.runtime

    def bnb_cuda_driver_version(self):
        return self.driver

    def bnb_cuda_error_string(self, code):
        return {209: b"no kernel image is available for execution on the device"}.get(code, b"unknown error")


def test_device_without_a_usable_image_is_named(fresh_library, monkeypatch):
    monkeypatch.setattr(launch, "_lib", _StubLibrary(probe=209))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: (7, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: "Tesla V100")
    with pytest.raises(launch.LibraryError, match=r"device 0 \(Tesla V100, sm_70\).*no kernel image.*sm_80 compute_80"):
        launch.check_device(0)
    monkeypatch.setattr(launch, "_lib", _StubLibrary(probe=0))
    launch.check_device(0)  # usable: no error, and not probed again
    monkeypatch.setattr(launch, "_lib", _StubLibrary(probe=209))
    launch.check_device(0)


@pytest.mark.parametrize(
    ("runtime", "driver", "ok"), [(13000, 13010, True), (13020, 13000, True), (13000, 12080, False)]
)
def test_driver_older_than_the_runtime_is_named(fresh_library, monkeypatch, runtime, driver, ok):
    monkeypatch.setattr(launch, "_lib", _StubLibrary(probe=35, runtime=runtime, driver=driver))
    if ok:
        plugin.check_driver()
    else:
        with pytest.raises(launch.LibraryError, match=r"driver supports CUDA 12\.8.*built with CUDA 13\.0"):
            plugin.check_driver()
        with pytest.raises(launch.LibraryError, match="update the driver"):
            launch.check_device(0)  # the probe's "insufficient driver" turns into the same message


# ---------------------------------------------------------------------------------------------- real path


class _Recorder:
    """Stands for a generated launcher: records its arguments, returns a set cudaError_t."""

    def __init__(self, rc: int = 0):
        self.rc, self.calls = rc, []

    def __call__(self, *args):
        self.calls.append(args)
        return self.rc


@pytest.fixture
def real_path(fresh_library, monkeypatch):
    """The real launch path with no GPU: device 0 current and already probed, the launcher recorded."""
    monkeypatch.setattr(launch, "_stream_of", None, raising=False)
    monkeypatch.setattr(launch, "_lib", _StubLibrary(probe=0))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    launch._checked_devices.add(0)
    recorder = _Recorder()
    launch._fns["int8_vectorwise_dequant"] = recorder
    return recorder


def test_real_launch_uses_torchs_raw_current_stream(real_path, monkeypatch):
    asked = []
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda i: asked.append(i) or 0x5EED, raising=False)

    def no_stream_objects(*a):
        raise AssertionError("torch.cuda.current_stream builds a Stream per call; the raw query is cheaper")

    monkeypatch.setattr(torch.cuda, "current_stream", no_stream_objects)
    for _ in range(2):
        launch.launch("int8_vectorwise_dequant", (3, 2), 64, 0, None, None, None, 2, 4)  # null pointers
    assert asked == [0, 0]
    assert real_path.calls == [(3, 2, 1, 64, 1, 1, 0, 0x5EED, None, None, None, 2, 4)] * 2


def test_real_launch_without_the_raw_query_uses_the_public_stream_api(real_path, monkeypatch):
    monkeypatch.delattr(torch._C, "_cuda_getCurrentRawStream", raising=False)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda i: type("S", (), {"cuda_stream": 0xBEEF + i})())
    launch.launch("int8_vectorwise_dequant", 1, 32, 0, None, None, None, 2, 4)
    assert real_path.calls == [(1, 1, 1, 32, 1, 1, 0, 0xBEEF, None, None, None, 2, 4)]


def test_real_launch_error_names_the_kernel(real_path, monkeypatch):
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda i: 0, raising=False)
    real_path.rc = 209
    with pytest.raises(RuntimeError, match=r"CUDA kernel int8_vectorwise_dequant \(grid \(1, 1, 1\).*no kernel image"):
        launch.launch("int8_vectorwise_dequant", 1, 32, 0, None, None, None, 2, 4)
