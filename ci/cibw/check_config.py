"""Offline check of the cibuildwheel configuration of every compiled package: the build identifiers
`cibuildwheel --print-build-identifiers` gives per platform must be exactly the wheel matrix below, and
every option of every identifier must compute as cibuildwheel computes it on the runner."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

from cibuildwheel.errors import FatalError
from cibuildwheel.options import CommandLineArguments, compute_options

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the session installs tomli
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
PLATFORMS = ("linux", "macos", "windows")

# package -> platform -> (platform tags, CPythons). "abi3" means every CPython from 3.10 that cibuildwheel
# knows (3.12+ share one cp312-abi3 wheel, which cibuildwheel reuses); "py3" means one build with 3.12.
MATRIX = {
    "backends-cpu": {
        "linux": ({"manylinux_x86_64", "manylinux_aarch64"}, "abi3"),
        "macos": ({"macosx_arm64", "macosx_x86_64"}, "abi3"),
        "windows": ({"win_amd64", "win_arm64"}, "abi3"),
    },
    "backends-cuda": {
        "linux": ({"manylinux_x86_64", "manylinux_aarch64"}, "py3"),
        "macos": (set(), "py3"),
        "windows": ({"win_amd64"}, "py3"),
    },
    "backends-mps": {
        "linux": (set(), "py3"),
        "macos": ({"macosx_arm64"}, "py3"),
        "windows": (set(), "py3"),
    },
}


def identifiers(package: str, platform: str) -> list[str]:
    # CIBW_* in the caller's environment (a CI job's) would change the answer: the files alone decide.
    env = {k: v for k, v in os.environ.items() if not k.startswith("CIBW_")}
    cmd = ["cibuildwheel", "--print-build-identifiers", "--platform", platform, str(ROOT / "packages" / package)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env, cwd=ROOT)
    return out.stdout.split()


def check_identifiers(package: str, platform: str, found: list[str]) -> list[str]:
    tags, pythons = MATRIX[package][platform]
    problems = []
    got_tags = {i.split("-", 1)[1] for i in found}
    if got_tags != tags:
        problems.append(f"{package} {platform}: platforms {sorted(got_tags)}, expected {sorted(tags)}")
    versions = {i.split("-", 1)[0] for i in found}
    if pythons == "py3" and tags and versions != {"cp312"}:
        problems.append(f"{package} {platform}: a py3 wheel is built once (cp312), not with {sorted(versions)}")
    if pythons == "abi3":
        minors = sorted(int(v[3:]) for v in versions if re.fullmatch(r"cp3\d+", v))
        if not minors or minors[0] != 10 or minors != list(range(10, minors[-1] + 1)) or len(minors) != len(versions):
            problems.append(f"{package} {platform}: every CPython from 3.10, none free-threaded: {sorted(versions)}")
    print(f"{package:14} {platform:8} {' '.join(found) or '(none)'}")
    return problems


def check_options(package: str, platform: str, found: list[str]) -> list[str]:
    """Every option of every identifier computed as cibuildwheel computes it before a build (environment
    tables parsed, overrides applied): a malformed table fails here, not on the runner. Internal API of the
    pinned cibuildwheel."""
    args = dataclasses.replace(
        CommandLineArguments.defaults(), platform=platform, package_dir=ROOT / "packages" / package
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("CIBW_")}
    problems = []
    try:
        options = compute_options(platform=platform, command_line_arguments=args, env=env)
        for identifier in found:
            build = options.build_options(identifier)
            build.environment.as_dictionary({"PATH": "/usr/bin"})
            build.test_environment.as_dictionary({"PATH": "/usr/bin"})
    except (Exception, FatalError) as e:  # FatalError is a BaseException
        problems.append(f"{package} {platform}: cibuildwheel rejects the configuration: {e}")
    return problems


def check_stable_abi() -> list[str]:
    """The CPU wheel is abi3 on 3.12+ only if both halves say so: scikit-build-core's py-api and nanobind."""
    cpu = ROOT / "packages" / "backends-cpu"
    api = tomllib.loads((cpu / "pyproject.toml").read_text())["tool"]["scikit-build"].get("wheel", {}).get("py-api")
    problems = []
    if api != "cp312":
        problems.append(f"backends-cpu: tool.scikit-build wheel.py-api is {api!r}, expected 'cp312'")
    if not re.search(r"nanobind_add_module\([^)]*\bSTABLE_ABI\b", (cpu / "CMakeLists.txt").read_text()):
        problems.append("backends-cpu: nanobind_add_module lacks STABLE_ABI")
    return problems


def main() -> int:
    problems = check_stable_abi()
    for package in MATRIX:
        for platform in PLATFORMS:
            found = identifiers(package, platform)
            problems += check_identifiers(package, platform, found)
            problems += check_options(package, platform, found)
    for p in problems:
        print(f"error: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
