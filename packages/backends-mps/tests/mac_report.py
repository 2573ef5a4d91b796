"""One markdown report of a Mac run, to paste into a GitHub issue: ``nox -s tests-mps`` and ``nox -s
bench-mps`` both write it (default ``build/mps-report.md``; the path is printed at the end).

    python mac_report.py --out REPORT.md [--step NAME=EXIT_STATUS] [--junit NAME=RESULTS.xml] [--bench BENCH.json]

Every call refreshes the machine part (chip, memory, macOS, Python, torch and bitsandbytes versions, the
environment variables that change how torch compiles or falls back, the mps backend's diagnostics: which
load path won and why each other one was passed over, and ``python -m bitsandbytes``) and replaces the
sections it is given: the test steps (pytest's counts, each failure's node id and first error line, the
skip reasons) or the benchmark table; a section from an earlier call (the tests before the bench) stays.
What the calls collected lives beside the report as REPORT.json.

It lives beside the tests it summarizes and is not part of the wheel: it reports a checkout's run. It runs
anywhere (off a Mac the chip reads "not a Mac"), so it is tested on Linux with faked inputs. What is not
Mac-specific (junit parsing, the tests table, versions, environment, child-process capture) is
ci/run_report.py, shared with the CUDA report (ci/cuda/gpu_report.py).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "ci"))
import run_report  # noqa: E402  (ci/ is not a package: it is put on the path above)
from run_report import Run, bnb_cli, junit_summary, step_summaries  # noqa: E402, F401  (part of this API)

DEFAULT_OUT = ROOT / "build" / "mps-report.md"
BENCH_SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "bench_mps.py"

# What changes how torch compiles Metal (fast math), falls back to the CPU, or budgets unified memory, and
# which backends bitsandbytes loads: all of it changes results, so the report shows each, set or not.
ENV_VARS = (
    "PYTORCH_MPS_FAST_MATH",
    "PYTORCH_ENABLE_MPS_FALLBACK",
    "PYTORCH_MPS_HIGH_WATERMARK_RATIO",
    "PYTORCH_MPS_LOW_WATERMARK_RATIO",
    "PYTORCH_DEBUG_MPS_ALLOCATOR",
    "BNB_BACKENDS",
    "BNB_STRICT_BACKENDS",
    "BNB_MPS_WHEEL",
)
DISTRIBUTIONS = ("bitsandbytes", "bitsandbytes-mps", "bitsandbytes-cpu", "torch")


def _sysctl(name: str, run: Run) -> str | None:
    try:
        done = run(["sysctl", "-n", name], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else None


def machine(run: Run = subprocess.run, system: str | None = None, mac_ver: str | None = None) -> dict[str, str]:
    """Chip, memory and OS. ``run`` runs sysctl; ``system`` and ``mac_ver`` default to this machine's."""
    system = platform.system() if system is None else system
    mac_ver = platform.mac_ver()[0] if mac_ver is None else mac_ver
    arch = platform.machine()
    if system != "Darwin":
        return {"chip": f"not a Mac ({system} {arch})", "memory": "-", "macOS": f"not macOS ({system})"}
    chip = _sysctl("machdep.cpu.brand_string", run) or "unknown (sysctl machdep.cpu.brand_string failed)"
    memsize = _sysctl("hw.memsize", run)
    memory = f"{int(memsize) / 2**30:.0f} GiB unified" if memsize and memsize.isdigit() else "unknown"
    return {"chip": chip, "memory": memory, "macOS": f"{mac_ver or 'unknown'} ({arch})", "Metal compiler": _metal(run)}


def _metal(run: Run) -> str:
    """The first line of ``xcrun -sdk macosx metal --version``: what builds the metallib (torch's own
    compile_shader path does not need it)."""
    try:
        done = run(["xcrun", "-sdk", "macosx", "metal", "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        return f"xcrun not found ({type(e).__name__}): install the Xcode command line tools"
    if done.returncode != 0:
        return f"xcrun metal failed: {run_report.first_line(done.stderr) or f'exit status {done.returncode}'}"
    return run_report.first_line(done.stdout) or "no version printed"


def versions(run: Run = subprocess.run) -> dict[str, str]:
    """Python, the distributions that matter, torch's MPS state and the checkout's commit."""
    out = run_report.versions(DISTRIBUTIONS, run)
    checkout = out.pop("checkout")
    try:
        import torch

        mps = torch.backends.mps
        out["torch MPS"] = f"available: {mps.is_available()}, built: {mps.is_built()}"
    except Exception as e:  # a broken torch is worth reporting, not a reason to lose the report
        out["torch MPS"] = f"torch failed to import: {type(e).__name__}: {e}"
    out["checkout"] = checkout
    return out


def environment(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    return run_report.environment(ENV_VARS, environ)


def mps_diagnostics(run: Run = subprocess.run) -> dict[str, str]:
    """The mps backend's own diagnostics (load path, the reason each other path was passed over, the ops on
    Metal kernels and on the reference) and its status as the core's discovery recorded it."""
    return run_report.backend_diagnostics("mps", run)


def _bench_table(bench: dict) -> list[str]:
    try:
        spec = importlib.util.spec_from_file_location("bench_mps", BENCH_SCRIPT)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.table(bench.get("rows", []))
    except Exception as e:  # the numbers still reach the report, as JSON
        return [f"(table not rendered: {type(e).__name__}: {e})", "", "```json", json.dumps(bench, indent=1), "```"]


def render(state: dict) -> str:
    kv = run_report.kv_table
    lines = [
        "# bitsandbytes on Apple Silicon: report of a Mac run",
        "",
        f"Written {state['written']} by `packages/backends-mps/tests/mac_report.py` "
        "(`nox -s tests-mps`, `nox -s bench-mps`). Paste this file into a GitHub issue.",
        "",
        "## Machine and versions",
        "",
        *kv({**state["machine"], **state["versions"]}),
        "",
        "## Environment variables",
        "",
        *kv(state["environment"]),
        "",
        "## mps backend diagnostics",
        "",
        *kv(state["diagnostics"]),
        "",
        *run_report.cli_section(state["cli"]),
    ]
    if "tests" in state:
        lines += run_report.tests_section(state["tests"], "Tests (`nox -s tests-mps`)")
    if "bench" in state:
        bench = state["bench"]
        done = "" if bench.get("complete") else " (incomplete: the run stopped before the last case)"
        lines += ["", f"## Benchmark (`nox -s bench-mps`){done}", ""]
        lines += [f"Could not read the results: {bench['error']}"] if "error" in bench else _bench_table(bench)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--step", action="append", default=[], help="NAME=EXIT_STATUS of a test step")
    parser.add_argument("--junit", action="append", default=[], help="NAME=PATH of a step's pytest junit xml")
    parser.add_argument("--bench", type=Path, help="bench_mps.py's JSON results")
    args = parser.parse_args(argv)

    state = run_report.load_state(args.out)
    state.update(
        written=run_report.now(),
        machine=machine(),
        versions=versions(),
        environment=environment(),
        diagnostics=mps_diagnostics(),
        cli=bnb_cli(),
    )
    if args.step or args.junit:
        pairs = run_report.pairs
        state["tests"] = step_summaries(pairs(args.junit, "--junit"), pairs(args.step, "--step"))
    if args.bench:
        state["bench"] = run_report.read_bench(args.bench)
    run_report.write(args.out, state, render)
    return 0


if __name__ == "__main__":
    sys.exit(main())
