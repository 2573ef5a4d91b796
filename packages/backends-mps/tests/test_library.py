"""The loader, its fallbacks and the diagnostics, on Linux: only torch's MPS entry points are faked.

``torch.mps.compile_shader`` is faked by the emulator compiling the same source (``__METAL_VERSION__``
set as a Mac's compiler would), ``torch.mps.load_metallib`` by fakes that fail or return an emulated
library, ``torch.backends.mps.is_available`` by a constant.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import warnings

import pytest
import torch

import bitsandbytes_emu as emu
from bitsandbytes._reference import int8 as reference
from bitsandbytes_mps import _assemble, library, ops, plugin, tables
from bitsandbytes_mps.ops import int8 as mps_int8

SOURCES = list(tables.by_source())
BF16 = sorted(k for k in tables.all_kernels() if k.endswith("_bf16"))


class FakeCompiler:
    """torch.mps.compile_shader as a Mac with the given Metal language version would run it."""

    def __init__(self, metal_version: int = 310, fail: str | None = None):
        self.metal_version, self.fail, self.calls = metal_version, fail, 0

    def __call__(self, source: str):
        self.calls += 1
        if self.fail:
            raise RuntimeError(self.fail)
        return emu.metal_library(_preprocess(source, self.metal_version), filename="fake.metal")


def _preprocess(source: str, metal_version: int) -> str:
    """The source after Apple's preprocessor with ``__METAL_VERSION__`` set: the emulator reads host names
    before preprocessing, so an `#if`-ed out instance would still be exported there. ``#include`` lines are
    kept for the emulator's own headers."""
    hidden = source.replace("#include", "BNB_KEEP_INCLUDE")
    cxx = shutil.which("g++") or shutil.which("clang++") or pytest.skip("no C preprocessor (g++ or clang++)")
    done = subprocess.run([cxx, "-E", "-P", "-x", "c++", f"-D__METAL_VERSION__={metal_version}", "-"],
                          input=hidden, capture_output=True, text=True, check=True)  # fmt: skip
    return done.stdout.replace("BNB_KEEP_INCLUDE", "#include")


class _Libraries:
    """One library object over several emulated ones, as one metallib holds every source's kernels."""

    def __init__(self, libraries):
        self._libraries = libraries

    def __getattr__(self, name):
        for lib in self._libraries:
            try:
                return getattr(lib, name)
            except AttributeError:
                continue
        raise AttributeError(name)


def _full_library():
    """An emulated library holding every kernel of the tables (what a good metallib loads as)."""
    return _Libraries([emu.metal_library(_assemble.assemble(s, emulated=True), filename=s) for s in SOURCES])


@pytest.fixture
def mac(monkeypatch, tmp_path):
    """A fresh loader on a pretend Mac: compile_shader compiles with MSL 3.1, no metallib installed."""
    emu.skip_unless_available()
    old = library.use_emulator(False)
    library.reset()
    compiler = FakeCompiler()
    monkeypatch.setattr(torch.mps, "compile_shader", compiler, raising=False)
    monkeypatch.delattr(torch.mps, "load_metallib", raising=False)
    monkeypatch.setattr(library, "METALLIB", tmp_path / "bitsandbytes.metallib")
    yield compiler
    library.use_emulator(old)
    library.reset()


def _metallib_file(manifest: dict | None = None):
    """A metallib file with its manifest (by default the manifest of the installed sources)."""
    library.METALLIB.write_bytes(b"MTLB fake")
    text = json.dumps(_assemble.manifest() if manifest is None else manifest)
    library.METALLIB.with_name(_assemble.MANIFEST_NAME).write_text(text)


def _check_int8_ops_match_reference(dtype=torch.float16):
    A = torch.randn(5, 70, dtype=dtype)
    A[1, 3] = 9.0
    got = mps_int8.int8_vectorwise_quant(A, 6.0)
    want = reference.int8_vectorwise_quant(A, 6.0)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


def test_source_wins_without_a_metallib(mac):
    st = library.load()
    assert st.path == "source"
    assert st.sources == dict.fromkeys(SOURCES, "source")
    assert "no prebuilt bitsandbytes.metallib" in st.reasons["metallib"]
    assert st.missing == []
    assert all(library.has(k) for k in tables.all_kernels())
    _check_int8_ops_match_reference(torch.bfloat16)
    assert mac.calls == len(SOURCES)


def test_loaded_once_per_process(mac):
    for _ in range(3):
        library.load()
        _check_int8_ops_match_reference()
    assert mac.calls == len(SOURCES)
    library.reset()
    library.load()
    assert mac.calls == 2 * len(SOURCES)


def test_msl_before_3_1_drops_only_the_bfloat_kernels(mac):
    mac.metal_version = 300
    st = library.load()
    assert st.path == "source"
    assert sorted(st.missing) == BF16
    assert not any(library.has(k) for k in BF16)
    assert set(mps_int8.OPS) <= set(ops.native_ops())  # fp16/fp32 stay native
    _check_int8_ops_match_reference(torch.bfloat16)  # bf16 runs on the reference: same result
    _check_int8_ops_match_reference(torch.float16)


def test_metallib_without_torch_loader_falls_back_to_source(mac):
    _metallib_file()
    st = library.load()
    assert st.path == "source"
    assert "has no torch.mps.load_metallib" in st.reasons["metallib"]


def test_metallib_that_fails_to_load_falls_back_to_source(mac, monkeypatch):
    _metallib_file()

    def broken(path):
        raise RuntimeError("Failed to create library: bad magic")

    monkeypatch.setattr(torch.mps, "load_metallib", broken, raising=False)
    st = library.load()
    assert st.path == "source"
    assert "load_metallib failed: RuntimeError: Failed to create library: bad magic" in st.reasons["metallib"]


def test_stale_metallib_falls_back_to_source(mac, monkeypatch):
    _metallib_file()
    stale = emu.metal_library(
        "#include <metal_stdlib>\nusing namespace metal;\nkernel void old(device float* x [[buffer(0)]]) {}\n"
    )
    monkeypatch.setattr(torch.mps, "load_metallib", lambda path: stale, raising=False)
    st = library.load()
    assert st.path == "source"
    assert f"lacks {len(tables.all_kernels())} kernels" in st.reasons["metallib"]


def test_good_metallib_wins_and_nothing_compiles(mac, monkeypatch):
    _metallib_file()
    seen = []
    full = _full_library()
    monkeypatch.setattr(torch.mps, "load_metallib", lambda path: seen.append(path) or full, raising=False)
    mac.fail = "compile_shader must not run when the metallib loads"
    st = library.load()
    assert st.path == "metallib"
    assert seen == [str(library.METALLIB)]
    assert mac.calls == 0 and st.reasons == {}
    _check_int8_ops_match_reference()


def test_source_that_fails_to_compile_leaves_the_reference(mac):
    mac.fail = "program_source:12:3: error: use of undeclared identifier 'simd_max'"
    st = library.load()
    assert st.path == "reference"
    assert "undeclared identifier 'simd_max'" in st.reasons[SOURCES[0]]
    assert ops.native_ops() == {}
    assert not library.has("int8_row_quant_f16")
    with pytest.raises(library.KernelUnavailable, match="undeclared identifier"):
        library.dispatch("int8_vectorwise_dequant", torch.ones(1, dtype=torch.int8), torch.ones(1),
                         torch.empty(1), 1.0, 1, 1, threads=1, group_size=1)  # fmt: skip
    _check_int8_ops_match_reference()  # an op called anyway takes the reference


def test_torch_without_compile_shader_leaves_the_reference(mac, monkeypatch):
    monkeypatch.delattr(torch.mps, "compile_shader")
    st = library.load()
    assert st.path == "reference"
    assert "has no torch.mps.compile_shader (needs >= 2.7)" in st.reasons[SOURCES[0]]


def test_the_hot_path_never_synchronizes(mac, monkeypatch):
    def forbidden():
        raise AssertionError("synchronize called in the hot path")

    monkeypatch.setattr(torch.mps, "synchronize", forbidden)
    library.load()
    mps_int8.int8_vectorwise_dequant(torch.ones(3, 4, dtype=torch.int8), torch.ones(3))
    mps_int8.int8_mm_dequant(torch.ones(3, 4, dtype=torch.int32), torch.ones(3), torch.ones(4), bias=torch.ones(4))
    mps_int8.int8_vectorwise_quant(torch.randn(3, 40, dtype=torch.float16))


# ------------------------------------------------------------------------------------------- plugin


def test_emulation_without_the_emulator_names_the_extra_that_brings_it(monkeypatch):
    # The emulator is the test extra (bitsandbytes-emu), not a dependency: a plain install lacks it.
    monkeypatch.setitem(sys.modules, "bitsandbytes_emu", None)
    old = library.emulating()
    with pytest.raises(ImportError, match=r"kernel emulator installed: pip install 'bitsandbytes-mps\[test\]'"):
        library.use_emulator(True)
    assert library.emulating() == old


@pytest.mark.parametrize("available", [True, False])
def test_is_available_follows_torch(monkeypatch, available):
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: available)
    assert plugin.backend.is_available() is available


def test_load_registers_the_native_ops_for_mps(mac, monkeypatch):
    seen = []
    monkeypatch.setattr(ops, "register_all", lambda device_type="mps": seen.append(device_type))
    plugin.backend.load()
    assert seen == ["mps"]


def test_diagnostics_say_which_path_won_and_why(mac):
    _metallib_file()
    info = plugin.backend.diagnostics()
    assert info["kernels loaded from"] == "source"
    assert info["torch"] == torch.__version__
    assert info["torch.mps.compile_shader"] is True and info["torch.mps.load_metallib"] is False
    assert "has no torch.mps.load_metallib" in info["why not the metallib"]
    assert info["kernels"] == f"{len(tables.all_kernels())} of {len(tables.all_kernels())}"
    assert set(info["ops on Metal kernels"].split(", ")) == set(ops.all_ops())
    assert info["ops on the reference"] == "none"
    assert "macOS" in info


def test_diagnostics_when_nothing_compiles(mac):
    mac.fail = "error: unknown type name 'bfloat'"
    info = plugin.backend.diagnostics()
    assert info["kernels loaded from"] == "reference"
    assert info["ops on Metal kernels"] == "none"
    assert "unknown type name 'bfloat'" in info[f"why not {SOURCES[0]}"]
    assert info[f"source {SOURCES[0]}"] == "reference"


def test_diagnostics_list_absent_bfloat_kernels(mac):
    mac.metal_version = 300
    info = plugin.backend.diagnostics()
    assert sorted(info["kernels absent from the library"].split(", ")) == BF16


# ----------------------------------------------------------------------------------------- dispatch


def _dequant_args(**change):
    args = {"A": torch.ones(2, 3, dtype=torch.int8), "stats": torch.ones(2), "out": torch.empty(2, 3),
            "scale": 0.5, "rows": 2, "cols": 3}  # fmt: skip
    args.update(change)
    return list(args.values())


def test_dispatch_runs_the_kernel(emulated):
    args = _dequant_args()
    library.dispatch("int8_vectorwise_dequant", *args, threads=(3, 2), group_size=(2, 1))
    torch.testing.assert_close(args[2], torch.full((2, 3), 0.5), rtol=0, atol=0)


def test_dispatch_binds_an_int_given_for_a_float_as_a_float(emulated):
    args = _dequant_args(scale=2)
    library.dispatch("int8_vectorwise_dequant", *args, threads=(3, 2), group_size=(3, 2))
    torch.testing.assert_close(args[2], torch.full((2, 3), 2.0), rtol=0, atol=0)


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        ({"A": torch.ones(2, 3, dtype=torch.int16)}, TypeError, "argument 0 (device const char* A) cannot take"),
        ({"stats": torch.ones(2, dtype=torch.float16)}, TypeError, "argument 1 (device const float* stats)"),
        ({"out": torch.empty(3, 2).t()}, ValueError, "argument 2 (out) must be contiguous"),
        ({"stats": torch.ones(0)}, ValueError, "argument 1 (stats) is empty"),
        ({"rows": 2.0}, TypeError, "argument 4 (constant long& rows) must be a Python int"),
        ({"cols": True}, TypeError, "argument 5 (constant long& cols) must be a Python int"),
        ({"scale": torch.tensor(1.0)}, TypeError, "argument 3 (constant float& scale) must be a Python float"),
        ({"cols": 2**63}, ValueError, "argument 5 (constant long& cols) is out of range"),
    ],
)
def test_dispatch_checks_arguments_against_the_table(emulated, change, error, message):
    with pytest.raises(error, match=__import__("re").escape(message)):
        library.dispatch("int8_vectorwise_dequant", *_dequant_args(**change), threads=(3, 2), group_size=(3, 2))


def test_dispatch_checks_count_and_launch_sizes(emulated):
    with pytest.raises(TypeError, match="takes 6 arguments"):
        library.dispatch("int8_vectorwise_dequant", *_dequant_args()[:5], threads=6, group_size=6)
    with pytest.raises(ValueError, match="declared for at most"):
        library.dispatch("int8_vectorwise_dequant", *_dequant_args(), threads=(6, 1), group_size=(64, 32))
    with pytest.raises(ValueError, match="same number of dimensions"):
        library.dispatch("int8_vectorwise_dequant", *_dequant_args(), threads=(6, 1), group_size=6)
    with pytest.raises(ValueError, match="threads must be a positive int"):
        library.dispatch("int8_vectorwise_dequant", *_dequant_args(), threads=0, group_size=6)
    with pytest.raises(KeyError, match="no kernel named 'int8_vectorwise_dequan'"):
        library.dispatch("int8_vectorwise_dequan", threads=1, group_size=1)


def test_emulated_loader_loads_every_source(emulated):
    assert emulated.path == "emulated"
    assert emulated.reasons == {} and emulated.missing == [] and emulated.dropped == {}


def test_paged_state_is_plain_memory_on_unified_memory():
    # The plugin registers these for "mps": a paged optimizer's state is an ordinary zeroed tensor there.
    from bitsandbytes_mps import plugin

    t = plugin._allocate_unified((3, 4), torch.float16, torch.device("cpu"))
    assert t.shape == (3, 4) and t.dtype == torch.float16 and not t.any()
    assert plugin._prefetch_unified(t, None) is None and not t.any()


# ------------------------------------------------------------------------- the metallib's manifest


def _loader_that_must_not_run(path):
    raise AssertionError("a metallib whose manifest does not match must not be loaded")


@pytest.mark.parametrize(
    ("manifest", "reason"),
    [
        ({"format": 1, "sources": {**_assemble.manifest()["sources"], SOURCES[0]: "0" * 64}},
         f"was built from other sources than those installed ({SOURCES[0]} differ)"),
        ({"format": 1, "sources": {}}, f"({', '.join(SOURCES)} differ)"),
        ({"format": 99, "sources": _assemble.manifest()["sources"]}, "is not a format-1 manifest"),
        (["not", "a", "mapping"], "is not a format-1 manifest"),
    ],
)  # fmt: skip
def test_metallib_built_from_other_sources_is_never_bound(mac, monkeypatch, manifest, reason):
    _metallib_file(manifest)
    monkeypatch.setattr(torch.mps, "load_metallib", _loader_that_must_not_run, raising=False)
    st = library.load()
    assert st.path == "source"
    assert reason in st.reasons["metallib"]
    _check_int8_ops_match_reference()


def test_metallib_without_a_manifest_is_never_bound(mac, monkeypatch):
    _metallib_file()
    library.METALLIB.with_name(_assemble.MANIFEST_NAME).unlink()
    monkeypatch.setattr(torch.mps, "load_metallib", _loader_that_must_not_run, raising=False)
    st = library.load()
    assert st.path == "source"
    assert "has no bitsandbytes.metallib.json beside it (another build made it)" in st.reasons["metallib"]


def test_unreadable_manifest_is_a_recorded_fallback(mac, monkeypatch):
    _metallib_file()
    library.METALLIB.with_name(_assemble.MANIFEST_NAME).write_text("{not json")
    monkeypatch.setattr(torch.mps, "load_metallib", _loader_that_must_not_run, raising=False)
    st = library.load()
    assert st.path == "source"
    assert "bitsandbytes.metallib.json cannot be read: JSONDecodeError" in st.reasons["metallib"]


# ------------------------------------------------------------- pipelines that cannot run a kernel


class _Pipeline:
    """A kernel as torch returns it, with the pipeline properties and call behaviour a test sets."""

    def __init__(self, kernel, limit=None, width=None, fail=None):
        self._kernel, self._limit, self._width, self._fail = kernel, limit, width, fail
        self.calls = 0

    @property
    def max_threads_per_threadgroup(self):
        return self._kernel.max_threads_per_threadgroup if self._limit is None else self._limit

    @property
    def thread_execution_width(self):
        return self._kernel.thread_execution_width if self._width is None else self._width

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self._fail:
            raise self._fail
        return self._kernel(*args, **kwargs)


class _PipelineLibrary:
    def __init__(self, inner, pipelines):
        self._inner, self._pipelines = inner, pipelines

    def __getattr__(self, name):
        kernel = getattr(self._inner, name)
        make = self._pipelines.get(name)
        return make(kernel) if make else kernel


@pytest.fixture
def pipelines(mac, monkeypatch):
    """kernel name -> a function making its _Pipeline from the compiled kernel; compile_shader applies it."""
    made: dict = {}
    monkeypatch.setattr(torch.mps, "compile_shader", lambda source: _PipelineLibrary(mac(source), made))
    return made


def test_a_pipeline_too_small_for_the_launch_keeps_its_op_on_the_reference(pipelines):
    pipelines["int8_row_quant_f16"] = lambda k: _Pipeline(k, limit=128)
    st = library.load()
    want = tables.get("int8_row_quant_f16").max_threads
    why = f"its pipeline allows 128 threads per threadgroup, and the host launches it with up to {want}"
    assert st.dropped == {"int8_row_quant_f16": why}
    assert not library.has("int8_row_quant_f16") and library.has("int8_row_quant_f32")
    _check_int8_ops_match_reference(torch.float16)  # served by the reference
    info = plugin.backend.diagnostics()
    assert "allows 128 threads" in info["dropped int8_row_quant_f16"]


def test_a_pipeline_of_another_simd_width_keeps_its_op_on_the_reference(pipelines):
    pipelines["int8_vectorwise_dequant"] = lambda k: _Pipeline(k, width=64)
    st = library.load()
    assert st.dropped == {"int8_vectorwise_dequant": "its pipeline's SIMD width is 64; the kernels assume 32"}
    A, stats = torch.randint(-127, 128, (3, 5), dtype=torch.int8), torch.rand(3) * 100
    got = ops.falling_back("int8_vectorwise_dequant", mps_int8.int8_vectorwise_dequant)(A, stats)
    torch.testing.assert_close(got, reference.int8_vectorwise_dequant(A, stats), rtol=0, atol=0)


# ------------------------------------------------------------------ a dispatch that raises at run time


def test_a_kernel_whose_dispatch_raises_is_dropped_and_the_call_reruns_on_the_reference(pipelines):
    failing = {}

    def make(kernel):
        failing["p"] = _Pipeline(kernel, fail=ValueError("Threadgroup size exceeds 256 limit"))
        return failing["p"]

    pipelines["int8_vectorwise_dequant"] = make
    library.load()
    op = ops.falling_back("int8_vectorwise_dequant", mps_int8.int8_vectorwise_dequant)
    A, stats = torch.randint(-127, 128, (4, 6), dtype=torch.int8), torch.rand(4) * 100
    want = reference.int8_vectorwise_dequant(A, stats)
    with pytest.warns(RuntimeWarning, match="int8_vectorwise_dequant failed and is dropped"):
        got = op(A, stats)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert failing["p"].calls == 1
    reason = library.status().dropped["int8_vectorwise_dequant"]
    assert reason == "dispatching it raised ValueError: Threadgroup size exceeds 256 limit"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once
        torch.testing.assert_close(op(A, stats), want, rtol=0, atol=0)
    assert failing["p"].calls == 1  # later calls go straight to the reference
    assert plugin.backend.diagnostics()["dropped int8_vectorwise_dequant"] == reason


def test_an_optimizer_step_whose_last_kernel_fails_is_not_applied_twice(pipelines):
    """Lion with max_unorm: norm pass, step, then the norm total. If the total's dispatch fails after the
    step ran, rerunning the whole call on the reference would step twice; the op must not let that happen."""
    from bitsandbytes._reference import REFERENCE
    from bitsandbytes_mps.ops import optimizers as mps_opt

    pipelines["optimizer_32bit_norm_total"] = lambda k: _Pipeline(k, fail=RuntimeError("command encoder lost"))
    library.load()
    torch.manual_seed(0)
    g, p, s1 = torch.randn(300), torch.randn(300), torch.randn(300)
    unorm = torch.tensor([0.5])
    args = ("lion", 1.0, 0.0, 0.9, 0.99, 0.0, 0.0, 1e-8, 0.0, 3, 1e-3, 1.0, False)

    def step(fn, p, s1, unorm):
        fn(args[0], g, p, s1, None, unorm, *args[1:])
        return p, s1, unorm

    want = step(REFERENCE["optimizer_update_32bit"], p.clone(), s1.clone(), unorm.clone())
    op = ops.falling_back("optimizer_update_32bit", mps_opt.optimizer_update_32bit)
    with pytest.warns(RuntimeWarning, match="optimizer_32bit_norm_total failed"):
        got = step(op, p.clone(), s1.clone(), unorm.clone())
    for gt, wt in zip(got, want, strict=True):
        torch.testing.assert_close(gt, wt, rtol=1e-6, atol=1e-7)


def test_in_emulation_a_failing_dispatch_is_raised_not_hidden(emulated, monkeypatch):
    boom = _Pipeline(library._kernels["int8_vectorwise_dequant"], fail=IndexError("emulated out-of-bounds read"))
    monkeypatch.setitem(library._kernels, "int8_vectorwise_dequant", boom)
    with pytest.raises(IndexError, match="out-of-bounds"):
        library.dispatch("int8_vectorwise_dequant", *_dequant_args(), threads=6, group_size=6)
    assert library.status().dropped == {}


def test_diagnostics_report_fast_math(mac, monkeypatch):
    monkeypatch.setenv("PYTORCH_MPS_FAST_MATH", "1")
    assert plugin.backend.diagnostics()["PYTORCH_MPS_FAST_MATH"].startswith("1 (fast math")
    monkeypatch.setenv("PYTORCH_MPS_FAST_MATH", "0")
    assert plugin.backend.diagnostics()["PYTORCH_MPS_FAST_MATH"] == "unset (safe math)"
    monkeypatch.delenv("PYTORCH_MPS_FAST_MATH")
    assert plugin.backend.diagnostics()["PYTORCH_MPS_FAST_MATH"] == "unset (safe math)"
