"""Finding, validating and loading backend plugins (entry-point group ``bitsandbytes.backends``).

Runs once, at ``import bitsandbytes``. A plugin can never break that import: whatever goes wrong is
recorded in its :class:`BackendRecord`, warned about once, and its kernel registrations are undone,
unless ``BNB_STRICT_BACKENDS=1`` asks for a hard error (CI wants that).
"""

from __future__ import annotations

import os
import traceback
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import torch

from .._ops import LIB, OPS
from . import devices, dispatch
from .plugin import API_VERSION, Backend, parse_api_version, validate

GROUP = "bitsandbytes.backends"
_HERE = os.path.dirname(os.path.abspath(__file__))


class BackendLoadWarning(UserWarning):
    """A backend plugin was skipped because it is broken (raised, wrong API version, unknown op...)."""


class MissingBackendWarning(UserWarning):
    """An accelerator is present but no installed backend registers kernels for it."""


class BackendLoadError(RuntimeError):
    """Raised at import instead of :class:`BackendLoadWarning` when ``BNB_STRICT_BACKENDS=1``."""


class _Rejected(Exception):
    """A plugin that loaded but broke the rules; the message is the whole story (no traceback)."""


LOADED = "loaded"
SKIPPED = "skipped"  # on purpose: not selected, or not available on this machine
FAILED = "failed"  # broken: the reason says why
UNAVAILABLE = "not available on this machine (is_available() returned false)"


@dataclass
class BackendRecord:
    """What happened to one entry point."""

    name: str  # the entry point's name; what BNB_BACKENDS selects by
    target: str  # the entry point's "module:attr"
    dist: str | None = None
    dist_version: str | None = None
    kind: str = "-"  # "callable" or "Backend" once the target is imported
    status: str = SKIPPED
    reason: str = ""  # one line, set unless loaded
    traceback: str = ""  # full traceback when the plugin raised
    api_version: str | None = None
    device_types: tuple[str, ...] = ()  # claimed by a Backend, or seen in the dispatcher for a callable
    kernels: tuple[tuple[str, str], ...] = ()  # (op, device type) registered by this plugin
    backend: Any = field(default=None, repr=False)  # the Backend object, for diagnostics()

    @property
    def failed(self) -> bool:
        return self.status == FAILED

    def summary(self) -> str:
        return self.status if not self.reason else f"{self.status}: {self.reason}"

    def diagnostics(self) -> dict:
        """The Backend's own ``diagnostics()``; ``{"error": ...}`` when that raises."""
        if self.backend is None:
            return {}
        try:
            return self.backend.diagnostics()
        except Exception as exc:
            return {"error": f"diagnostics() raised {type(exc).__name__}: {exc}"}


# Filled by load_backends(): one record per entry point, in load order.
RECORDS: list[BackendRecord] = []
_loaded = False


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def selection(value: str | None) -> set[str] | None:
    """``BNB_BACKENDS`` -> names to load; ``None`` means all, an empty set means none."""
    if value is None or not value.strip():
        return None
    names = {part.strip() for part in value.split(",") if part.strip()}
    return set() if names == {"none"} else names


@contextmanager
def _new_libraries() -> Iterator[list[torch.library.Library]]:
    """Collect every ``torch.library.Library`` created inside the block (all registrations go through one).

    This is what lets a rejected plugin's registrations be undone.
    """
    created: list[torch.library.Library] = []
    cls = torch.library.Library
    original = cls.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        created.append(self)

    cls.__init__ = init
    try:
        yield created
    finally:
        cls.__init__ = original


def _undo(libraries: Iterable[torch.library.Library]) -> None:
    # Only our namespace: a plugin may have imported other libraries (torchvision, ...) whose ops
    # must survive the plugin's rejection.
    for lib in libraries:
        if lib.ns == LIB:
            lib._destroy()


def _where(exc: BaseException) -> str:
    # The innermost frame of the plugin's own code; the import machinery's frames say nothing.
    frames = [
        f
        for f in traceback.extract_tb(exc.__traceback__)
        if not f.filename.startswith(("<", _HERE)) and os.sep + "importlib" + os.sep not in f.filename
    ]
    if not frames:
        return ""
    last = frames[-1]
    return f" (at {os.path.basename(last.filename)}:{last.lineno})"


def _dist_of(ep: metadata.EntryPoint) -> tuple[str | None, str | None]:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return None, None
    return dist.metadata["Name"], dist.version


# The backends published with the core, by distribution -> the core's extra that installs each.
_FIRST_PARTY = {"bitsandbytes-cpu": "cpu", "bitsandbytes-cuda": "cuda", "bitsandbytes-mps": "mps"}


def _api_mismatch(record: BackendRecord, wanted: str) -> str:
    mine, theirs = parse_api_version(API_VERSION)[0], parse_api_version(wanted)[0]
    dist = record.dist or record.name
    extra = _FIRST_PARTY.get(dist)
    if extra is not None:
        # Our own backends release in lockstep with the core: the extra reinstalls a matching pair.
        fix = f"pip install -U 'bitsandbytes[{extra}]'"
    elif theirs < mine:
        fix = f"pip install -U {dist}"  # the plugin predates this core
    else:
        fix = "pip install -U bitsandbytes"  # the plugin is newer than this core
    return (
        f"plugin API {wanted} does not match this bitsandbytes ({_core_version()}), which speaks plugin API "
        f"{API_VERSION}; the major versions must agree. Fix: {fix}"
    )


def _core_version() -> str:
    try:
        return metadata.version("bitsandbytes")
    except metadata.PackageNotFoundError:
        return "not installed"


def _load_target(ep: metadata.EntryPoint, record: BackendRecord) -> bool:
    """Import and run the entry point; false when a Backend says it is not available here."""
    target = ep.load()
    if isinstance(target, type) and issubclass(target, Backend):
        target = target()
    if isinstance(target, Backend):
        record.kind = "Backend"
        record.backend = target
        try:
            validate(target)
        except ValueError as exc:
            raise _Rejected(str(exc)) from None
        record.api_version = target.api_version
        record.device_types = target.device_types
        if parse_api_version(target.api_version)[0] != parse_api_version(API_VERSION)[0]:
            raise _Rejected(_api_mismatch(record, target.api_version))
        if not target.is_available():
            return False
        target.load()
        return True
    if callable(target):
        record.kind = "callable"
        target()
        return True
    raise _Rejected(
        f"entry point {ep.value} is a {type(target).__name__}, neither a callable nor a bitsandbytes.backends.Backend"
    )


def _check_registrations(record: BackendRecord, before: dispatch.Snapshot, after: dispatch.Snapshot) -> None:
    known = set(OPS)
    new = after.kernels - before.kernels
    unknown = sorted((after.ops - before.ops - known) | {op for op, _ in new if op not in known})
    if unknown:
        names = ", ".join(f"{LIB}::{op}" for op in unknown)
        raise _Rejected(f"registers kernels for ops that bitsandbytes does not define: {names}")
    kernels = sorted((op, dispatch.device_type(key)) for op, key in new)
    seen = tuple(sorted({t for _, t in kernels}))
    if record.kind == "Backend":
        stray = sorted(set(seen) - set(record.device_types))
        if stray:
            raise _Rejected(
                f"registers kernels for device types it does not claim: {', '.join(stray)} "
                f"(device_types={list(record.device_types)})"
            )
    else:
        record.device_types = seen
    record.kernels = tuple(kernels)


def load_one(ep: metadata.EntryPoint, selected: set[str] | None = None) -> BackendRecord:
    """Load one entry point into a record; never raises for a broken plugin."""
    record = BackendRecord(ep.name, ep.value)
    try:
        record.dist, record.dist_version = _dist_of(ep)
    except Exception:  # malformed metadata is the plugin's problem, not the import's
        pass
    if selected is not None and ep.name not in selected:
        record.reason = "not selected by BNB_BACKENDS"
        return record
    before = dispatch.snapshot()
    with _new_libraries() as libraries:
        try:
            loaded = _load_target(ep, record)
            _check_registrations(record, before, dispatch.snapshot())
            if loaded:
                record.status = LOADED
            else:
                record.reason = UNAVAILABLE
        except _Rejected as exc:
            record.status, record.reason = FAILED, str(exc)
        except (Exception, SystemExit) as exc:
            record.status = FAILED
            record.reason = f"{type(exc).__name__}: {exc}{_where(exc)}"
            record.traceback = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    if record.failed:
        _undo(libraries)
        record.kernels = ()
    return record


def _entry_points() -> list[metadata.EntryPoint]:
    return sorted(metadata.entry_points(group=GROUP), key=lambda ep: (ep.name, ep.value))


def load_backends(entry_points: Iterable[metadata.EntryPoint] | None = None) -> list[BackendRecord]:
    """Discover and load every backend plugin once; later calls return the same records."""
    global _loaded
    if _loaded and entry_points is None:
        return RECORDS
    _loaded = True
    strict = _truthy(os.environ.get("BNB_STRICT_BACKENDS"))
    selected = selection(os.environ.get("BNB_BACKENDS"))
    eps = _entry_points() if entry_points is None else list(entry_points)
    RECORDS[:] = [load_one(ep, selected) for ep in eps]

    problems = [f"backend {r.name!r} ({r.dist or r.target}) failed to load: {r.reason}" for r in RECORDS if r.failed]
    if selected:
        unknown = sorted(selected - {r.name for r in RECORDS})
        if unknown:
            installed = ", ".join(r.name for r in RECORDS) or "none"
            problems.append(
                f"BNB_BACKENDS names backends that are not installed: {', '.join(unknown)} (installed: {installed})"
            )
    if strict and problems:
        raise BackendLoadError("; ".join(problems) + " [BNB_STRICT_BACKENDS=1]")
    for problem in problems:
        warnings.warn(
            f"bitsandbytes: {problem}; skipped (python -m bitsandbytes shows details)", BackendLoadWarning, stacklevel=2
        )

    if selected is None:  # with BNB_BACKENDS set, the user chose what runs
        _warn_about_accelerators()
    return RECORDS


def _warn_about_accelerators() -> None:
    for device in missing_accelerators():
        warnings.warn(
            f"bitsandbytes: a {device} device is present but no backend for it is installed, so the "
            f"(slow) reference kernels run on it. Fix: {devices.install_hint(device)}",
            MissingBackendWarning,
            stacklevel=3,
        )
    present = set(devices.accelerators())
    for r in RECORDS:
        idle = sorted(present & set(r.device_types))
        if r.reason == UNAVAILABLE and idle:
            warnings.warn(
                f"bitsandbytes: backend {r.name!r} ({r.dist or r.target}) for {', '.join(idle)} says it cannot "
                "run on this machine, so the reference kernels run instead (python -m bitsandbytes shows details)",
                MissingBackendWarning,
                stacklevel=3,
            )


def missing_accelerators(records: Iterable[BackendRecord] | None = None) -> list[str]:
    """Accelerators present for which no installed backend claims the device type (loaded or not)."""
    claimed = {t for r in (RECORDS if records is None else records) for t in r.device_types}
    return [d for d in devices.accelerators() if d not in claimed]
