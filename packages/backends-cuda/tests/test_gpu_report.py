"""The CUDA run report (ci/cuda/gpu_report.py) and the one-command GPU check (ci/cuda/device_check.py) without
a GPU: nvidia-smi, torch's CUDA view and the backend's diagnostics faked, pytest's junit and bench_cuda's
JSON faked as files, the time boxes run for real on sleeping children, and the nox sessions writing the
report even when a step fails (and failing after)."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


gpu_report = _load("gpu_report_under_test", ROOT / "ci" / "cuda" / "gpu_report.py")
device_check = _load("device_check_under_test", ROOT / "ci" / "cuda" / "device_check.py")
run_report = gpu_report.run_report

SMI_QUERY = "0, NVIDIA H200, 580.159.03, 143771 MiB, 9.0, 00000000:19:00.0\n"
SMI_PLAIN = "| NVIDIA-SMI 580.159.03   Driver Version: 580.159.03   CUDA Version: 13.0     |\n"
TORCH = {"torch": "2.11.0+cu130", "torch CUDA runtime": "13.0", "cuda available": "True", "arch": "90",
         "device 0": "NVIDIA H200, sm_90, 132 SMs, 140 GiB"}  # fmt: skip
DIAG = {
    "backend status": "loaded",
    "archs in the library": "sm_90 compute_90 (PTX)",
    "CUDA runtime (static)": "12.8",
    "CUDA driver": "13.0",
}


def fake_machine(cmd, **kwargs):
    """subprocess.run as an H200 machine answers the report's questions."""
    done = lambda out, code=0: subprocess.CompletedProcess(cmd, code, out, "")  # noqa: E731
    if cmd[0] == "nvidia-smi":
        return done(SMI_QUERY if len(cmd) > 1 else SMI_PLAIN)
    if cmd[0] == "git":
        return done("0123abcd\n")
    if cmd[1:3] == ["-m", "bitsandbytes"]:
        return done("bitsandbytes 1.0.0 (faked)\n")
    code = cmd[2]
    return done(json.dumps(TORCH if "get_device_capability" in code else DIAG) + "\n")


def test_nvidia_smi_gives_each_gpu_the_driver_and_its_cuda():
    info = gpu_report.nvidia_smi(run=fake_machine)
    assert info == {
        "driver": "580.159.03",
        "GPU 0": "NVIDIA H200, sm_90, 143771 MiB, 00000000:19:00.0",
        "driver supports CUDA": "13.0",
    }


def test_nvidia_smi_missing_or_without_a_driver_is_reported_not_raised():
    def missing(cmd, **kwargs):
        raise FileNotFoundError(cmd[0])

    assert gpu_report.nvidia_smi(run=missing)["nvidia-smi"].startswith("not runnable (FileNotFoundError)")

    def no_driver(cmd, **kwargs):
        msg = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n"
        return subprocess.CompletedProcess(cmd, 9, msg, "")

    assert gpu_report.nvidia_smi(run=no_driver) == {
        "nvidia-smi": "failed: NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
    }


def test_a_crashing_cuda_init_costs_the_report_that_section_only():
    def crashed(cmd, **kwargs):
        return subprocess.CompletedProcess(cmd, -11, "", "Fatal Python error: Segmentation fault\n")

    assert gpu_report.torch_cuda(run=crashed) == {
        "error": "the diagnostics process ended with status -11: Fatal Python error: Segmentation fault"
    }
    assert gpu_report.cuda_diagnostics(run=crashed)["error"].endswith("Segmentation fault")


def _junit(path: Path) -> Path:
    path.write_text(
        '<testsuites><testsuite name="pytest" tests="2" time="1.5">'
        '<testcase classname="tests.gpu.test_on_gpu" name="test_ok" file="tests/gpu/test_on_gpu.py"/>'
        '<testcase classname="tests.gpu.test_on_gpu" name="test_streams" file="tests/gpu/test_on_gpu.py">'
        '<failure message="AssertionError: side stream differs&#10;more">traceback</failure>'
        "</testcase></testsuite></testsuites>"
    )
    return path


BENCH = {
    "peak_gbps": 4800.0,
    "rows": [
        {
            "shape": "4096x4096",
            "op": "dequantize_4bit nf4 fp16",
            "eager_s": 3e-5,
            "graph_s": 2e-5,
            "gbs": 2097.2,
            "peak_pct": 43.7,
            "upstream_s": 2.5e-5,
            "dense_s": None,
        },
        {
            "shape": "4096x4096",
            "op": "Adam8bit step fp32",
            "eager_s": 2e-4,
            "graph_s": None,
            "gbs": 1342.2,
            "peak_pct": 28.0,
            "upstream_s": None,
            "dense_s": 3e-4,
        },
    ],
    "matmul": {"4096x4096 b1": {"nf4 fp16": {"eager": 3e-5, "graph": 1e-5}}},
    "upstream": {"ops": {}, "matmul": {}},
}


def test_the_report_from_faked_facts_junit_and_bench(tmp_path):
    state = gpu_report.collect({}, run=fake_machine)
    xml = _junit(tmp_path / "backend.xml")
    state["tests"] = run_report.step_summaries([("backend tests", str(xml))], [("build", "0"), ("backend tests", "1")])
    (tmp_path / "bench.json").write_text(json.dumps(BENCH))
    state["bench"] = run_report.read_bench(tmp_path / "bench.json")
    text = gpu_report.render(state)

    assert "| device | NVIDIA H200, sm_90, 143771 MiB, 00000000:19:00.0 |" in text
    assert "| driver | 580.159.03 (CUDA 13.0) |" in text
    assert "| CUDA runtime of torch | 13.0 (torch 2.11.0+cu130) |" in text
    assert "| CUDA runtime of bnb_cuda | 12.8 |" in text and "| archs built | sm_90 compute_90 (PTX) |" in text
    assert "| tests | 1 passed, 1 failed, 0 errors, 0 skipped; steps not passing: backend tests |" in text
    assert "| backend tests | 1 | 1 | 1 | 0 | 0 | 1.5 |" in text  # the shared tests table
    assert "- `tests/gpu/test_on_gpu.py::test_streams` (failure): AssertionError: side stream differs" in text
    assert "bitsandbytes 1.0.0 (faked)" in text and "| BNB_CUDA_ARCHS |" in text
    # Per-op bandwidth: the graph time where it captured, eager where it could not (the optimizer step).
    assert "| 4096x4096 | dequantize_4bit nf4 fp16 | 20.0 | 2097 | 44% | graph | 25.0 | — |" in text
    assert "| 4096x4096 | Adam8bit step fp32 | 200.0 | 1342 | 28% | eager | — | 300.0 |" in text
    # bench_cuda's own matmul table: 9.45 MB (codes, fp32 scales, fp16 in/out) in 10 µs of 4.8 TB/s is 20%.
    assert "| 4096×4096 | 1 | nf4 fp16 | 9.5 | 10.0 | 20% | 30.0 | 20.0 | — | — |" in text


def test_a_bench_that_wrote_nothing_is_named(tmp_path):
    text = gpu_report.render(
        {**gpu_report.collect({}, run=fake_machine), "bench": run_report.read_bench(tmp_path / "none.json")}
    )
    assert "Could not read the results: " in text and "none.json" in text


def test_the_script_runs_without_a_gpu(tmp_path):
    """As nox runs it, for real, on this machine: then a tests call and a bench call add to one report."""
    out = tmp_path / "cuda-report.md"
    base = [sys.executable, str(ROOT / "ci" / "cuda" / "gpu_report.py"), "--out", str(out)]
    xml = _junit(tmp_path / "b.xml")
    done = subprocess.run([*base, "--step=backend tests=1", f"--junit=backend tests={xml}"], capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr
    (tmp_path / "bench.json").write_text(json.dumps(BENCH))
    done = subprocess.run([*base, f"--bench={tmp_path / 'bench.json'}"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr and f"report written to {out}" in done.stdout
    text = out.read_text()
    assert "Backends (entry points" in text  # python -m bitsandbytes' own output
    assert "| backend tests | 1 | 1 | 1 | 0 | 0 | 1.5 |" in text  # kept through the bench call
    assert "| 4096x4096 | dequantize_4bit nf4 fp16 |" in text
    assert json.loads(out.with_suffix(".json").read_text())["bench"]["peak_gbps"] == 4800.0


# ---------------------------------------------------------------------------------------- time boxes


def test_a_step_past_its_box_is_killed_with_its_children(tmp_path):
    log = tmp_path / "steps.log"
    # The child starts a grandchild that would outlive it; both must go (one process group).
    code = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); " \
           "print('started', flush=True); time.sleep(60)"  # fmt: skip
    start = time.monotonic()
    result = run_report.run_step("hangs", [sys.executable, "-c", code], 2, log)
    assert time.monotonic() - start < 20
    assert result["exit"] == "timed out after 2 s" and result["box_s"] == 2
    text = log.read_text()
    assert "===== hangs (time box 2 s)" in text and "started" in text and "exit timed out after 2 s" in text


def test_a_step_keeps_its_exit_status_and_output(tmp_path):
    log = tmp_path / "steps.log"
    result = run_report.run_step("fails", [sys.executable, "-c", "print('boom'); raise SystemExit(3)"], 30, log)
    assert result["exit"] == 3 and result["seconds"] < 30
    assert "boom" in log.read_text()
    assert run_report.run_step("absent", ["/no/such/program"], 30, log)["exit"].startswith("could not start")


# ---------------------------------------------------------------------------------------- device_check


def test_dry_run_lists_the_steps_and_their_boxes_fit_one_command():
    done = subprocess.run([sys.executable, str(ROOT / "ci" / "cuda" / "device_check.py"), "--dry-run"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    boxes = [float(line.split()[0]) for line in lines[:-1] if line.split()[1:2] == ["s"]]
    names = [s.name for s in device_check.plan(sys.executable, Path("/out"))]
    assert names == ["probe", "build", "diagnostics", "backend tests", "conformance on cuda", "bench"]
    assert sum(boxes) == device_check.planned_seconds(device_check.plan(sys.executable, Path("/out")))
    assert sum(boxes) <= device_check.BUDGET_S < device_check.LIMIT_S == 600
    assert "in all (budget 570 s" in lines[-1]
    pip = next(line for line in lines if "which runs:" in line)
    for flag in ("BNB_CUDA_ARCHS=<probed arch>", "--no-build-isolation", "--no-index", "--no-deps", "--target"):
        assert flag in pip
    assert any("bench_cuda.py --quick" in line for line in lines)
    assert any("--device cuda" in line for line in lines)


def test_the_steps_find_the_core_and_the_kernel_emulator_in_the_checkout():
    # Nothing is installed on the lent machine: the backend's tests (their conftest, test_launch.py's
    # emulated half) import bitsandbytes_emu, a distribution of its own, from packages/kernel-emulator/src.
    steps = {s.name: s for s in device_check.plan(sys.executable, Path("/out"))}
    path = steps["backend tests"].env["PYTHONPATH"].split(os.pathsep)
    assert str(ROOT / "packages" / "core" / "src") in path
    assert str(ROOT / "packages" / "kernel-emulator" / "src") in path


def test_dry_run_fails_when_the_boxes_do_not_fit_the_budget():
    assert device_check.main(["--dry-run", "--budget", "400"]) == 1
    with pytest.raises(SystemExit):
        device_check.main(["--dry-run", "--budget", "900"])  # over one command's limit


def test_the_build_step_takes_the_probed_arch_and_stays_offline(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(device_check.subprocess, "call", lambda cmd, env, cwd=None: calls.append((cmd, env)) or 0)
    monkeypatch.delenv("BNB_CUDA_WHEEL", raising=False)
    monkeypatch.setattr(device_check, "has_build_backend", lambda: False)
    (tmp_path / "arch").write_text("90\n")
    assert device_check.build(tmp_path, None) == 2 and calls == []  # no scikit-build-core: says so, runs nothing
    monkeypatch.setattr(device_check, "has_build_backend", lambda: True)
    (tmp_path / "arch").unlink()
    assert device_check.build(tmp_path, None) == 2 and calls == []  # no probe result, no --arch
    (tmp_path / "arch").write_text("90\n")
    assert device_check.build(tmp_path, None) == 0
    cmd, env = calls[-1]
    assert env["BNB_CUDA_ARCHS"] == "90" and cmd[-1] == "./packages/backends-cuda"
    assert {"--no-build-isolation", "--no-index", "--no-deps"} <= set(cmd)
    monkeypatch.setenv("BNB_CUDA_WHEEL", "/w/bitsandbytes_cuda-1.0.0-py3-none-linux_x86_64.whl")
    assert device_check.build(tmp_path, "80") == 0
    assert calls[-1][1]["BNB_CUDA_ARCHS"] == "80" and calls[-1][0][-1].endswith(".whl")


def test_the_core_plugin_is_named_only_where_no_installed_core_registers_it(monkeypatch):
    class EP:
        value = "bitsandbytes.testing.plugin"

    monkeypatch.setattr(device_check.metadata, "entry_points", lambda group: [EP()])
    assert device_check.plugin_args() == ()
    monkeypatch.setattr(device_check.metadata, "entry_points", lambda group: [])
    assert device_check.plugin_args() == ("-p", "bitsandbytes.testing.plugin")


def _py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_execute_skips_what_a_failed_step_blocks_and_still_writes_the_report(tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    Step = device_check.Step
    steps = [
        Step("probe", 30, _py(f"open({str(work / 'arch')!r}, 'w').write('90')")),
        Step("build", 30, _py("raise SystemExit(3)"), ("probe",)),
        Step("backend tests", 30, _py("pass"), ("build",), out / "junit-backend.xml"),
        Step("hangs", 1, _py("import time; time.sleep(60)"), ("probe",)),
    ]
    before = dict(os.environ)
    results, _ = device_check.execute(steps, out, budget=200, run=fake_machine, work=work)
    assert dict(os.environ) == before  # the steps' variables went to the report's children only
    exits = {r["step"]: r["exit"] for r in results}
    assert exits == {"probe": 0, "build": 3, "backend tests": "not run: build failed", "hangs": "timed out after 1 s"}
    text = (out / "cuda-report.md").read_text()
    assert "| hangs | timed out after 1 s |" in text and "| backend tests | not run: build failed | 0.0 | 30 |" in text
    assert "**backend tests**: no results file" in text  # the junit it never wrote
    assert "| device | NVIDIA H200, sm_90," in text and "BNB_CUDA_ARCHS | 90 |" in text  # the probed arch
    assert "## Benchmark" not in text  # no bench step, no bench section


def test_execute_gives_each_step_no_more_than_the_budget_leaves(tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    Step = device_check.Step
    steps = [Step("slow", 100, _py("import time; time.sleep(60)")), Step("next", 100, _py("pass"))]
    start = time.monotonic()
    results, _ = device_check.execute(steps, out, budget=device_check.REPORT_BOX_S + 6, run=fake_machine, work=work)
    assert time.monotonic() - start < 40
    assert results[0]["exit"].startswith("timed out after") and results[0]["seconds"] < 10
    assert results[1]["exit"] == "not run: out of time"


# ---------------------------------------------------------------------------------------- nox


class _Session:
    """Enough of nox.Session for tests-cuda: records commands and installs, fails the ones ``fail`` names;
    ``error`` records its message and raises it as a RuntimeError, ``warn`` records, ``log`` drops."""

    def __init__(self, tmp: Path, fail: str):
        self.tmp, self.fail, self.posargs, self.commands, self.installs = tmp, fail, [], [], []
        self.virtualenv = None

    def _did(self, record: list, args: tuple) -> None:
        import nox.command

        record.append(args)
        if self.fail in args:
            raise nox.command.CommandFailed("Returned code 1", return_code=1)

    def install(self, *args, **kwargs):
        self._did(self.installs, args)

    def run(self, *args, **kwargs):
        self._did(self.commands, args)
        return True

    def create_tmp(self):
        return str(self.tmp)

    def warn(self, message):
        self.commands.append(("warn", message))

    def error(self, message):
        self.warn(message)
        self.commands[-1] = ("error", message)
        raise RuntimeError(message)

    def log(self, message):
        pass


@functools.cache
def _loaded_noxfile():
    return _load("noxfile_under_test", ROOT / "noxfile.py")  # once: nox warns at each session registered again


def _noxfile():
    pytest.importorskip("nox", reason="imports noxfile.py, which needs nox")
    return _loaded_noxfile()


def test_tests_cuda_writes_the_report_after_a_failing_step_then_fails(tmp_path, monkeypatch):
    noxfile = _noxfile()
    monkeypatch.setenv("BNB_CUDA_WHEEL", "bitsandbytes_cuda.whl")  # installed, not built: no nvcc needed
    session = _Session(tmp_path, fail="packages/backends-cuda/tests")
    with pytest.raises(RuntimeError, match=r"failed: backend tests \(see .*cuda-report.md\)"):
        noxfile.tests_cuda(session)
    names = [c[1] if len(c) > 1 else c[0] for c in session.commands]
    conformance = next(i for i, c in enumerate(session.commands) if "bitsandbytes.testing" in c)
    report = names.index(noxfile.CUDA_REPORT_SCRIPT)
    assert conformance < report < len(session.commands) - 1  # every step ran, then the report, then the error
    args = session.commands[report]
    assert "--step=build=0" in args and "--step=backend tests=1" in args and "--step=conformance on cuda=0" in args
    assert any(a.startswith("--junit=conformance on cuda=") for a in args)
    assert session.commands[-1][0] == "error"


def test_tests_cuda_reports_a_failed_build_and_runs_nothing_else(tmp_path, monkeypatch):
    noxfile = _noxfile()
    monkeypatch.setenv("BNB_CUDA_WHEEL", "broken.whl")
    session = _Session(tmp_path, fail="broken.whl")
    with pytest.raises(RuntimeError, match=r"failed: build, diagnostics"):
        noxfile.tests_cuda(session)
    (args,) = [c for c in session.commands if noxfile.CUDA_REPORT_SCRIPT in c]
    assert "--step=build=1" in args and "--step=backend tests=not run: build failed" in args
    assert not any("pytest" in c for c in session.commands)


def test_bench_cuda_writes_the_report_when_the_bench_fails(tmp_path, monkeypatch):
    noxfile = _noxfile()
    monkeypatch.setenv("BNB_CUDA_WHEEL", "bitsandbytes_cuda.whl")
    session = _Session(tmp_path, fail="packages/backends-cuda/bench/bench_cuda.py")

    class Venv:
        location = str(tmp_path / "venv")

    session.virtualenv = Venv()
    import nox.command

    with pytest.raises(nox.command.CommandFailed):
        noxfile.bench_cuda(session)
    (args,) = [c for c in session.commands if noxfile.CUDA_REPORT_SCRIPT in c]
    assert any(a.startswith("--bench=") and a.endswith("cuda_bench.json") for a in args)


def test_tests_cuda_emulated_without_nvcc_installs_the_sources_and_runs_every_step(tmp_path, monkeypatch):
    """No nvcc: the package without its library, then the same steps as with a built one (the tests that need
    nvcc skip themselves, naming it), not a skip of the whole backend."""
    noxfile = _noxfile()
    monkeypatch.setattr(noxfile, "_have_nvcc", lambda: False)
    session = _Session(tmp_path, fail="")
    noxfile._tests_cuda_emulated(session)
    (cuda,) = [args for args in session.installs if noxfile.CUDA in args]
    assert "-Ccmake.define.BNB_CUDA_LIBRARY=OFF" in cuda
    assert any(noxfile.EMU in args for args in session.installs)
    assert session.commands[0][:2] == ("pytest", "packages/backends-cuda/tests")
    assert any("bitsandbytes.testing" in c and "bitsandbytes_cuda.testing.emulated" in c for c in session.commands)
