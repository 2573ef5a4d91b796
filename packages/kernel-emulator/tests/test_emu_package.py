"""The emulator's C++ sources ship inside its package (package data), where the loader finds them, and the
distribution releases in lockstep with the core and the backends whose test extra it is."""

from __future__ import annotations

import sys
from importlib.resources import files
from pathlib import Path

import pytest

import bitsandbytes_emu as emu

if sys.version_info >= (3, 11):
    import tomllib
else:  # the core's test extra brings tomli there
    import tomli as tomllib

PACKAGES = Path(__file__).resolve().parents[2]


def _project(folder: str) -> dict:
    return tomllib.loads((PACKAGES / folder / "pyproject.toml").read_text())["project"]


def test_headers_and_runtime_ship_with_the_package():
    root = files("bitsandbytes_emu")
    for name in ["include/bnb_emu/runtime.h", "include/bnb_emu/cuda.h", "src/runtime.cpp"]:
        assert root.joinpath(name).is_file(), name
    for header in ["cuda_runtime.h", "cuda_fp16.h", "cuda_bf16.h", "mma.h", "cub/cub.cuh"]:
        assert root.joinpath("include/bnb_emu/cuda_headers", header).is_file(), header
    assert Path(emu.include_dir(), "bnb_emu", "runtime.h").is_file()


def test_the_emulator_releases_in_lockstep_and_sits_beside_the_core():
    core, project = _project("core"), _project("kernel-emulator")
    assert project["name"] == "bitsandbytes-emu" and project["version"] == core["version"]
    # Beside the core, not above it: nothing of bitsandbytes at run time, the same floors as the core.
    assert not [d for d in project["dependencies"] if d.split("=")[0].split(">")[0].strip() == "bitsandbytes"]
    assert next(d for d in core["dependencies"] if d.startswith("torch")) in project["dependencies"]
    assert project["requires-python"] == core["requires-python"]
    assert f"bitsandbytes[test]=={core['version']}" in project["optional-dependencies"]["test"]


@pytest.mark.parametrize("backend", ["backends-cuda", "backends-mps"])
def test_the_gpu_backends_test_extras_pin_the_emulator(backend):
    version = _project("core")["version"]
    extra = _project(backend)["optional-dependencies"]["test"]
    assert f"bitsandbytes-emu=={version}" in extra and f"bitsandbytes[test]=={version}" in extra
    # A test extra, never a dependency: a user's install of the backend does not bring the emulator.
    assert not [d for d in _project(backend)["dependencies"] if d.startswith("bitsandbytes-emu")]
