"""The device-neutral half of the run reports (``packages/backends-mps/tests/mac_report.py`` for a Mac,
``ci/cuda/gpu_report.py`` for an NVIDIA GPU): pytest's junit files turned into counts, node ids, first
error lines and skip reasons; steps run under a time box with their exit status kept; the environment
variables and versions worth showing; ``python -m bitsandbytes`` and a backend's diagnostics captured in
a child process; the markdown pieces both reports are made of, and the JSON beside each report that lets
a later call (the bench after the tests) add its section without losing the earlier ones.

It lives in ci/, not in the wheel: it reports a checkout's run. The report scripts import it by path
(``sys.path`` gets this folder), so it needs nothing but the standard library.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

Run = Callable[..., subprocess.CompletedProcess]


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def first_line(text: str | None, limit: int = 240) -> str:
    line = next((s.strip() for s in (text or "").splitlines() if s.strip()), "")
    return line if len(line) <= limit else line[: limit - 3] + "..."


def versions(distributions: Iterable[str], run: Run = subprocess.run) -> dict[str, str]:
    """Python, the given distributions' versions and the checkout's commit."""
    out = {"Python": f"{platform.python_version()} ({platform.python_implementation()}) {sys.executable}"}
    for dist in distributions:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    try:
        done = run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        out["checkout"] = done.stdout.strip() if done.returncode == 0 else "not a git checkout"
    except (OSError, subprocess.SubprocessError):
        out["checkout"] = "git not found"
    return out


def environment(names: Iterable[str], environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """Each variable named, set or not: an unset one matters as much as a set one."""
    return {name: environ[name] if name in environ else "unset" for name in names}


def child_json(code: str, run: Run = subprocess.run, timeout: float = 600) -> dict[str, str]:
    """Run ``code`` in a child interpreter and read the JSON object on its last line of output. A crash in
    there (a driver, a compiler) costs the report this one section, which then holds the reason."""
    try:
        done = run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError) as e:
        return {"error": f"could not run: {type(e).__name__}: {e}"}
    lines = done.stdout.strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, ValueError):
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"the diagnostics process ended with status {done.returncode}: {tail}"}


# Loading a backend compiles sources or starts a driver; in a child process a crash there costs the report
# this section only.
_BACKEND_DIAGNOSTICS = """
import json
import bitsandbytes.backends as backends
from {module} import plugin
record = next((r for r in backends.records() if r.name == {name!r}), None)
info = {{"backend status": record.summary() if record else "no {name!r} entry point found"}}
info.update({{k: str(v) for k, v in plugin.backend.diagnostics().items()}})
print(json.dumps(info))
"""


def backend_diagnostics(name: str, run: Run = subprocess.run, timeout: float = 600) -> dict[str, str]:
    """Backend ``name``'s own diagnostics (``bitsandbytes_<name>.plugin``) and its status as the core's
    discovery recorded it, read in a child interpreter."""
    return child_json(_BACKEND_DIAGNOSTICS.format(module=f"bitsandbytes_{name}", name=name), run, timeout=timeout)


def bnb_cli(run: Run = subprocess.run, timeout: float = 600) -> str:
    """The output of ``python -m bitsandbytes`` in this interpreter."""
    try:
        done = run([sys.executable, "-m", "bitsandbytes"], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError) as e:
        return f"python -m bitsandbytes could not run: {type(e).__name__}: {e}"
    return (done.stdout + done.stderr).rstrip() + f"\n(exit status {done.returncode})"


# ---------------------------------------------------------------------------------------- steps


def run_step(
    name: str,
    argv: Sequence[str],
    box_s: float,
    log: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> dict:
    """Run one step under a time box, its output appended to ``log``. Past the box the step's whole
    process group is killed (pytest's workers, nvcc's children too), so one hung kernel cannot eat the
    time of the steps after it. Returns {step, exit, seconds, box_s}; ``exit`` is the exit status, or
    "timed out after N s"."""
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with log.open("a") as out:
        out.write(f"\n===== {name} (time box {box_s:.0f} s): {' '.join(map(str, argv))}\n")
        out.flush()
        try:
            proc = subprocess.Popen(
                list(map(str, argv)),
                stdout=out,
                stderr=subprocess.STDOUT,
                env=None if env is None else dict(env),
                cwd=cwd,
                start_new_session=True,  # its own process group, to kill as one
            )
        except OSError as e:
            out.write(f"could not start: {e}\n")
            return {"step": name, "exit": f"could not start: {e}", "seconds": 0.0, "box_s": box_s}
        try:
            code: int | str = proc.wait(timeout=box_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = f"timed out after {box_s:.0f} s"
        seconds = round(time.monotonic() - start, 1)
        out.write(f"===== {name}: exit {code} in {seconds} s\n")
    return {"step": name, "exit": code, "seconds": seconds, "box_s": box_s}


# ---------------------------------------------------------------------------------------- junit


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
            first = first_line(what.get("message")) or first_line(what.text)
            failures.append({"node": _node_id(case), "error": first, "kind": what.tag})
        elif skipped is not None:
            counts["skipped"] += 1
            skips[first_line(skipped.get("message")) or "(no reason given)"] += 1
        else:
            counts["passed"] += 1
    return {"counts": dict(counts), "seconds": round(seconds, 1), "failures": failures, "skips": skips.most_common()}


def pairs(items: list[str], what: str) -> list[tuple[str, str]]:
    """``NAME=VALUE`` arguments as (name, value), split at the last '='."""
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


# ---------------------------------------------------------------------------------------- markdown


def cell(value) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def kv_table(rows: Mapping[str, str]) -> list[str]:
    return ["| | |", "|---|---|", *(f"| {cell(k)} | {cell(v)} |" for k, v in rows.items())]


def cli_section(cli: str) -> list[str]:
    return ["<details><summary><code>python -m bitsandbytes</code></summary>", "", "```text", cli, "```", "",
            "</details>"]  # fmt: skip


def tests_section(steps: list[dict], title: str) -> list[str]:
    """The steps' table (exit status, pytest's counts, seconds), then per step what is missing, each
    failure under its node id, and the skip reasons folded."""
    lines = ["", f"## {title}", ""]
    lines += [
        "| step | exit status | passed | failed | errors | skipped | seconds |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in steps:
        c = s.get("counts", {})
        cols = [c.get(k, "-") for k in ("passed", "failed", "errors", "skipped")] + [s.get("seconds", "-")]
        lines.append(f"| {cell(s['step'])} | {cell(s['exit'])} | " + " | ".join(map(str, cols)) + " |")
    for s in steps:
        if "missing" in s:
            lines += ["", f"**{s['step']}**: {s['missing']} (exit status {s['exit']})."]
        if s.get("failures"):
            lines += ["", f"### Failures: {s['step']}", ""]
            lines += [f"- `{f['node']}` ({f['kind']}): {f['error']}" for f in s["failures"]]
        if s.get("skips"):
            lines += ["", f"<details><summary>Skip reasons: {cell(s['step'])}</summary>", ""]
            lines += [f"- {n} x {reason}" for reason, n in s["skips"]]
            lines += ["", "</details>"]
    return lines


def load_state(out: Path) -> dict:
    """What earlier calls collected for the report at ``out`` (its .json), or nothing."""
    store = out.with_suffix(".json")
    try:
        return json.loads(store.read_text()) if store.is_file() else {}
    except ValueError:  # a half-written file from a killed run: start over rather than fail the report
        return {}


def write(out: Path, state: dict, render: Callable[[dict], str]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(state, indent=1))
    out.write_text(render(state))
    print(f"report written to {out}")


def read_bench(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        return {"rows": [], "complete": False, "error": f"{path}: {e}"}
