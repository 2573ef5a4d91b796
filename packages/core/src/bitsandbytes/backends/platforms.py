"""Which platforms each backend extra publishes wheels for, and what that means for the user here.

pip does not record which extras were asked for, and an extra whose environment marker excludes the
platform installs nothing without a word. So ``python -m bitsandbytes`` lists every extra with its state
on this platform: installed, installable, or not built here (with the extras that are). The table below
mirrors the markers in packages/core/pyproject.toml; a test keeps the two in agreement.
"""

from __future__ import annotations

import platform
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata

# extra -> (distribution, the (platform.system(), platform.machine()) pairs it has wheels for; None: all).
EXTRA_PLATFORMS: dict[str, tuple[str, tuple[tuple[str, str], ...] | None]] = {
    "cpu": ("bitsandbytes-cpu", None),
    "cuda": ("bitsandbytes-cuda", (("Linux", "x86_64"), ("Linux", "aarch64"), ("Windows", "AMD64"))),
    "mps": ("bitsandbytes-mps", (("Darwin", "arm64"),)),
}

_OS_NAMES = {"Darwin": "macOS"}

INSTALLED = "installed"
AVAILABLE = "not installed"
NOT_BUILT = "not built for this platform"


def describe(system: str, machine: str) -> str:
    """``("Darwin", "arm64")`` -> ``"macOS arm64"``."""
    return f"{_OS_NAMES.get(system, system)} {machine}"


def current() -> tuple[str, str]:
    # The same values the markers' platform_system / platform_machine compare against.
    return platform.system(), platform.machine()


def supports(extra: str, system: str, machine: str) -> bool:
    """Whether ``extra`` has a wheel for this platform (its marker lets pip install it)."""
    try:
        _, pairs = EXTRA_PLATFORMS[extra]
    except KeyError:
        raise ValueError(f"extra must be one of {sorted(EXTRA_PLATFORMS)}, got {extra!r}") from None
    return pairs is None or (system, machine) in pairs


def _installed_version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True)
class ExtraStatus:
    extra: str
    dist: str
    state: str  # INSTALLED, AVAILABLE or NOT_BUILT
    version: str | None
    message: str


def extras_status(
    system: str | None = None,
    machine: str | None = None,
    version_of: Callable[[str], str | None] = _installed_version,
) -> list[ExtraStatus]:
    """One status per extra for the given platform (default: this one)."""
    if system is None or machine is None:
        system, machine = current()
    here = describe(system, machine)
    usable = [e for e in EXTRA_PLATFORMS if supports(e, system, machine)]
    alternatives = " or ".join(f"pip install 'bitsandbytes[{e}]'" for e in usable)
    out = []
    for extra, (dist, pairs) in EXTRA_PLATFORMS.items():
        version = version_of(dist)
        if version is not None:
            state, message = INSTALLED, f"{dist} {version}"
        elif supports(extra, system, machine):
            state, message = AVAILABLE, f"pip install 'bitsandbytes[{extra}]'"
        else:
            wheels = ", ".join(describe(*p) for p in pairs or ())
            state = NOT_BUILT
            message = (
                f"{dist} is not built for {here} (its wheels: {wheels}), so pip install 'bitsandbytes[{extra}]' "
                f"installs no backend here; on {here}: {alternatives}"
            )
        out.append(ExtraStatus(extra, dist, state, version, message))
    return out
