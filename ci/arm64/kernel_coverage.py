"""pytest plugin (``-p kernel_coverage``, ci/arm64 on PYTHONPATH): counts the calls into each kernel entry
of ``bitsandbytes_cpu._C`` and the ISA level each ran at, so a run shows that every kernel ran at the
level asked for (BNB_CPU_ISA) and not only some of them, or all at another level.

The backend's ops call ``_C.<kernel>(...)`` through the module at each call, so wrapping the module's
functions sees every call, whatever test or op made it. The counts go to the JSON file named by
BNB_KERNEL_COVERAGE (run.py reads it) and to the terminal summary.
"""

from __future__ import annotations

import json
import os
from collections import Counter

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


def pytest_configure(config):
    from bitsandbytes_cpu import _C

    for name in sorted(dir(_C)):
        fn = getattr(_C, name)
        if name.startswith("__") or name in NOT_KERNELS or not callable(fn) or isinstance(fn, type):
            continue
        _kernels.append(name)
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
