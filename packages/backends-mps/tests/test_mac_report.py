"""The Mac report (tests/mac_report.py) off a Mac: machine facts with sysctl faked, pytest's own junit files
turned into counts and node ids, the one report that tests-mps and bench-mps both add to, and the nox
session writing it even when a step fails (and failing after)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import mac_report
import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = Path(mac_report.__file__)


def _sysctl(values: dict[str, str]):
    calls = []

    def run(cmd, **kwargs):
        calls.append(cmd)
        if cmd[0] == "xcrun":
            return subprocess.CompletedProcess(cmd, 0, "Apple metal version 32023.404 (metalfe-32023.404)\n", "")
        name = cmd[-1]
        if name in values:
            return subprocess.CompletedProcess(cmd, 0, values[name] + "\n", "")
        return subprocess.CompletedProcess(cmd, 1, "", f"sysctl: unknown oid '{name}'")

    return run, calls


def test_machine_off_a_mac_says_so_without_asking_sysctl():
    run, calls = _sysctl({})
    info = mac_report.machine(run=run, system="Linux", mac_ver="")
    assert info["chip"].startswith("not a Mac (Linux ") and info["macOS"] == "not macOS (Linux)"
    assert calls == []


def test_machine_on_a_mac_reads_sysctl():
    run, calls = _sysctl({"machdep.cpu.brand_string": "Apple M2 Pro", "hw.memsize": str(32 * 2**30)})
    info = mac_report.machine(run=run, system="Darwin", mac_ver="14.5")
    assert info["chip"] == "Apple M2 Pro" and info["memory"] == "32 GiB unified"
    assert info["macOS"].startswith("14.5 (")
    assert info["Metal compiler"] == "Apple metal version 32023.404 (metalfe-32023.404)"
    assert ["sysctl", "-n", "machdep.cpu.brand_string"] in calls


def test_machine_on_a_mac_without_sysctl_reports_unknown():
    def missing(cmd, **kwargs):
        raise FileNotFoundError(cmd[0])

    info = mac_report.machine(run=missing, system="Darwin", mac_ver="15.1")
    assert info["chip"].startswith("unknown (sysctl machdep.cpu.brand_string failed)")
    assert info["memory"] == "unknown"
    assert info["Metal compiler"].startswith("xcrun not found (FileNotFoundError): install the Xcode")


def test_environment_lists_each_variable_set_or_not():
    env = mac_report.environment({"PYTORCH_MPS_FAST_MATH": "1", "HOME": "/x"})
    assert env["PYTORCH_MPS_FAST_MATH"] == "1" and env["PYTORCH_ENABLE_MPS_FALLBACK"] == "unset"
    assert "HOME" not in env


SAMPLE_TESTS = """
import pytest

@pytest.fixture
def broken():
    raise RuntimeError("fixture blew up")

def test_passes():
    pass

def test_fails():
    assert 1 == 2

def test_errors(broken):
    pass

@pytest.mark.skip(reason="needs an Apple Silicon GPU (MPS)")
def test_skipped():
    pass

class TestGroup:
    @pytest.mark.parametrize("n", [1, 2])
    def test_param(self, n):
        assert n == 1, f"n was {n}"
"""


def test_junit_summary_reads_pytests_own_file(tmp_path):
    """A real pytest run (xunit1, as tests-mps writes it): the counts, and each failure under pytest's own
    node id with its first error line."""
    tests = tmp_path / "sub" / "test_sample.py"
    tests.parent.mkdir()
    tests.write_text(textwrap.dedent(SAMPLE_TESTS))
    xml = tmp_path / "results.xml"
    base = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "sub/test_sample.py"]
    subprocess.run([*base, f"--junitxml={xml}", "-o", "junit_family=xunit1"], cwd=tmp_path, capture_output=True)
    nodes = subprocess.run([*base, "--collect-only", "-q"], cwd=tmp_path, capture_output=True, text=True).stdout

    summary = mac_report.junit_summary(xml)
    assert summary["counts"] == {"passed": 2, "failed": 2, "errors": 1, "skipped": 1}
    failures = {f["node"]: f for f in summary["failures"]}
    expected = {
        "sub/test_sample.py::test_fails",
        "sub/test_sample.py::test_errors",
        "sub/test_sample.py::TestGroup::test_param[2]",
    }
    assert set(failures) == expected and expected <= set(nodes.split())
    assert "assert 1 == 2" in failures["sub/test_sample.py::test_fails"]["error"]
    assert "n was 2" in failures["sub/test_sample.py::TestGroup::test_param[2]"]["error"]
    assert failures["sub/test_sample.py::test_errors"]["kind"] == "error"
    assert summary["skips"] == [("needs an Apple Silicon GPU (MPS)", 1)]


def test_junit_summary_of_a_run_that_wrote_nothing(tmp_path):
    assert "the run ended before pytest wrote it" in mac_report.junit_summary(tmp_path / "none.xml")["missing"]
    (tmp_path / "cut.xml").write_text("<testsuites><testsuite")
    assert "unreadable results file" in mac_report.junit_summary(tmp_path / "cut.xml")["missing"]


def _junit(path: Path, failing: str) -> Path:
    path.write_text(
        '<testsuites><testsuite name="pytest" tests="2" time="1.5">'
        '<testcase classname="tests.mac.test_on_mps" name="test_ok" file="tests/mac/test_on_mps.py"/>'
        f'<testcase classname="tests.mac.test_on_mps" name="{failing}" file="tests/mac/test_on_mps.py">'
        '<failure message="AssertionError: kernels loaded from reference&#10;more">long traceback</failure>'
        "</testcase></testsuite></testsuites>"
    )
    return path


def test_one_report_collects_tests_then_bench(tmp_path, monkeypatch):
    monkeypatch.setattr(mac_report, "bnb_cli", lambda: "bitsandbytes 1.0.0 (faked)")
    out = tmp_path / "mps-report.md"
    xml = _junit(tmp_path / "backend.xml", "test_backend_loaded_natively")
    mac_report.main(
        ["--out", str(out), "--step=diagnostics=0", "--step=backend tests=1", f"--junit=backend tests={xml}"]
    )
    bench = {
        "header": {},
        "complete": False,
        "rows": [{"op": "gemv_4bit", "shape": [4096, 4096], "kernel": "native", "ours": {"us": 10.0, "GB/s": 838.9}}],
    }
    (tmp_path / "bench.json").write_text(json.dumps(bench))
    mac_report.main(["--out", str(out), f"--bench={tmp_path / 'bench.json'}"])

    text = out.read_text()
    assert "| chip | not a Mac (" in text and "| PYTORCH_MPS_FAST_MATH | unset |" in text
    assert "| kernels loaded from | reference |" in text  # the backend's real diagnostics, off a Mac
    assert "why not blockwise.metal" in text and "bitsandbytes 1.0.0 (faked)" in text
    assert "| backend tests | 1 | 1 | 1 | 0 | 0 | 1.5 |" in text  # the tests section survived the bench call
    node = "tests/mac/test_on_mps.py::test_backend_loaded_natively"
    assert f"- `{node}` (failure): AssertionError: kernels loaded from reference" in text
    assert "## Benchmark (`nox -s bench-mps`) (incomplete" in text
    assert "| gemv_4bit | [4096, 4096] | Metal kernel | 10.0 | 838.9 |" in text


def test_the_script_runs_off_a_mac(tmp_path):
    """As nox runs it, for real: python -m bitsandbytes and the backend's diagnostics on this machine."""
    out = tmp_path / "r.md"
    args = ["--out", str(out), "--step=conformance on mps=2", f"--junit=conformance on mps={tmp_path / 'no.xml'}"]
    done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert f"report written to {out}" in done.stdout
    text = out.read_text()
    assert "not a Mac" in text and "Backends (entry points" in text  # python -m bitsandbytes' own output
    assert "**conformance on mps**: no results file" in text and "(exit status 2)" in text


class _Session:
    """Enough of nox.Session for tests-mps: records commands, fails the ones ``fail`` names."""

    def __init__(self, tmp: Path, fail: str):
        self.tmp, self.fail, self.posargs, self.commands = tmp, fail, [], []
        self.virtualenv = None

    def install(self, *args, **kwargs):
        pass

    def create_tmp(self):
        return str(self.tmp)

    def run(self, *args, env=None, silent=False, **kwargs):
        import nox.command

        self.commands.append(args)
        if silent:  # _require_mps' probe
            return "1\n"
        if self.fail in args:
            raise nox.command.CommandFailed("Returned code 1", return_code=1)
        return True

    def warn(self, message):
        self.commands.append(("warn", message))

    def error(self, message):
        self.commands.append(("error", message))
        raise RuntimeError(message)

    def log(self, message):
        pass


def test_tests_mps_writes_the_report_after_a_failing_step_then_fails(tmp_path):
    pytest.importorskip("nox", reason="imports noxfile.py, which needs nox")
    spec = importlib.util.spec_from_file_location("noxfile_under_test", ROOT / "noxfile.py")
    noxfile = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(noxfile)
    session = _Session(tmp_path, fail="packages/backends-mps/tests")
    with pytest.raises(RuntimeError, match=r"failed: backend tests \(see .*mps-report.md\)"):
        noxfile.tests_mps(session)
    names = [c[1] if len(c) > 1 else c[0] for c in session.commands]
    conformance = next(i for i, c in enumerate(session.commands) if "bitsandbytes.testing" in c)
    report = next(i for i, n in enumerate(names) if n == noxfile.MPS_REPORT_SCRIPT)
    assert conformance < report < len(session.commands) - 1  # every step ran, then the report, then the error
    args = session.commands[report]
    assert "--step=backend tests=1" in args and "--step=conformance on mps=0" in args
    assert any(a.startswith("--junit=backend tests=") for a in args)
    assert session.commands[-1][0] == "error"


def test_a_crashing_backend_costs_the_report_its_diagnostics_only():
    def crashed(cmd, **kwargs):
        return subprocess.CompletedProcess(cmd, -11, "", "Fatal Python error: Segmentation fault\n")

    info = mac_report.mps_diagnostics(run=crashed)
    assert info == {"error": "the diagnostics process ended with status -11: Fatal Python error: Segmentation fault"}


def test_a_bench_that_stops_midway_leaves_what_it_measured(tmp_path, monkeypatch):
    import torch

    spec = importlib.util.spec_from_file_location("bench_mps_under_test", mac_report.BENCH_SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)

    def first_case_then_crash(shapes, peak, rows, saved):
        rows.append({"op": "quantize_4bit", "shape": [4096, 4096], "kernel": "native", "ours": {"us": 50.0}})
        saved()
        raise RuntimeError("the second kernel hung")

    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    monkeypatch.setattr(bench, "run", first_case_then_crash)
    monkeypatch.setattr(sys, "argv", ["bench_mps.py", "--out", str(tmp_path), "--quick"])
    with pytest.raises(RuntimeError, match="the second kernel hung"):
        bench.main()
    results = json.loads((tmp_path / "mps_bench.json").read_text())
    assert results["complete"] is False and [r["op"] for r in results["rows"]] == ["quantize_4bit"]
    assert "| quantize_4bit | [4096, 4096] | Metal kernel | 50.0 |" in (tmp_path / "mps_bench.md").read_text()
