"""Gathering what ``python -m bitsandbytes`` prints, and printing it as aligned text."""

from __future__ import annotations

import platform
import sys
from collections.abc import Iterable, Sequence
from importlib import metadata

import torch

from ..backends import API_VERSION, dispatch, records
from ..backends import devices
from ..backends.devices import EXTRAS, install_hint, is_rocm
from ..backends.discovery import BackendRecord, missing_accelerators


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def _accelerator_lines() -> list[tuple[str, str]]:
    cuda_build = f"ROCm {torch.version.hip}" if is_rocm() else f"CUDA {torch.version.cuda}"
    rows = []
    if torch.version.cuda is None and not is_rocm():
        rows.append(("cuda", "this torch build has no CUDA support"))
    elif torch.cuda.is_available():
        names = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
        rows.append(("cuda", f"available ({cuda_build}): {names}"))
    else:
        rows.append(("cuda", f"not available (torch built with {cuda_build}; no usable GPU or driver)"))
    mps = getattr(torch.backends, "mps", None)
    rows.append(("mps", "available" if mps is not None and mps.is_available() else "not available"))
    xpu = getattr(torch, "xpu", None)
    rows.append(("xpu", "available" if xpu is not None and xpu.is_available() else "not available"))
    return rows


def table(header: Sequence[str], rows: Iterable[Sequence[str]], indent: str = "  ") -> list[str]:
    """Left-aligned columns; the last column is not padded (it may be a long message)."""
    rows = [list(map(str, r)) for r in rows]
    widths = [max(len(str(h)), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    lines = []
    for row in [list(header), *rows]:
        cells = [c.ljust(w) for c, w in zip(row[:-1], widths[:-1], strict=True)] + [row[-1]]
        lines.append((indent + "  ".join(cells)).rstrip())
    return lines


def _dist(record: BackendRecord) -> str:
    return f"{record.dist} {record.dist_version}" if record.dist else "(no distribution)"


def device_columns(recs: Sequence[BackendRecord]) -> tuple[str, ...]:
    extra = sorted({t for r in recs for t in r.device_types} - set(dispatch.DEFAULT_DEVICE_TYPES))
    return (*dispatch.DEFAULT_DEVICE_TYPES, *extra)


def render(verbose: bool = False) -> tuple[list[str], list[str]]:
    """The report's lines, and the problems found (empty when nothing is broken)."""
    import bitsandbytes

    recs = records()
    problems: list[str] = []
    out = [f"bitsandbytes {bitsandbytes.__version__} (distribution {_version('bitsandbytes')}, plugin API {API_VERSION})"]
    out += ["", "Environment"]
    out += table(
        ("", ""),
        [
            ("python", f"{platform.python_version()} ({platform.python_implementation()}) {sys.executable}"),
            ("platform", platform.platform()),
            ("torch", torch.__version__),
            *[(f"  {name}", state) for name, state in _accelerator_lines()],
        ],
    )[1:]

    out += ["", f"Backends (entry points in the group {bitsandbytes.backends.GROUP!r})"]
    if not recs:
        out.append("  none installed: every op runs the core's reference kernels")
    else:
        rows = []
        for r in recs:
            rows.append((r.name, _dist(r), r.kind, ",".join(r.device_types) or "-", r.summary()))
            if r.failed:
                problems.append(f"backend {r.name!r} failed: {r.reason}")
        out += table(("name", "distribution", "kind", "devices", "status"), rows)
        for r in recs:
            if r.failed and verbose and r.traceback:
                out += ["", f"  traceback of {r.name!r}:"] + ["    " + line for line in r.traceback.splitlines()]
            if r.status == "loaded" and r.backend is not None:
                info = r.diagnostics()
                if "error" in info:
                    problems.append(f"backend {r.name!r}: {info['error']}")
                if info:
                    out += ["", f"  diagnostics of {r.name!r}:"]
                    out += table(("", ""), sorted((str(k), str(v)) for k, v in info.items()), indent="    ")[1:]

    columns = device_columns(recs)
    cover = dispatch.coverage(columns)
    providers = {(op, t): r.name for r in recs for op, t in r.kernels}
    out += ["", "Coverage (native: a backend's kernel; reference: the core's pure-PyTorch kernel)"]
    rows = []
    for op, cells in cover.items():
        row = [op]
        for t in columns:
            state = cells[t]
            who = providers.get((op, t))
            row.append(f"{state} ({who})" if state == dispatch.NATIVE and who else state)
        rows.append(row)
        nowhere = [t for t in columns if cells[t] == dispatch.MISSING]
        if nowhere:
            problems.append(f"op {op} has no kernel on {', '.join(nowhere)} (no reference kernel registered)")
    totals = ["native total"] + [f"{sum(c[t] == dispatch.NATIVE for c in cover.values())}/{len(cover)}" for t in columns]
    out += table(("op", *columns), [*rows, totals])

    present = devices.accelerators()
    missing = missing_accelerators(recs)
    out += ["", "Accelerators: " + (", ".join(present) if present else "none (CPU only)")]
    for device in missing:
        out.append(f"  {device}: no backend installed; the reference kernels run on it. Fix: {install_hint(device)}")
    if not any("cpu" in r.device_types for r in recs if r.status == "loaded"):
        out.append(f"  cpu: reference kernels only; for native CPU kernels: pip install 'bitsandbytes[{EXTRAS['cpu']}]'")
    return out, problems
