"""pytest plugin (``-p kernel_coverage``, ci/arm64 on PYTHONPATH): counts the calls into each kernel entry
of ``bitsandbytes_cpu._C`` and the ISA level each ran at, so a run shows that every kernel ran at the
level asked for (BNB_CPU_ISA) and not only some of them, or all at another level.

The backend's ops call ``_C.<kernel>(...)`` through the module at each call, so wrapping the module's
functions sees every call, whatever test or op made it. The counts go to the JSON file named by
BNB_KERNEL_COVERAGE (run.py reads it) and to the terminal summary.

The kernels counted are _C's functions and, by symbol, every kernel the bindings dispatch per ISA level
(``BNB_DISPATCH(<kernel>, ...)`` in any C++ source of the backend, whatever file it moves to): one that
the installed module lacks is listed with no calls, so a stale build or a binding left out fails the
coverage check instead of shrinking the list.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from pathlib import Path

import pytest

CSRC = Path(__file__).resolve().parents[2] / "packages" / "backends-cpu" / "csrc"
DISPATCH = re.compile(r"\bBNB_DISPATCH\(\s*(\w+)\s*,")

# _C's functions that are queries or settings, not kernels.
NOT_KERNELS = {
    "isa",
    "best_isa",
    "set_isa",
    "supported_isas",
    "compiled_isas",
    "int8_has_vnni",
    "gemv_4bit_bf16_dot",
    "thread_runtime",
    "set_thread_runtime",
    "map_lookup",
    "set_map_lookup",
    "_convert",
}

_counts: Counter = Counter()
_kernels: list[str] = []


def _counting(name, fn, isa):
    def wrapper(*args, **kwargs):
        _counts[(name, isa())] += 1
        return fn(*args, **kwargs)

    wrapper.__name__ = name
    wrapper.__wrapped__ = fn
    return wrapper


def dispatched_kernels() -> set[str]:
    """The kernels the C++ bindings call through BNB_DISPATCH (isa.h, which defines it, names none)."""
    names = {m for path in CSRC.rglob("*.cpp") for m in DISPATCH.findall(path.read_text())}
    if not names:
        raise pytest.UsageError(f"kernel_coverage: no BNB_DISPATCH(<kernel>, ...) in {CSRC}/**/*.cpp")
    return names - NOT_KERNELS


def pytest_configure(config):
    from bitsandbytes_cpu import _C

    names = set(dispatched_kernels())
    for name in dir(_C):
        fn = getattr(_C, name)
        if not (name.startswith("__") or name in NOT_KERNELS or not callable(fn) or isinstance(fn, type)):
            names.add(name)
    for name in sorted(names):
        _kernels.append(name)
        fn = getattr(_C, name, None)
        if fn is not None:  # absent from this build: stays at no calls
            setattr(_C, name, _counting(name, fn, _C.isa))


def report() -> dict:
    levels = sorted({isa for _, isa in _counts})
    per_level = {lv: {k: _counts.get((k, lv), 0) for k in _kernels} for lv in levels}
    return {"kernels": _kernels, "calls": per_level}


def pytest_terminal_summary(terminalreporter):
    data = report()
    tr = terminalreporter
    tr.section("bitsandbytes_cpu kernel calls per ISA level")
    for level, calls in data["calls"].items():
        missing = [k for k, n in calls.items() if n == 0]
        tr.write_line(f"{level}: {len(calls) - len(missing)} of {len(calls)} kernels ran; not run: {missing or 'none'}")
        tr.write_line("  " + ", ".join(f"{k} {n}" for k, n in calls.items()))
    path = os.environ.get("BNB_KERNEL_COVERAGE")
    if path:
        with open(path, "w") as f:
            json.dump(data, f, indent=1)
