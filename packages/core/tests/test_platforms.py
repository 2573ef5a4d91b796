"""The backend extras: their environment markers, and what `python -m bitsandbytes` says when one excluded
this platform (pip does that silently)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement

from bitsandbytes.backends import devices, platforms
from bitsandbytes.backends.discovery import BackendRecord, _api_mismatch
from bitsandbytes.backends.platforms import AVAILABLE, INSTALLED, NOT_BUILT, extras_status, supports
from bitsandbytes.backends.plugin import API_VERSION
from bitsandbytes.diagnostics.report import render

if sys.version_info >= (3, 11):
    import tomllib
else:  # the test extra brings tomli there
    import tomli as tomllib

PACKAGES = Path(__file__).resolve().parents[2]
CORE = tomllib.loads((PACKAGES / "core" / "pyproject.toml").read_text())["project"]

# (platform.system(), platform.machine(), sys.platform) of the platforms users run, supported or not.
PLATFORMS = [
    ("Linux", "x86_64", "linux"),
    ("Linux", "aarch64", "linux"),
    ("Linux", "ppc64le", "linux"),
    ("Darwin", "arm64", "darwin"),
    ("Darwin", "x86_64", "darwin"),
    ("Windows", "AMD64", "win32"),
    ("Windows", "ARM64", "win32"),
]


def _extra_requirement(extra: str) -> Requirement:
    (spec,) = CORE["optional-dependencies"][extra]
    return Requirement(spec)


def _marker_allows(req: Requirement, system: str, machine: str, sys_platform: str) -> bool:
    if req.marker is None:
        return True
    env = {**default_environment(), "platform_system": system, "platform_machine": machine}
    return req.marker.evaluate({**env, "sys_platform": sys_platform})


@pytest.mark.parametrize("extra", sorted(platforms.EXTRA_PLATFORMS))
def test_extra_pins_its_backend_in_lockstep(extra):
    req = _extra_requirement(extra)
    assert req.name == platforms.EXTRA_PLATFORMS[extra][0]
    assert str(req.specifier) == f"=={CORE['version']}"
    backend = tomllib.loads((PACKAGES / f"backends-{extra}" / "pyproject.toml").read_text())["project"]
    assert backend["name"] == req.name and backend["version"] == CORE["version"]
    assert f"bitsandbytes=={CORE['version']}" in backend["dependencies"]
    # The same floors as the core, so that no backend can pull in a torch or Python the core refuses.
    torch_floor = next(d for d in CORE["dependencies"] if d.startswith("torch"))
    assert torch_floor in backend["dependencies"]
    assert backend["requires-python"] == CORE["requires-python"]
    assert backend["entry-points"]["bitsandbytes.backends"] == {extra: f"bitsandbytes_{extra}.plugin:backend"}


@pytest.mark.parametrize(("system", "machine", "sys_platform"), PLATFORMS)
def test_markers_and_the_diagnostics_table_agree(system, machine, sys_platform):
    for extra in platforms.EXTRA_PLATFORMS:
        allowed = _marker_allows(_extra_requirement(extra), system, machine, sys_platform)
        assert allowed == supports(extra, system, machine), (extra, system, machine)


def test_marker_platforms_are_the_ones_the_issue_names():
    assert [p[:2] for p in PLATFORMS if supports("mps", *p[:2])] == [("Darwin", "arm64")]
    cuda = [p[:2] for p in PLATFORMS if supports("cuda", *p[:2])]
    assert cuda == [("Linux", "x86_64"), ("Linux", "aarch64"), ("Windows", "AMD64")]
    assert all(supports("cpu", *p[:2]) for p in PLATFORMS)
    with pytest.raises(ValueError, match="extra must be one of"):
        supports("rocm", "Linux", "x86_64")


def _nothing_installed(dist: str) -> None:
    return None


def test_mac_user_who_asked_for_cuda_is_told_why_and_what_to_install():
    by_extra = {s.extra: s for s in extras_status("Darwin", "arm64", version_of=_nothing_installed)}
    cuda = by_extra["cuda"]
    assert cuda.state == NOT_BUILT
    assert cuda.message.startswith("bitsandbytes-cuda is not built for macOS arm64")
    assert "Linux x86_64, Linux aarch64, Windows AMD64" in cuda.message
    assert "pip install 'bitsandbytes[cpu]' or pip install 'bitsandbytes[mps]'" in cuda.message
    assert by_extra["mps"].state == AVAILABLE and by_extra["mps"].message == "pip install 'bitsandbytes[mps]'"
    assert by_extra["cpu"].state == AVAILABLE


def test_intel_mac_gets_neither_gpu_backend():
    by_extra = {s.extra: s for s in extras_status("Darwin", "x86_64", version_of=_nothing_installed)}
    assert by_extra["mps"].state == by_extra["cuda"].state == NOT_BUILT
    assert "bitsandbytes-mps is not built for macOS x86_64 (its wheels: macOS arm64)" in by_extra["mps"].message
    assert by_extra["mps"].message.endswith("on macOS x86_64: pip install 'bitsandbytes[cpu]'")


def test_installed_backends_show_their_version():
    versions = {"bitsandbytes-cpu": "1.2.3", "bitsandbytes-cuda": "1.2.3"}
    by_extra = {s.extra: s for s in extras_status("Linux", "aarch64", version_of=versions.get)}
    assert by_extra["cpu"].state == by_extra["cuda"].state == INSTALLED
    assert by_extra["cuda"].message == "bitsandbytes-cuda 1.2.3" and by_extra["cuda"].version == "1.2.3"
    assert by_extra["mps"].state == NOT_BUILT


def test_report_lists_every_extra_for_this_platform():
    lines, _ = render()
    start = next(i for i, line in enumerate(lines) if line.startswith("Extras of bitsandbytes"))
    assert platforms.describe(*platforms.current()) in lines[start]
    rows = lines[start + 1 : start + 1 + len(platforms.EXTRA_PLATFORMS)]
    for row, status in zip(rows, extras_status(), strict=True):
        assert row.split()[0] == status.extra and row.endswith(status.message)


def test_install_hint_for_an_accelerator_whose_backend_is_not_built_here(monkeypatch):
    monkeypatch.setattr(devices, "is_rocm", lambda: False)
    monkeypatch.setattr(devices, "current", lambda: ("Linux", "ppc64le"))
    assert devices.install_hint("cuda").startswith("bitsandbytes-cuda is not built for Linux ppc64le")
    monkeypatch.setattr(devices, "current", lambda: ("Linux", "x86_64"))
    assert devices.install_hint("cuda") == "pip install 'bitsandbytes[cuda]'"


@pytest.mark.parametrize("extra", sorted(platforms.EXTRA_PLATFORMS))
@pytest.mark.parametrize("theirs", ["0.1", "9.0"])
def test_api_mismatch_of_our_own_backend_reinstalls_the_matching_pair(extra, theirs):
    record = BackendRecord(extra, f"bitsandbytes_{extra}.plugin:backend", dist=f"bitsandbytes-{extra}")
    message = _api_mismatch(record, theirs)
    assert theirs in message and API_VERSION in message
    assert message.endswith(f"Fix: pip install -U 'bitsandbytes[{extra}]'")
