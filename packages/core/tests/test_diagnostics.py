"""``python -m bitsandbytes``: the coverage matrix, the report, the self-test and their exit codes."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import warnings
from importlib import metadata
from pathlib import Path

import pytest
import torch
from plugin_dist import make_dist, run_python

from bitsandbytes._ops import OPS
from bitsandbytes._reference import REFERENCE
from bitsandbytes.backends import MissingBackendWarning, devices, discovery, dispatch, records
from bitsandbytes.backends.discovery import GROUP
from bitsandbytes.diagnostics.main import main
from bitsandbytes.diagnostics.report import render, table
from bitsandbytes.diagnostics.selftest import run_self_test

TOY = Path(__file__).resolve().parents[3] / "examples" / "toy_backend"


@pytest.fixture
def cpu_kernels():
    """Register CPU kernels for the duration of a test, then remove them from the dispatcher."""
    lib = torch.library.Library("bitsandbytes", "IMPL")
    yield lambda op, fn: lib.impl(op, fn, "CPU")
    lib._destroy()


def installed_kernels() -> set[tuple[str, str]]:
    """(op, device type) of every kernel the backends installed in this environment registered."""
    return {kernel for r in records() for kernel in r.kernels}


@pytest.fixture
def fake_records():
    """Let a test replace the process' backend records; put the real ones back afterwards."""
    saved = list(discovery.RECORDS)
    yield discovery.RECORDS
    discovery.RECORDS[:] = saved


def test_coverage_is_read_from_the_dispatcher(cpu_kernels):
    def expected(native):
        return {
            op: {d: "native" if (op, d) in native else ("reference" if op in REFERENCE else "missing") for d in devs}
            for op in OPS
        }

    devs = ("cpu", "cuda", "mps")
    base = installed_kernels()
    assert dispatch.coverage(devs) == expected(base)
    cpu_kernels("dequantize_4bit.out", lambda *args: None)
    cpu_kernels("int8_vectorwise_dequant", lambda *args: None)
    added = {("dequantize_4bit.out", "cpu"), ("int8_vectorwise_dequant", "cpu")}
    assert dispatch.coverage(devs) == expected(base | added)


def test_dispatch_keys_of_device_types():
    assert [dispatch.dispatch_key(d) for d in ("cpu", "cuda", "mps", "xpu", "hpu")] == [
        "CPU",
        "CUDA",
        "MPS",
        "XPU",
        "HPU",
    ]
    renamed = torch._C._get_privateuse1_backend_name()
    assert dispatch.dispatch_key(renamed) == "PrivateUse1" and dispatch.device_type("PrivateUse1") == renamed
    assert dispatch.device_type("CUDA") == "cuda"


def test_table_aligns_columns():
    lines = table(("op", "cpu", "note"), [("quantize_4bit", "native", "x"), ("q", "reference", "a long note")])
    assert lines[0] == "  op             cpu        note"
    assert lines[1] == "  quantize_4bit  native     x"
    assert lines[2] == "  q              reference  a long note"


def test_self_test_passes_on_the_reference():
    results = run_self_test(["cpu"])
    assert [r.name for r in results] == ["4-bit", "8-bit blockwise", "int8"]
    assert all(r.ok for r in results), [r.detail for r in results]
    native_here = {op for op, device in installed_kernels() if device == "cpu"}
    assert all(set(r.native) <= native_here for r in results)


def test_self_test_catches_a_native_kernel_that_disagrees_with_the_reference(cpu_kernels, capsys):
    # Off by 0.1%: inside the int8 format's error bound, so only the comparison with the reference sees it.
    cpu_kernels("int8_vectorwise_dequant", lambda A, stats: A.float() * stats.reshape(-1, 1) / 127 * 1.001)
    int8 = {r.name: r for r in run_self_test(["cpu"])}["int8"]
    # (An installed native backend may serve the group's other op too.)
    assert int8.ok is False and "int8_vectorwise_dequant" in int8.native
    assert "differs from the reference" in int8.detail

    assert main(["--self-test"]) == 1
    out = capsys.readouterr().out
    assert re.search(r"cpu\s+int8\s+FAILED\s+native: [\w, ]*int8_vectorwise_dequant", out)
    assert re.search(r"int8_vectorwise_dequant\s+native( \([\w.-]+\))?\s+reference", out)


def test_report_of_this_process_is_clean(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert f"torch     {torch.__version__}" in out
    assert "python    " + ".".join(map(str, sys.version_info[:3])) in out
    cell = r"(reference|native \([\w.-]+\))"
    for op in OPS:
        assert re.search(rf"^  {re.escape(op)}\s+{cell}\s+{cell}\s+{cell}\s+{cell}$", out, re.M), op
    assert "No problems found." in out


def test_missing_accelerator_backend_names_the_extra(monkeypatch, fake_records, tmp_path):
    monkeypatch.setattr(devices, "accelerators", lambda: ["cuda", "mps", "xpu"])
    # No real platform has wheels for both cuda and mps (test_platforms.py covers the excluded case).
    monkeypatch.setattr(devices, "supports", lambda extra, system, machine: True)
    monkeypatch.delenv("BNB_BACKENDS", raising=False)
    monkeypatch.delenv("BNB_STRICT_BACKENDS", raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        discovery.load_backends(entry_points=[])
    messages = [str(w.message) for w in caught if w.category is MissingBackendWarning]
    assert len(messages) == 3
    assert "pip install 'bitsandbytes[cuda]'" in messages[0] and "pip install 'bitsandbytes[mps]'" in messages[1]
    assert "no xpu backend" in messages[2]
    lines, problems = render()
    assert any("cuda: no backend installed" in line and "bitsandbytes[cuda]" in line for line in lines)
    assert problems == []  # a hint, not a failure

    # A backend that claims the device replaces the hint; when it says it cannot run here, that is the warning.
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "idle_gpu_plugin.py").write_text(
        "from bitsandbytes.backends import Backend\n"
        "backend = Backend('gpu', ['cuda'], api_version='1.0', is_available=lambda: False)\n"
    )
    entry = metadata.EntryPoint(name="gpu", value="idle_gpu_plugin:backend", group=GROUP)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        discovery.load_backends(entry_points=[entry])
    messages = [str(w.message) for w in caught if w.category is MissingBackendWarning]
    assert len(messages) == 3 and "'gpu'" in messages[2] and "cannot run on this machine" in messages[2]
    assert not any("bitsandbytes[cuda]" in m for m in messages)
    assert discovery.missing_accelerators() == ["mps", "xpu"]

    monkeypatch.setattr(devices, "is_rocm", lambda: True)
    assert "ROCm" in devices.install_hint("cuda")


def test_cli_shows_versions_statuses_and_tracebacks(tmp_path):
    source = """
    import torch

    def good():
        torch.library.register_kernel("bitsandbytes::int8_mm_dequant", "cpu")(lambda *args: None)

    def broken():
        raise RuntimeError("boom")
    """
    site = make_dist(
        tmp_path,
        "bnb-cli-test",
        "0.4.2",
        {"good": "cli_plugin:good", "broken": "cli_plugin:broken"},
        {"cli_plugin": source},
    )
    proc = run_python(["-m", "bitsandbytes", "--verbose"], site, BNB_BACKENDS="good,broken")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = proc.stdout
    assert re.search(r"^  broken\s+bnb-cli-test 0\.4\.2\s+callable\s+-\s+failed: RuntimeError: boom", out, re.M)
    assert re.search(r"^  good\s+bnb-cli-test 0\.4\.2\s+callable\s+cpu\s+loaded$", out, re.M)
    assert re.search(r"^  int8_mm_dequant\s+native \(good\)\s+reference", out, re.M)
    assert "Traceback (most recent call last)" in out
    assert "backend 'broken' failed" in out.split("problem(s):")[1]
    assert "BackendLoadWarning" in proc.stderr and proc.stderr.count("boom") == 1


def test_toy_backend_example_installed_with_pip(tmp_path):
    pytest.importorskip("setuptools", reason="building examples/toy_backend offline needs setuptools")
    src = shutil.copytree(TOY, tmp_path / "toy", ignore=shutil.ignore_patterns("build", "*.egg-info"))
    site = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index"]
    subprocess.run([*pip, "--target", str(site), str(src)], check=True, capture_output=True, timeout=120)

    proc = run_python(["-m", "bitsandbytes", "--self-test"], site, BNB_BACKENDS="toy")
    out = proc.stdout
    assert re.search(r"^  toy\s+bnb-toy-backend 0\.1\.0\s+Backend\s+cpu\s+loaded$", out, re.M), out
    assert re.search(r"^  int8_vectorwise_dequant\s+native \(toy\)\s+reference", out, re.M)
    assert re.search(r"^    kernels\s+int8_vectorwise_dequant$", out, re.M)  # the plugin's diagnostics()
    assert re.search(r"^  cpu\s+int8\s+ok\s+native: int8_vectorwise_dequant", out, re.M)
    assert proc.returncode == 0, out + proc.stderr

    off = run_python(["-m", "bitsandbytes"], site, BNB_BACKENDS="none")
    assert re.search(r"^  toy\s.*skipped: not selected by BNB_BACKENDS$", off.stdout, re.M)
    assert re.search(r"^  int8_vectorwise_dequant\s+reference", off.stdout, re.M)
