"""Structural checks of .github/workflows that actionlint does not make (or that stand in for it where it
cannot be installed): each workflow parses, names its triggers and jobs; every job runs somewhere and has
steps or calls a workflow that exists; `needs` name jobs of the same workflow; every action is pinned to a
ref; the cibuildwheel action is the version the nox session pins; each `nox -s NAME` is a session."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = ROOT / ".github" / "workflows"


def nox_sessions() -> set[str]:
    text = (ROOT / "noxfile.py").read_text()
    named = set(re.findall(r'@nox\.session\([^)]*name="([\w-]+)"', text))
    plain = set(re.findall(r"@nox\.session\s*\n\s*def (\w+)", text))
    return named | plain


def check(path: Path, sessions: set[str], cibuildwheel: str) -> list[str]:
    where = path.relative_to(ROOT)
    doc = yaml.safe_load(path.read_text())
    if not isinstance(doc, dict):
        return [f"{where}: not a mapping"]
    problems = []
    # YAML 1.1 reads the key `on` as True.
    if "on" not in doc and True not in doc:
        problems.append(f"{where}: no `on:` triggers")
    jobs = doc.get("jobs") or {}
    if not jobs:
        problems.append(f"{where}: no jobs")
    for name, job in jobs.items():
        if "uses" in job:
            target = job["uses"]
            if target.startswith("./") and not (ROOT / target).is_file():
                problems.append(f"{where}: job {name} calls {target}, which does not exist")
        elif "runs-on" not in job or not job.get("steps"):
            problems.append(f"{where}: job {name} needs runs-on and steps")
        needs = job.get("needs", [])
        for need in [needs] if isinstance(needs, str) else needs:
            if need not in jobs:
                problems.append(f"{where}: job {name} needs {need!r}, not a job of this workflow")
        for step in job.get("steps", []):
            uses = step.get("uses")
            if uses and not uses.startswith("./") and "@" not in uses:
                problems.append(f"{where}: job {name}: action {uses} is not pinned to a ref")
            if uses and uses.startswith("pypa/cibuildwheel@") and uses != f"pypa/cibuildwheel@v{cibuildwheel}":
                problems.append(f"{where}: job {name}: {uses}, but the nox session pins cibuildwheel {cibuildwheel}")
            for session in re.findall(r"\bnox -s ([\w-]+(?: [\w-]+)*)", step.get("run", "")):
                for s in session.split():
                    if s not in sessions:
                        problems.append(f"{where}: job {name} runs nox session {s!r}, which noxfile.py lacks")
    return problems


def main() -> int:
    if len(sys.argv) != 2:
        sys.exit("usage: check_workflows.py CIBUILDWHEEL_VERSION")
    files = sorted(WORKFLOWS.glob("*.yml")) + sorted(WORKFLOWS.glob("*.yaml"))
    sessions = nox_sessions()
    problems = [p for f in files for p in check(f, sessions, sys.argv[1])]
    for p in problems:
        print(f"error: {p}", file=sys.stderr)
    print(f"{len(files)} workflows checked, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
