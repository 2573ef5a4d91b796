"""Backend plugin discovery: every kind of plugin, every way one can be broken, and the env switches.

Plugins are installed as distributions (dist-info on sys.path) and exercised in fresh interpreters,
because loading one changes the process-wide torch dispatcher.
"""

from __future__ import annotations

import pytest
import torch
from plugin_dist import make_dist, run_python, run_snippet

import bitsandbytes
from bitsandbytes.backends import API_VERSION, Backend
from bitsandbytes.backends.discovery import selection
from bitsandbytes.backends.plugin import parse_api_version, validate

DIST, DIST_VERSION = "bnb-plugins-test", "2.3"

PLUGINS = """
import torch
from bitsandbytes.backends import Backend

CALLS = []


def _register(op, device, fn=lambda *args: None):
    torch.library.register_kernel(f"bitsandbytes::{op}", device)(fn)


def _dequant(A, stats):
    CALLS.append(tuple(A.shape))
    return A.float() * stats.reshape(*A.shape[:-1], 1) / 127


def good():  # upstream's convention: a callable that registers kernels
    _register("int8_vectorwise_dequant", "cpu", _dequant)


# A newer minor API version is fine: only the major has to match.
obj = Backend("obj", ["cpu"], api_version="1.7", load=lambda: _register("gemv_4bit.out", "cpu"),
              diagnostics=lambda: {"answer": 42})
# Older minors keep loading: 1.1 (native_library=) and 1.2 (the kit) only added.
v10 = Backend("v10", ["cpu"], api_version="1.0", load=lambda: _register("int8_scaled_mm", "cpu"))
v11 = Backend("v11", ["cpu"], api_version="1.1", load=lambda: _register("int8_mm_dequant", "cpu"))


def raising():
    _register("quantize_4bit", "cpu")  # must be undone when the plugin fails afterwards
    raise ValueError("kaboom")


oldapi = Backend("oldapi", ["cpu"], api_version="0.3")
newapi = Backend("newapi", ["cpu"], api_version="2.0")


def unknown():
    _register("dequantize_blockwise", "cpu")
    _register("not_an_op", "cpu")


notcallable = 42
stray = Backend("stray", ["cuda"], api_version="1.0", load=lambda: _register("int8_double_quant", "cpu"))


def _must_not_load():
    raise AssertionError("load() of an unavailable backend was called")


away = Backend("away", ["cuda"], api_version="1.0", is_available=lambda: False, load=_must_not_load)
"""

NAMES = ("good", "obj", "v10", "v11", "raising", "oldapi", "newapi", "unknown", "notcallable", "stray", "away")
FAILING = ("raising", "oldapi", "newapi", "unknown", "notcallable", "stray")
# Select exactly this file's plugins: a backend installed in the environment (bitsandbytes-cpu, once the
# tests session has built it) must not change what these tests see.
ONLY_OURS = {"BNB_BACKENDS": ",".join(NAMES)}


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    entry_points = {name: f"bnb_plugins_test:{name}" for name in NAMES}
    return make_dist(tmp_path_factory.mktemp("site"), DIST, DIST_VERSION, entry_points, {"bnb_plugins_test": PLUGINS})


IMPORT_AND_REPORT = """
import warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import bitsandbytes
import torch
out = None
if torch._C._dispatch_has_kernel_for_dispatch_key("bitsandbytes::int8_vectorwise_dequant", "CPU"):
    A = torch.tensor([[127, -127, 0], [1, 2, 3]], dtype=torch.int8)
    out = torch.ops.bitsandbytes.int8_vectorwise_dequant(A, torch.tensor([2.0, 127.0])).tolist()
import sys
emit({
    "records": {r.name: {"status": r.status, "reason": r.reason, "kind": r.kind, "dist": r.dist,
                         "version": r.dist_version, "devices": list(r.device_types),
                         "kernels": [list(k) for k in r.kernels], "diagnostics": r.diagnostics()}
                for r in bitsandbytes.backends.records()},
    "coverage": bitsandbytes.backends.coverage(),
    "warnings": [[w.category.__name__, str(w.message)] for w in caught],
    "calls": sys.modules["bnb_plugins_test"].CALLS if "bnb_plugins_test" in sys.modules else None,
    "out": out,
})
"""


def _load_warnings(result):
    return [msg for cat, msg in result["warnings"] if cat == "BackendLoadWarning"]


def test_every_plugin_kind_and_failure(site):
    result = run_snippet(IMPORT_AND_REPORT, site, **ONLY_OURS)
    recs = {name: r for name, r in result["records"].items() if r["dist"] == DIST}
    assert set(recs) == set(NAMES)
    assert {n for n, r in recs.items() if r["status"] == "failed"} == set(FAILING)
    assert all(r["dist"] == DIST and r["version"] == DIST_VERSION for r in recs.values())

    # The callable plugin: loaded, its device inferred from what it registered, and its kernel runs.
    assert recs["good"] == {**recs["good"], "status": "loaded", "kind": "callable", "devices": ["cpu"]}
    assert recs["good"]["kernels"] == [["int8_vectorwise_dequant", "cpu"]]
    assert result["out"] == [[2.0, -2.0, 0.0], [1.0, 2.0, 3.0]]
    assert result["calls"] == [[2, 3]]

    # The Backend object: loaded with a newer minor API, its overload kernel attributed to it.
    assert recs["obj"]["status"] == "loaded" and recs["obj"]["kind"] == "Backend"
    assert recs["obj"]["kernels"] == [["gemv_4bit.out", "cpu"]]
    assert recs["obj"]["diagnostics"] == {"answer": 42}

    for name, op in (("v10", "int8_scaled_mm"), ("v11", "int8_mm_dequant")):
        assert recs[name]["status"] == "loaded" and recs[name]["kernels"] == [[op, "cpu"]]

    # Unavailable is a skip, not an error, and load() is never called.
    assert recs["away"]["status"] == "skipped" and "not available" in recs["away"]["reason"]

    reasons = {n: recs[n]["reason"] for n in FAILING}
    assert "ValueError: kaboom" in reasons["raising"] and "bnb_plugins_test.py" in reasons["raising"]
    for name, theirs, fix in (
        ("oldapi", "0.3", f"pip install -U {DIST}"),
        ("newapi", "2.0", "pip install -U bitsandbytes"),
    ):
        assert theirs in reasons[name] and API_VERSION in reasons[name] and fix in reasons[name]
    assert "bitsandbytes::not_an_op" in reasons["unknown"]
    assert "not_an_op" not in " ".join(reasons[n] for n in FAILING if n != "unknown")
    assert "is a int," in reasons["notcallable"] and "Backend" in reasons["notcallable"]
    assert "cpu" in reasons["stray"] and "cuda" in reasons["stray"]
    assert all(recs[n]["kernels"] == [] for n in FAILING)

    # One warning per broken plugin, naming it and its distribution; none for the good or skipped ones.
    warned = _load_warnings(result)
    assert len(warned) == len(FAILING)
    for name in FAILING:
        assert sum(f"'{name}'" in w and DIST in w for w in warned) == 1

    # Native exactly where a loaded plugin registered; a failed plugin's registrations were undone.
    cov = result["coverage"]
    native = {(op, dev) for op, cells in cov.items() for dev, state in cells.items() if state == "native"}
    loaded = {"int8_vectorwise_dequant", "gemv_4bit.out", "int8_scaled_mm", "int8_mm_dequant"}
    assert native == {(op, "cpu") for op in loaded}
    assert cov["gemv_4bit"]["cpu"] != "native"  # the default overload is a different dispatcher entry
    assert cov["int8_vectorwise_dequant"]["cuda"] != "native"


def test_strict_mode_makes_a_broken_plugin_fatal(site):
    proc = run_python(["-c", "import bitsandbytes"], site, BNB_STRICT_BACKENDS="1", **ONLY_OURS)
    assert proc.returncode != 0
    assert "BackendLoadError" in proc.stderr
    for name in FAILING:
        assert f"'{name}'" in proc.stderr
    assert "kaboom" in proc.stderr


def test_selection_by_name_skips_the_rest_without_importing_them(site):
    result = run_snippet(IMPORT_AND_REPORT, site, BNB_BACKENDS="good, nosuch")
    recs = result["records"]
    assert recs["good"]["status"] == "loaded"
    for name in set(NAMES) - {"good"}:
        assert recs[name]["status"] == "skipped" and "BNB_BACKENDS" in recs[name]["reason"]
    warned = _load_warnings(result)
    assert len(warned) == 1 and "nosuch" in warned[0] and "good" in warned[0]
    assert result["out"] == [[2.0, -2.0, 0.0], [1.0, 2.0, 3.0]]


def test_selection_none_loads_nothing_even_in_strict_mode(site):
    result = run_snippet(IMPORT_AND_REPORT, site, BNB_BACKENDS="none", BNB_STRICT_BACKENDS="1")
    assert {r["status"] for r in result["records"].values()} == {"skipped"}
    assert result["calls"] is None  # the plugin module was never imported
    assert result["warnings"] == []
    assert all(state != "native" for cells in result["coverage"].values() for state in cells.values())


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, None), ("", None), ("  ", None), ("none", set()), ("cpu", {"cpu"}), (" cpu, mps ,", {"cpu", "mps"})],
)
def test_selection_parsing(value, expected):
    assert selection(value) == expected


def test_public_names():
    assert bitsandbytes.backends.Backend is Backend
    # 1.1 added Backend(native_library=...), 1.2 bitsandbytes.backends.kit; 1.0 and 1.1 backends still load
    assert parse_api_version(API_VERSION) == (1, 2)
    assert bitsandbytes.backends.kit.register is not None
    assert bitsandbytes.features >= {"multi_backend"}
    assert "cpu" in bitsandbytes.supported_torch_devices


@pytest.mark.parametrize("bad", ["1", "1.0.0", "v1.0", 1.0, None, ""])
def test_api_version_must_be_major_dot_minor(bad):
    with pytest.raises(ValueError, match="api_version"):
        parse_api_version(bad)


def test_backend_object_validation():
    assert Backend("x", "cpu", api_version="1.0").device_types == ("cpu",)
    validate(Backend("x", ["cpu", "cuda"], api_version="1.0"))
    for kwargs, attr in [
        ({"name": "", "device_types": ["cpu"]}, "name"),
        ({"name": 3, "device_types": ["cpu"]}, "name"),
        ({"name": "x", "device_types": []}, "device_types"),
        ({"name": "x", "device_types": ["cuda:0"]}, "device_types"),
        ({"name": "x", "device_types": ["gpu"]}, "device_types"),
        ({"name": "x", "device_types": [torch.device("cpu")]}, "device_types"),
    ]:
        with pytest.raises(ValueError, match=attr):
            validate(Backend(**kwargs, api_version="1.0"))
    with pytest.raises(ValueError, match="api_version"):
        validate(Backend("x", ["cpu"], api_version="one"))


def test_backend_defaults_and_callables():
    plain = Backend("x", ["cpu"], api_version="1.0")
    assert plain.is_available() is True and plain.diagnostics() == {} and plain.load() is None
    calls = []
    b = Backend(
        "x",
        ["cpu"],
        api_version="1.0",
        load=lambda: calls.append("load"),
        is_available=lambda: 0,
        diagnostics=lambda: [("k", "v")],
    )
    b.load()
    assert calls == ["load"] and b.is_available() is False and b.diagnostics() == {"k": "v"}
