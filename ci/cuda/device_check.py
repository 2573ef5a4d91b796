"""The GPU check in one command, for a lent machine with no network (issue 17): build the CUDA backend for
the visible GPU's architecture only, run the tests that need a GPU, the conformance suite on device cuda
and the quick benchmark, each step under a time box, and write one report (ci/cuda/gpu_report.py) with
everything the steps left, all inside ten minutes.

    python3 ci/cuda/device_check.py [--out DIR] [--dry-run] [--budget SECONDS] [--arch 90]

DIR defaults to $OUT (what the device tool brings back), else build/gpu-check. It receives at most six
files: cuda-report.md and .json, junit-backend.xml, junit-conformance.xml, cuda_bench.json and steps.log
(every step's output, one after the other). ``--dry-run`` prints the steps, their commands and time boxes
and checks that the boxes fit the budget; it needs no GPU, no torch and no compiler.

Offline, so nothing is installed from an index: the machine's own python3 (with torch, pytest, numpy,
cmake, ninja, scikit-build-core) runs everything. The core is pure Python and its build backend
(hatchling) is not on that machine, so it comes from the checkout through PYTHONPATH, and so does the
kernel emulator (packages/kernel-emulator/src, the backend's test extra). The CUDA backend
is built by pip with --no-build-isolation --no-index --no-deps into build/gpu-check/site: that is the
real scikit-build-core build (so the entry point through which the core finds the backend exists, which a
source tree on PYTHONPATH would not give), with BNB_CUDA_ARCHS set from torch.cuda.get_device_capability.
$BNB_CUDA_WHEEL, when set, names a wheel built elsewhere to install instead.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_report  # beside this file; ci/ is not a package
import run_report  # gpu_report put ci/ on the path

ROOT = run_report.ROOT
WORK = ROOT / "build" / "gpu-check"
# What one lent command may take (the device tool's limit), and what this script plans to use of it:
# the rest is slack for the machine's own start and the copying back of the results.
LIMIT_S = 600
BUDGET_S = 570
REPORT_BOX_S = 40  # gathering the report's facts (nvidia-smi, torch, diagnostics, python -m bitsandbytes), all told

PROBE = """
import sys, torch
if not torch.cuda.is_available():
    sys.exit(f"no CUDA device visible to torch {torch.__version__} (built with CUDA {torch.version.cuda})")
major, minor = torch.cuda.get_device_capability(0)
open(sys.argv[1], "w").write(f"{major}{minor}")
print(torch.cuda.get_device_name(0), f"sm_{major}{minor}", "torch", torch.__version__, "CUDA", torch.version.cuda)
"""

# The backend tests that need a GPU: tests/gpu is all of them; test_launch.py checks the real launch
# path on a GPU too. The rest of packages/backends-cuda/tests runs in the emulator, which CI covers.
GPU_TESTS = ("packages/backends-cuda/tests/gpu", "packages/backends-cuda/tests/test_launch.py")
JUNIT = ("-p", "no:cacheprovider", "-o", "junit_family=xunit1")
# Everything the check leaves in --out (the device tool brings back at most 8 files).
OUT_FILES = ("cuda-report.md", "cuda-report.json", "junit-backend.xml", "junit-conformance.xml", "cuda_bench.json",
             "steps.log")  # fmt: skip


@dataclass
class Step:
    name: str
    box_s: float
    argv: list[str]
    needs: tuple[str, ...] = ()  # steps that must have exited 0 first
    junit: Path | None = None
    env: dict[str, str] = field(default_factory=dict)


def pip_build(python: str, site: Path, wheel: str | None) -> list[str]:
    """pip, offline, into ``site``: the wheel if one is named, else the checkout's backend built here."""
    pip = [python, "-m", "pip", "install", "--no-build-isolation", "--no-index", "--no-deps", "--no-cache-dir",
           "--upgrade", "--target", str(site)]  # fmt: skip
    return [*pip, wheel] if wheel else [*pip, "-v", "./packages/backends-cuda"]


def plugin_args() -> tuple[str, ...]:
    """The core's pytest plugin (``--bnb-device``) named outright when no installed core registers it: the
    core on PYTHONPATH has no pytest11 entry point, and naming it where one exists registers it twice."""
    registered = any(ep.value == "bitsandbytes.testing.plugin" for ep in metadata.entry_points(group="pytest11"))
    return () if registered else ("-p", "bitsandbytes.testing.plugin")


def xdist_args() -> tuple[str, ...]:
    """Four pytest workers for the conformance suite where pytest-xdist is installed (the lent machine has
    it): its cases check each GPU result against the reference kernels on the CPU, which is the slow half,
    and the machine has 16 cores. Each worker is a process with its own CUDA context."""
    return ("-n", "4") if importlib.util.find_spec("xdist") is not None else ()


def plan(python: str, out: Path, arch: str | None = None, work: Path = WORK) -> list[Step]:
    """The steps in order. The build reads the arch the probe wrote (``arch`` overrides it)."""
    site = work / "site"
    # The kernel emulator too: the backend's tests/conftest.py and test_launch.py's emulated half use it.
    emulator = ROOT / "packages" / "kernel-emulator" / "src"
    paths = [str(site), str(ROOT / "packages" / "core" / "src"), str(emulator), os.environ.get("PYTHONPATH", "")]
    env = {"PYTHONPATH": os.pathsep.join(p for p in paths if p), "BNB_STRICT_BACKENDS": "1"}
    backend, conformance = out / "junit-backend.xml", out / "junit-conformance.xml"
    build = [python, str(Path(__file__).resolve()), "--build", str(work)] + (["--arch", arch] if arch else [])
    return [
        Step("probe", 20, [python, "-c", PROBE, str(work / "arch")]),
        Step("build", 100, build, () if arch else ("probe",)),
        Step("diagnostics", 30, [python, "-m", "bitsandbytes"], ("build",), env=env),
        Step(
            "backend tests",
            150,
            [python, "-m", "pytest", *GPU_TESTS, "-q", *JUNIT, f"--junitxml={backend}"],
            ("build",),
            backend,
            env,
        ),
        Step(
            "conformance on cuda",
            170,
            [
                python,
                "-m",
                "bitsandbytes.testing",
                "--device",
                "cuda",
                "-q",
                *plugin_args(),
                *xdist_args(),
                *JUNIT,
                f"--junitxml={conformance}",
            ],
            ("build",),
            conformance,
            env,
        ),
        Step(
            "bench",
            60,
            [python, "packages/backends-cuda/bench/bench_cuda.py", "--quick", "--out", str(work / "bench")],
            ("build",),
            env=env,
        ),
    ]


def has_build_backend() -> bool:
    """scikit-build-core importable here: with --no-build-isolation pip fetches no build backend."""
    return importlib.util.find_spec("scikit_build_core") is not None


def build(work: Path, arch: str | None) -> int:
    """The build step: BNB_CUDA_ARCHS from --arch or the probe's file, then pip (pip_build)."""
    arch = arch or ((work / "arch").read_text().strip() if (work / "arch").is_file() else "")
    if not arch:
        print(f"no arch: the probe wrote none to {work / 'arch'} and --arch was not given", file=sys.stderr)
        return 2
    wheel = os.environ.get("BNB_CUDA_WHEEL")
    command = pip_build(sys.executable, work / "site", wheel)
    env = {**os.environ, "BNB_CUDA_ARCHS": arch, "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 4)}
    if not wheel:
        if not has_build_backend():
            print("cannot build offline: scikit-build-core is not installed in this Python; install it, or set "
                  "BNB_CUDA_WHEEL to a wheel built elsewhere", file=sys.stderr)  # fmt: skip
            return 2
        toolkit = Path("/usr/local/cuda/bin/nvcc")
        if shutil.which("nvcc") is None and toolkit.exists():  # the toolkit installed, its bin not on PATH
            env["CUDACXX"] = str(toolkit)
            env["PATH"] = f"{toolkit.parent}{os.pathsep}{env.get('PATH', '')}"
        nvcc = env.get("CUDACXX") or shutil.which("nvcc") or "nvcc"
        subprocess.call([nvcc, "--version"], env=env)  # into the log: which compiler built it
    print(f"BNB_CUDA_ARCHS={arch} {' '.join(command)}", flush=True)
    return subprocess.call(command, env=env, cwd=ROOT)


def planned_seconds(steps: list[Step]) -> float:
    return sum(s.box_s for s in steps) + REPORT_BOX_S


def dry_run(steps: list[Step], budget: float) -> int:
    for s in steps:
        env = " ".join(f"{k}={v}" for k, v in s.env.items() if k != "PYTHONPATH")
        needs = f" (after {', '.join(s.needs)})" if s.needs else ""
        argv = ["<code>" if "\n" in a else a for a in s.argv]  # the probe's inline program
        print(f"{s.box_s:5.0f} s  {s.name}{needs}: {env + ' ' if env else ''}{' '.join(argv)}")
        if s.name == "build":
            pip = pip_build(s.argv[0], WORK / "site", os.environ.get("BNB_CUDA_WHEEL"))
            arch = s.argv[s.argv.index("--arch") + 1] if "--arch" in s.argv else "<probed arch>"
            print(f"         which runs: BNB_CUDA_ARCHS={arch} {' '.join(pip)}")
    total = planned_seconds(steps)
    print(f"{REPORT_BOX_S:5.0f} s  report: ci/cuda/gpu_report.py")
    print(f"{total:5.0f} s  in all (budget {budget:.0f} s, one device command at most {LIMIT_S} s)")
    return 0 if total <= budget <= LIMIT_S else 1


def execute(
    steps: list[Step],
    out: Path,
    budget: float = BUDGET_S,
    run: run_report.Run = subprocess.run,
    work: Path = WORK,
    arch: str | None = None,
) -> tuple[list[dict], dict]:
    """Run the steps in order, each within its box and within what is left of ``budget`` (less the
    report's share), skip those whose prerequisites failed, then write the report. Returns the steps'
    results and the report's state. ``arch`` is --arch when given (else the probe's file says it)."""
    deadline = time.monotonic() + budget - REPORT_BOX_S
    log = out / "steps.log"
    results: dict[str, dict] = {}
    for step in steps:
        failed = [n for n in step.needs if results.get(n, {}).get("exit") != 0]
        left = deadline - time.monotonic()
        if failed:
            why = f"not run: {', '.join(failed)} failed"
            results[step.name] = {"step": step.name, "exit": why, "seconds": 0.0, "box_s": step.box_s}
        elif left < 5:
            why = "not run: out of time"
            results[step.name] = {"step": step.name, "exit": why, "seconds": 0.0, "box_s": step.box_s}
        else:
            env = {**os.environ, **step.env}
            results[step.name] = run_report.run_step(step.name, step.argv, min(step.box_s, left), log, env, ROOT)
        print(f"[{step.name}] exit {results[step.name]['exit']} in {results[step.name]['seconds']} s", flush=True)

    bench = work / "bench" / "cuda_bench.json"
    if bench.is_file():
        shutil.copy(bench, out / "cuda_bench.json")

    report_deadline = time.monotonic() + REPORT_BOX_S

    def capped(cmd, **kwargs):  # the fact-finding children share the report's box
        left = max(1.0, report_deadline - time.monotonic())
        kwargs["timeout"] = min(kwargs.get("timeout") or left, left)
        return run(cmd, **kwargs)

    # The report's children see what the steps saw (the built backend, the checkout's core).
    saved = dict(os.environ)
    os.environ.update(next((s.env for s in steps if "PYTHONPATH" in s.env), {}))
    probed = work / "arch"
    probed = probed.read_text().strip() if probed.is_file() else os.environ.get("BNB_CUDA_ARCHS", "")
    os.environ["BNB_CUDA_ARCHS"] = arch or probed  # what the build was given
    try:
        state = gpu_report.collect({}, run=capped)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    state["steps"] = list(results.values())
    statuses = [(r["step"], r["exit"]) for r in results.values()]
    junits = [(s.name, str(s.junit)) for s in steps if s.junit is not None]
    state["tests"] = run_report.step_summaries(junits, statuses)
    if bench.is_file() or "bench" in results:
        state["bench"] = run_report.read_bench(bench)
    run_report.write(out / "cuda-report.md", state, gpu_report.render)
    return list(results.values()), state


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default_out = Path(os.environ["OUT"]) if os.environ.get("OUT") else WORK
    parser.add_argument("--out", type=Path, default=default_out, help="where the report and logs go ($OUT)")
    parser.add_argument("--dry-run", action="store_true", help="print the steps and their time boxes, run nothing")
    parser.add_argument("--budget", type=float, default=BUDGET_S, help=f"seconds in all (default {BUDGET_S})")
    parser.add_argument("--arch", help="build for this arch (e.g. 90) instead of the probed GPU's")
    parser.add_argument("--build", type=Path, metavar="WORK", help=argparse.SUPPRESS)  # the build step itself
    args = parser.parse_args(argv)
    if args.build:
        return build(args.build, args.arch)
    if not 0 < args.budget <= LIMIT_S:
        parser.error(f"--budget must be in (0, {LIMIT_S}] seconds; got {args.budget}")

    out = args.out.resolve()
    steps = plan(sys.executable, out, args.arch)
    if args.dry_run:
        return dry_run(steps, args.budget)
    for stale in (WORK / "arch", WORK / "bench" / "cuda_bench.json", *(out / n for n in OUT_FILES)):
        stale.unlink(missing_ok=True)  # a file from an earlier run would read as this run's
    WORK.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    results, state = execute(steps, out, args.budget, arch=args.arch)
    report = out / "cuda-report.md"
    print(report.read_text())
    print("\n".join(f"{k}: {v}" for k, v in gpu_report.summary(state).items()))
    return 0 if all(r["exit"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
