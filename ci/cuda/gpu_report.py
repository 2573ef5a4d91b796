"""One markdown report of a run on an NVIDIA GPU, to paste into a GitHub issue: ``nox -s tests-cuda`` and
``nox -s bench-cuda`` write it (default ``build/cuda-report.md``), and so does ci/cuda/device_check.py
(the one-command GPU check) into its output folder.

    python ci/cuda/gpu_report.py --out REPORT.md [--step NAME=EXIT_STATUS] [--junit NAME=RESULTS.xml]
                                 [--bench cuda_bench.json]

Every call refreshes the machine part: the GPUs and the driver as nvidia-smi sees them, torch and the
CUDA runtime it was built with as torch sees them (in a child process: a CUDA init that crashes or hangs
costs that section only), the cuda backend's diagnostics (its library, the archs compiled into it, the
CUDA runtime it links statically, the driver it found), ``python -m bitsandbytes``, the environment
variables that change what runs. It replaces the sections it is given (the test steps, the per-op
bandwidth table of bench/bench_cuda.py's JSON) and keeps the others from earlier calls (REPORT.json).

The device-neutral parts are ci/run_report.py, shared with the Mac report. Tested without a GPU with
faked nvidia-smi output, diagnostics, junit and bench files (packages/backends-cuda/tests/test_gpu_report.py).
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import os
import platform
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import run_report  # ci/ is not a package: it is put on the path above
from run_report import Run

ROOT = run_report.ROOT
DEFAULT_OUT = ROOT / "build" / "cuda-report.md"
BENCH_SCRIPT = ROOT / "packages" / "backends-cuda" / "bench" / "bench_cuda.py"

# What selects the GPUs, changes how kernels load or sync, how torch allocates, whether TF32 stands in
# for fp32, which backends bitsandbytes loads and which library or archs it uses: each changes results.
ENV_VARS = (
    "CUDA_VISIBLE_DEVICES",
    "CUDA_LAUNCH_BLOCKING",
    "CUDA_MODULE_LOADING",
    "PYTORCH_CUDA_ALLOC_CONF",
    "NVIDIA_TF32_OVERRIDE",
    "BNB_BACKENDS",
    "BNB_STRICT_BACKENDS",
    "BNB_CUDA_ARCHS",
    "BNB_CUDA_LIBRARY",
    "BNB_CUDA_EMULATE",
    "BNB_CUDA_WHEEL",
)
DISTRIBUTIONS = ("bitsandbytes", "bitsandbytes-cuda", "torch")
SMI_FIELDS = ("index", "name", "driver_version", "memory.total", "compute_cap", "pci.bus_id")


def nvidia_smi(run: Run = subprocess.run) -> dict[str, str]:
    """The GPUs, the driver's version and the newest CUDA it supports, as nvidia-smi reports them."""
    query = ["nvidia-smi", f"--query-gpu={','.join(SMI_FIELDS)}", "--format=csv,noheader"]
    try:
        done = run(query, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        return {"nvidia-smi": f"not runnable ({type(e).__name__}): {e}"}
    if done.returncode != 0:
        return {"nvidia-smi": f"failed: {run_report.first_line(done.stdout + done.stderr) or done.returncode}"}
    out: dict[str, str] = {}
    for row in csv.reader(line for line in done.stdout.splitlines() if line.strip()):
        f = dict(zip(SMI_FIELDS, (v.strip() for v in row), strict=False))  # an older driver may give fewer
        out["driver"] = f.get("driver_version", "?")
        cap = f.get("compute_cap", "")
        sm = f"sm_{cap.replace('.', '')}" if re.fullmatch(r"\d+\.\d+", cap) else f"compute capability {cap or '?'}"
        out[f"GPU {f.get('index', '?')}"] = (
            f"{f.get('name', '?')}, {sm}, {f.get('memory.total', '?')}, {f.get('pci.bus_id', '?')}"
        )
    try:  # the header of the plain output is the one place that names the driver's CUDA version
        plain = run(["nvidia-smi"], capture_output=True, text=True, timeout=30).stdout
        found = re.search(r"CUDA Version:\s*([\d.]+)", plain or "")
        out["driver supports CUDA"] = found[1] if found else "not shown by nvidia-smi"
    except (OSError, subprocess.SubprocessError):
        pass
    return out or {"nvidia-smi": "listed no GPU"}


# Child process: CUDA initialization is where a broken driver or a missing device fails or hangs.
_TORCH = """
import json, torch
info = {"torch": torch.__version__, "torch CUDA runtime": str(torch.version.cuda),
        "cuda available": str(torch.cuda.is_available())}
if torch.cuda.is_available():
    info["device count"] = str(torch.cuda.device_count())
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        major, minor = torch.cuda.get_device_capability(i)
        gib = p.total_memory / 2**30
        info[f"device {i}"] = f"{p.name}, sm_{major}{minor}, {p.multi_processor_count} SMs, {gib:.0f} GiB"
    info["arch"] = "%d%d" % torch.cuda.get_device_capability(0)
    info["torch archs"] = " ".join(torch.cuda.get_arch_list())
print(json.dumps(info))
"""


def torch_cuda(run: Run = subprocess.run) -> dict[str, str]:
    """torch's view: its version, the CUDA runtime it was built with, each device's name and capability,
    and ``arch`` (device 0's, as BNB_CUDA_ARCHS spells it)."""
    return run_report.child_json(_TORCH, run, timeout=120)


def cuda_diagnostics(run: Run = subprocess.run) -> dict[str, str]:
    """The cuda backend's own diagnostics (library path, archs in it, its static CUDA runtime, the driver,
    the devices it serves) and its status as the core's discovery recorded it."""
    return run_report.backend_diagnostics("cuda", run, timeout=300)


def host() -> dict[str, str]:
    return {"host": f"{platform.system()} {platform.release()} ({platform.machine()}), {os.cpu_count()} CPUs"}


def summary(state: Mapping) -> dict[str, str]:
    """The lines a reader wants first: which GPU, which driver, which runtimes, which archs, how the tests went."""
    smi, tc, diag = state.get("smi", {}), state.get("torch", {}), state.get("diagnostics", {})
    gpus = [v for k, v in smi.items() if k.startswith("GPU ")]
    devices = [v for k, v in tc.items() if k.startswith("device ") and k != "device count"]
    out = {
        "device": "; ".join(gpus or devices) or smi.get("nvidia-smi") or "no GPU seen",
        "driver": f"{smi.get('driver', '?')} (CUDA {smi.get('driver supports CUDA', '?')})",
        "CUDA runtime of torch": f"{tc.get('torch CUDA runtime', tc.get('error', '?'))} (torch {tc.get('torch', '?')})",
        "CUDA runtime of bnb_cuda": diag.get("CUDA runtime (static)", diag.get("error", "?")),
        "archs built": diag.get("archs in the library", "?"),
    }
    totals: dict[str, int] = {}
    for step in state.get("tests", []):
        for k, n in step.get("counts", {}).items():
            totals[k] = totals.get(k, 0) + n
    if "tests" in state:
        bad = [s["step"] for s in state["tests"] if str(s.get("exit")) != "0"]
        counts = ", ".join(f"{n} {k}" for k, n in totals.items()) or "no junit counts"
        out["tests"] = counts + (f"; steps not passing: {', '.join(bad)}" if bad else "; every step passed")
    if "steps" in state:
        out["wall time"] = f"{sum(s.get('seconds', 0) for s in state['steps']):.0f} s over {len(state['steps'])} steps"
    return out


def _bench_module():
    spec = importlib.util.spec_from_file_location("bench_cuda", BENCH_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _us(seconds) -> str:
    return f"{seconds * 1e6:.1f}" if seconds else "—"


def ops_table(rows: list[dict]) -> list[str]:
    """Per op the bandwidth bench_cuda measured: graph time when it could capture, eager else."""
    lines = [
        "| shape | op | µs | GB/s | % peak | timed as | upstream µs | dense torch µs |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        pct = r.get("peak_pct")
        lines.append(
            f"| {r['shape']} | {r['op']} | {_us(r.get('graph_s') or r.get('eager_s'))} | {r.get('gbs', 0):.0f} | "
            f"{f'{pct:.0f}%' if pct is not None else '—'} | {'graph' if r.get('graph_s') else 'eager'} | "
            f"{_us(r.get('upstream_s'))} | {_us(r.get('dense_s'))} |"
        )
    return lines


def matmul_table(bench: dict) -> list[str]:
    """bench_cuda's own 4-bit matmul table, rebuilt from the JSON's raw times (its byte counts, its columns)."""
    ours = bench.get("matmul") or {}
    if not ours:
        return []
    keys = [re.fullmatch(r"(\d+)x(\d+) b(\d+)", k) for k in ours]
    shapes = list(dict.fromkeys((int(m[1]), int(m[2])) for m in keys if m))
    batches = list(dict.fromkeys(int(m[3]) for m in keys if m))
    try:
        module = _bench_module()
        upstream = (bench.get("upstream") or {}).get("matmul", {})
        return module.format_matmul_table(module.matmul_rows(ours, upstream, shapes, batches, bench.get("peak_gbps")))
    except Exception as e:  # the numbers still reach the report, as JSON
        return [f"(matmul table not rendered: {type(e).__name__}: {e})", "", "```json", json.dumps(ours), "```"]


def bench_section(bench: dict) -> list[str]:
    lines = ["", "## Benchmark (bench/bench_cuda.py)", ""]
    if "error" in bench:
        return [*lines, f"Could not read the results: {bench['error']}"]
    peak = bench.get("peak_gbps")
    lines += [f"Peak memory bandwidth {peak:.0f} GB/s." if peak else "Peak memory bandwidth unknown.", ""]
    lines += ["### Per op", "", *ops_table(bench.get("rows", []))]
    mm = matmul_table(bench)
    if mm:
        lines += ["", "### 4-bit matmul (nf4, blocksize 64; dq = double-quantized scales)", "", *mm]
    return lines


def steps_section(steps: list[dict]) -> list[str]:
    lines = ["", "## Steps and their time boxes", "", "| step | exit status | seconds | time box s |"]
    lines.append("|---|---|---|---|")
    for s in steps:
        lines.append(
            f"| {run_report.cell(s['step'])} | {run_report.cell(s['exit'])} | {s['seconds']} | {s['box_s']:.0f} |"
        )
    return lines


def render(state: dict) -> str:
    kv = run_report.kv_table
    lines = [
        "# bitsandbytes on an NVIDIA GPU: report of a CUDA run",
        "",
        f"Written {state['written']} by `ci/cuda/gpu_report.py` (`nox -s tests-cuda`, `nox -s bench-cuda`, "
        "`ci/cuda/device_check.py`). Paste this file into a GitHub issue.",
        "",
        "## Summary",
        "",
        *kv(summary(state)),
        "",
        "## GPU and driver (nvidia-smi)",
        "",
        *kv(state["smi"]),
        "",
        "## torch and versions",
        "",
        *kv({**state["torch"], **state["versions"], **state["host"]}),
        "",
        "## Environment variables",
        "",
        *kv(state["environment"]),
        "",
        "## cuda backend diagnostics",
        "",
        *kv(state["diagnostics"]),
        "",
        *run_report.cli_section(state["cli"]),
    ]
    if "steps" in state:
        lines += steps_section(state["steps"])
    if "tests" in state:
        lines += run_report.tests_section(state["tests"], "Tests")
    if "bench" in state:
        lines += bench_section(state["bench"])
    return "\n".join(lines) + "\n"


def collect(state: dict, run: Run = subprocess.run) -> dict:
    """Refresh the machine part of ``state``."""
    state.update(
        written=run_report.now(),
        smi=nvidia_smi(run),
        torch=torch_cuda(run),
        versions=run_report.versions(DISTRIBUTIONS, run),
        host=host(),
        environment=run_report.environment(ENV_VARS),
        diagnostics=cuda_diagnostics(run),
        cli=run_report.bnb_cli(run, timeout=300),
    )
    return state


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--step", action="append", default=[], help="NAME=EXIT_STATUS of a test step")
    parser.add_argument("--junit", action="append", default=[], help="NAME=PATH of a step's pytest junit xml")
    parser.add_argument("--bench", type=Path, help="bench_cuda.py's JSON results (cuda_bench.json)")
    args = parser.parse_args(argv)

    state = collect(run_report.load_state(args.out))
    if args.step or args.junit:
        pairs = run_report.pairs
        state["tests"] = run_report.step_summaries(pairs(args.junit, "--junit"), pairs(args.step, "--step"))
    if args.bench:
        state["bench"] = run_report.read_bench(args.bench)
    run_report.write(args.out, state, render)
    return 0


if __name__ == "__main__":
    sys.exit(main())
