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
anywhere (off a Mac the chip reads "not a Mac"), so it is tested on Linux with faked inputs.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Callable, Mapping
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
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

Run = Callable[..., subprocess.CompletedProcess]


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
        return f"xcrun metal failed: {_first_line(done.stderr) or f'exit status {done.returncode}'}"
    return _first_line(done.stdout) or "no version printed"


def versions(run: Run = subprocess.run) -> dict[str, str]:
    """Python, the distributions that matter and the checkout's commit."""
    out = {"Python": f"{platform.python_version()} ({platform.python_implementation()}) {sys.executable}"}
    for dist in DISTRIBUTIONS:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    try:
        import torch

        mps = torch.backends.mps
        out["torch MPS"] = f"available: {mps.is_available()}, built: {mps.is_built()}"
    except Exception as e:  # a broken torch is worth reporting, not a reason to lose the report
        out["torch MPS"] = f"torch failed to import: {type(e).__name__}: {e}"
    try:
        done = run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        out["checkout"] = done.stdout.strip() if done.returncode == 0 else "not a git checkout"
    except (OSError, subprocess.SubprocessError):
        out["checkout"] = "git not found"
    return out


def environment(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    return {name: environ[name] if name in environ else "unset" for name in ENV_VARS}


# Run in a child process: loading the backend compiles Metal sources, and a compiler or driver crash there
# must cost the report this section only.
_DIAGNOSTICS = """
import json
import bitsandbytes.backends as backends
from bitsandbytes_mps import plugin
record = next((r for r in backends.records() if r.name == "mps"), None)
info = {"backend status": record.summary() if record else "no 'mps' entry point found"}
info.update({k: str(v) for k, v in plugin.backend.diagnostics().items()})
print(json.dumps(info))
"""


def mps_diagnostics(run: Run = subprocess.run) -> dict[str, str]:
    """The mps backend's own diagnostics (load path, the reason each other path was passed over, the ops on
    Metal kernels and on the reference) and its status as the core's discovery recorded it."""
    try:
        done = run([sys.executable, "-c", _DIAGNOSTICS], capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.SubprocessError) as e:
        return {"error": f"could not run: {type(e).__name__}: {e}"}
    lines = done.stdout.strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, ValueError):
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"the diagnostics process ended with status {done.returncode}: {tail}"}


def bnb_cli(run: Run = subprocess.run) -> str:
    """The output of ``python -m bitsandbytes`` in this interpreter."""
    try:
        done = run([sys.executable, "-m", "bitsandbytes"], capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.SubprocessError) as e:
        return f"python -m bitsandbytes could not run: {type(e).__name__}: {e}"
    return (done.stdout + done.stderr).rstrip() + f"\n(exit status {done.returncode})"


def _first_line(text: str | None, limit: int = 240) -> str:
    line = next((s.strip() for s in (text or "").splitlines() if s.strip()), "")
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _node_id(case: ET.Element) -> str:
    """pytest's node id from a junit testcase: ``file::Class::name`` (xunit1 gives ``file``)."""
    classname, name, file = case.get("classname", ""), case.get("name", ""), case.get("file")
    if not file:
        return f"{classname}::{name}" if classname else name
    module = file[: -len(".py")].replace("/", ".") if file.endswith(".py") else file
    inner = classname[len(module) + 1 :] if classname.startswith(module + ".") else ""
    return "::".join([file, *filter(None, inner.split(".")), name])


def junit_summary(path: Path) -> dict:
    """Counts, failures (node id, first line of the error) and skip reasons of one pytest junit file."""
    if not path.is_file():
        return {"missing": f"no results file {path}: the run ended before pytest wrote it"}
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as e:
        return {"missing": f"unreadable results file {path}: {e}"}
    counts = Counter(passed=0, failed=0, errors=0, skipped=0)
    failures, skips, seconds = [], Counter(), 0.0
    for suite in root.iter("testsuite"):
        seconds += float(suite.get("time", 0) or 0)
    for case in root.iter("testcase"):
        failed, error, skipped = case.find("failure"), case.find("error"), case.find("skipped")
        if failed is not None or error is not None:
            what = failed if failed is not None else error
            counts["failed" if failed is not None else "errors"] += 1
            first = _first_line(what.get("message")) or _first_line(what.text)
            failures.append({"node": _node_id(case), "error": first, "kind": what.tag})
        elif skipped is not None:
            counts["skipped"] += 1
            skips[_first_line(skipped.get("message")) or "(no reason given)"] += 1
        else:
            counts["passed"] += 1
    return {"counts": dict(counts), "seconds": round(seconds, 1), "failures": failures, "skips": skips.most_common()}


def _pairs(items: list[str], what: str) -> list[tuple[str, str]]:
    out = []
    for item in items:
        name, sep, value = item.rpartition("=")
        if not sep or not name:
            raise SystemExit(f"{what} must be NAME=VALUE, got {item!r}")
        out.append((name, value))
    return out


def step_summaries(junits: list[tuple[str, str]], statuses: list[tuple[str, str]]) -> list[dict]:
    """One entry per step, in the order given: its exit status and its junit summary when it has one."""
    status = dict(statuses)
    names = list(dict.fromkeys([n for n, _ in statuses] + [n for n, _ in junits]))
    files = dict(junits)
    return [
        {"step": n, "exit": status.get(n, "?"), **(junit_summary(Path(files[n])) if n in files else {})} for n in names
    ]


def _cell(value) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def _kv_table(rows: Mapping[str, str]) -> list[str]:
    return ["| | |", "|---|---|", *(f"| {_cell(k)} | {_cell(v)} |" for k, v in rows.items())]


def _bench_table(bench: dict) -> list[str]:
    try:
        spec = importlib.util.spec_from_file_location("bench_mps", BENCH_SCRIPT)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.table(bench.get("rows", []))
    except Exception as e:  # the numbers still reach the report, as JSON
        return [f"(table not rendered: {type(e).__name__}: {e})", "", "```json", json.dumps(bench, indent=1), "```"]


def render(state: dict) -> str:
    lines = [
        "# bitsandbytes on Apple Silicon: report of a Mac run",
        "",
        f"Written {state['written']} by `packages/backends-mps/tests/mac_report.py` "
        "(`nox -s tests-mps`, `nox -s bench-mps`). Paste this file into a GitHub issue.",
        "",
        "## Machine and versions",
        "",
        *_kv_table({**state["machine"], **state["versions"]}),
        "",
        "## Environment variables",
        "",
        *_kv_table(state["environment"]),
        "",
        "## mps backend diagnostics",
        "",
        *_kv_table(state["diagnostics"]),
        "",
        "<details><summary><code>python -m bitsandbytes</code></summary>",
        "",
        "```text",
        state["cli"],
        "```",
        "",
        "</details>",
    ]
    if "tests" in state:
        lines += ["", "## Tests (`nox -s tests-mps`)", ""]
        lines += [
            "| step | exit status | passed | failed | errors | skipped | seconds |",
            "|---|---|---|---|---|---|---|",
        ]
        for s in state["tests"]:
            c = s.get("counts", {})
            cols = [c.get(k, "-") for k in ("passed", "failed", "errors", "skipped")] + [s.get("seconds", "-")]
            lines.append(f"| {_cell(s['step'])} | {s['exit']} | " + " | ".join(map(str, cols)) + " |")
        for s in state["tests"]:
            if "missing" in s:
                lines += ["", f"**{s['step']}**: {s['missing']} (exit status {s['exit']})."]
            if s.get("failures"):
                lines += ["", f"### Failures: {s['step']}", ""]
                lines += [f"- `{f['node']}` ({f['kind']}): {f['error']}" for f in s["failures"]]
            if s.get("skips"):
                lines += ["", f"<details><summary>Skip reasons: {_cell(s['step'])}</summary>", ""]
                lines += [f"- {n} x {reason}" for reason, n in s["skips"]]
                lines += ["", "</details>"]
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

    store = args.out.with_suffix(".json")
    state = json.loads(store.read_text()) if store.is_file() else {}
    state.update(
        written=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        machine=machine(),
        versions=versions(),
        environment=environment(),
        diagnostics=mps_diagnostics(),
        cli=bnb_cli(),
    )
    if args.step or args.junit:
        state["tests"] = step_summaries(_pairs(args.junit, "--junit"), _pairs(args.step, "--step"))
    if args.bench:
        try:
            state["bench"] = json.loads(args.bench.read_text())
        except (OSError, ValueError) as e:
            state["bench"] = {"rows": [], "complete": False, "error": f"{args.bench}: {e}"}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    store.write_text(json.dumps(state, indent=1))
    args.out.write_text(render(state))
    print(f"report written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
