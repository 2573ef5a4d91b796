"""Plugin faults that tests/test_backends.py does not cover: a plugin module that raises on import, a
half-installed plugin (distribution metadata whose module is missing), an entry point naming a missing
attribute, a Backend whose ``is_available()`` or ``load()`` raises.

For each: ``import bitsandbytes`` succeeds, a working plugin next to it still loads, the problem is
warned about exactly once and shown by the diagnostics, and strict mode makes it fatal.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # plugin_dist lives in tests/
from plugin_dist import make_dist, run_python, run_snippet

FAULTY = """
import torch
from bitsandbytes.backends import Backend


def _register(op):
    torch.library.register_kernel(f"bitsandbytes::{op}", "cpu")(lambda *args: None)


def good():
    torch.library.register_kernel("bitsandbytes::int8_vectorwise_dequant", "cpu")(
        lambda A, stats: A.float() * stats.reshape(-1, 1) / 127
    )


def _available_raises():
    raise OSError("driver probe exploded")


def _load_raises():
    _register("dequantize_4bit")  # must be undone when load() fails afterwards
    raise RuntimeError("load-time kaboom")


availboom = Backend("availboom", ["cpu"], api_version="1.0", is_available=_available_raises)
loadboom = Backend("loadboom", ["cpu"], api_version="1.0", load=_load_raises)
"""
IMPORTBOOM = """
raise RuntimeError("import-time kaboom")
"""

# name -> (entry point target, what its failure reason must mention)
FAULTS = {
    "importboom": ("bnb_faults_importboom:plugin", "import-time kaboom"),
    "halfinstalled": ("bnb_faults_not_installed:plugin", "bnb_faults_not_installed"),
    "noattr": ("bnb_faults:no_such_attr", "no_such_attr"),
    "availboom": ("bnb_faults:availboom", "driver probe exploded"),
    "loadboom": ("bnb_faults:loadboom", "load-time kaboom"),
}
FAULT_CASES = len(FAULTS)
ONLY_OURS = {"BNB_BACKENDS": ",".join(["good", *FAULTS])}


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    root = tmp_path_factory.mktemp("site")
    eps = {name: target for name, (target, _) in FAULTS.items() if name != "halfinstalled"}
    make_dist(root, "bnb-faults", "1.0", {"good": "bnb_faults:good", **eps},
              {"bnb_faults": FAULTY, "bnb_faults_importboom": IMPORTBOOM})  # fmt: skip
    # Half-installed: pip's metadata is there, the module it points at is not.
    make_dist(root, "bnb-half-installed", "0.1", {"halfinstalled": FAULTS["halfinstalled"][0]}, {})
    return root


REPORT = """
import warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import bitsandbytes
    import bitsandbytes.backends
    again = bitsandbytes.backends.records()  # asking again must not retry or re-warn
import torch
import bitsandbytes.functional as F
A = torch.tensor([[127, -127]], dtype=torch.int8)
emit({
    "records": {r.name: [r.status, r.reason, [list(k) for k in r.kernels]] for r in again},
    "warnings": [str(w.message) for w in caught if type(w.message).__name__ == "BackendLoadWarning"],
    "out": torch.ops.bitsandbytes.int8_vectorwise_dequant(A, torch.tensor([127.0])).tolist(),
    "dequantize_4bit_cpu_kernel": torch._C._dispatch_has_kernel_for_dispatch_key(
        "bitsandbytes::dequantize_4bit", "CPU"),
})
"""


def test_faulty_plugins_never_break_import(site):
    result = run_snippet(REPORT, site, **ONLY_OURS)
    recs = result["records"]
    assert recs["good"][0] == "loaded"
    assert result["out"] == [[127.0, -127.0]]  # the good plugin's kernel is the one that ran
    for name, (_, mention) in FAULTS.items():
        status, reason, kernels = recs[name]
        assert status == "failed", (name, status, reason)
        assert mention in reason, (name, reason)
        assert kernels == []
        assert sum(f"'{name}'" in w for w in result["warnings"]) == 1, (name, result["warnings"])
    assert len(result["warnings"]) == FAULT_CASES
    # loadboom's registration was rolled back: no backend kernel is left behind for dequantize_4bit.
    assert result["dequantize_4bit_cpu_kernel"] is False


def test_diagnostics_show_each_faulty_plugin(site):
    proc = run_python(["-m", "bitsandbytes"], site, **ONLY_OURS)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out  # the report runs to the end, and its exit status flags the problems
    assert f"{FAULT_CASES} problem(s)" in out, out
    problems = out[out.index("problem(s)") :]
    for name, (_, mention) in FAULTS.items():
        line = next(ln for ln in problems.splitlines() if f"backend '{name}' failed" in ln)
        assert mention in line, (name, line)


def test_strict_mode_fails_loudly(site):
    proc = run_python(["-c", "import bitsandbytes"], site, BNB_STRICT_BACKENDS="1", **ONLY_OURS)
    assert proc.returncode != 0
    assert "BackendLoadError" in proc.stderr
    for name, (_, mention) in FAULTS.items():
        assert f"'{name}'" in proc.stderr and mention in proc.stderr, name
