"""Gathering what ``python -m bitsandbytes`` prints, and printing it as aligned text."""

from __future__ import annotations

import platform
import sys
from collections.abc import Iterable, Sequence
from importlib import metadata

import torch

from ..backends import API_VERSION, GROUP, devices, dispatch, records
from ..backends.devices import EXTRAS, install_hint, is_rocm
from ..backends.discovery import LOADED, BackendRecord, missing_accelerators
from ..backends.platforms import current, describe, extras_status


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


def table(header: Sequence[str] | None, rows: Iterable[Sequence[str]], indent: str = "  ") -> list[str]:
    """Left-aligned columns (``header=None``: no header line); the last column is not padded."""
    body = [list(map(str, r)) for r in rows]
    lines = body if header is None else [list(header), *body]
    if not lines:
        return []
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    return [
        (indent + "  ".join([c.ljust(w) for c, w in zip(line[:-1], widths[:-1], strict=True)] + [line[-1]])).rstrip()
        for line in lines
    ]


def _dist(record: BackendRecord) -> str:
    return f"{record.dist} {record.dist_version}" if record.dist else "(no distribution)"


def device_columns(recs: Sequence[BackendRecord]) -> tuple[str, ...]:
    extra = sorted({t for r in recs for t in r.device_types} - set(dispatch.DEFAULT_DEVICE_TYPES))
    return (*dispatch.DEFAULT_DEVICE_TYPES, *extra)


def _environment() -> list[str]:
    rows = [
        ("python", f"{platform.python_version()} ({platform.python_implementation()}) {sys.executable}"),
        ("platform", platform.platform()),
        ("torch", torch.__version__),
        *[(f"  {name}", state) for name, state in _accelerator_lines()],
    ]
    return ["", "Environment", *table(None, rows)]


def _backends(recs: Sequence[BackendRecord], verbose: bool, problems: list[str]) -> list[str]:
    out = ["", f"Backends (entry points in the group {GROUP!r})"]
    if not recs:
        return [*out, "  none installed: every op runs the core's reference kernels"]
    rows = [(r.name, _dist(r), r.kind, ",".join(r.device_types) or "-", r.summary()) for r in recs]
    out += table(("name", "distribution", "kind", "devices", "status"), rows)
    for r in recs:
        if r.failed:
            problems.append(f"backend {r.name!r} failed: {r.reason}")
            if verbose and r.traceback:
                out += ["", f"  traceback of {r.name!r}:", *("    " + line for line in r.traceback.splitlines())]
        if r.status == LOADED and r.backend is not None:
            info = r.diagnostics()
            if "error" in info:
                problems.append(f"backend {r.name!r}: {info['error']}")
            if info:
                out += ["", f"  diagnostics of {r.name!r}:"]
                out += table(None, sorted((str(k), str(v)) for k, v in info.items()), indent="    ")
    return out


def _coverage(recs: Sequence[BackendRecord], problems: list[str]) -> list[str]:
    columns = device_columns(recs)
    cover = dispatch.coverage(columns)
    providers = {kernel: r.name for r in recs for kernel in r.kernels}
    rows = []
    for op, cells in cover.items():
        rows.append([op, *(_cell(cells[t], providers.get((op, t))) for t in columns)])
        nowhere = [t for t in columns if cells[t] == dispatch.MISSING]
        if nowhere:
            problems.append(f"op {op} has no kernel on {', '.join(nowhere)} (no reference kernel registered)")
    totals = [f"{sum(c[t] == dispatch.NATIVE for c in cover.values())}/{len(cover)}" for t in columns]
    out = ["", "Coverage (native: a backend's kernel; reference: the core's pure-PyTorch kernel)"]
    return out + table(("op", *columns), [*rows, ["native total", *totals]])


def _cell(state: str, provider: str | None) -> str:
    return f"{state} ({provider})" if state == dispatch.NATIVE and provider else state


def _accelerators(recs: Sequence[BackendRecord]) -> list[str]:
    present = devices.accelerators()
    out = ["", "Accelerators: " + (", ".join(present) if present else "none (CPU only)")]
    for device in missing_accelerators(recs):
        out.append(f"  {device}: no backend installed; the reference kernels run on it. Fix: {install_hint(device)}")
    if not any("cpu" in r.device_types for r in recs if r.status == LOADED):
        out.append(f"  cpu: reference kernels only; native CPU kernels: pip install 'bitsandbytes[{EXTRAS['cpu']}]'")
    return out


def _extras() -> list[str]:
    # pip skips an extra whose marker excludes this platform without a word: say so here.
    rows = [(s.extra, s.state, s.message) for s in extras_status()]
    return ["", f"Extras of bitsandbytes on this platform ({describe(*current())})", *table(None, rows)]


def render(verbose: bool = False) -> tuple[list[str], list[str]]:
    """The report's lines, and the problems found (empty when nothing is broken)."""
    from .. import __version__

    recs = records()
    problems: list[str] = []
    title = f"bitsandbytes {__version__} (distribution {_version('bitsandbytes')}, plugin API {API_VERSION})"
    lines = [title, *_environment(), *_backends(recs, verbose, problems), *_coverage(recs, problems)]
    return lines + _accelerators(recs) + _extras(), problems
