"""Test helpers: fake *installed* plugin distributions, and running Python in a clean subprocess.

A ``<name>-<version>.dist-info`` folder with METADATA and entry_points.txt on ``sys.path`` is exactly
what ``pip install`` leaves behind, so ``importlib.metadata`` finds these plugins the way it finds
real ones. Plugins register kernels process-wide, so every plugin test runs in its own interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

MARK = "@@RESULT@@"


def make_dist(site: Path, dist: str, version: str, entry_points: dict[str, str], modules: dict[str, str]) -> Path:
    """Write a distribution with ``bitsandbytes.backends`` entry points, and its modules, into ``site``."""
    site.mkdir(parents=True, exist_ok=True)
    info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    lines = ["[bitsandbytes.backends]", *(f"{name} = {target}" for name, target in entry_points.items())]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    for module, source in modules.items():
        (site / f"{module}.py").write_text(textwrap.dedent(source))
    return site


def run_python(args: list[str], site: Path | None, **env: str) -> subprocess.CompletedProcess:
    """Run ``python *args`` with ``site`` on the path and only the BNB_* variables given here."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("BNB_") and k != "PYTHONWARNINGS"}
    if site is not None:
        environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), environ.get("PYTHONPATH")]))
    environ.update(env)
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=environ, timeout=120)


def run_snippet(code: str, site: Path | None, **env: str) -> dict:
    """Run ``code`` (which calls ``emit(obj)``) in a fresh interpreter and return ``obj``."""
    prelude = f"import json\ndef emit(obj):\n    print({MARK!r} + json.dumps(obj))\n"
    proc = run_python(["-c", prelude + textwrap.dedent(code)], site, **env)
    for line in proc.stdout.splitlines():
        if line.startswith(MARK):
            return json.loads(line[len(MARK) :])
    raise AssertionError(f"snippet failed (rc={proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
