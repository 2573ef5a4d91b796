"""The build's architecture list: archs the nvcc version cannot compile are dropped, PTX is added for the
lowest and the highest, and the configure step says what it builds.

The filter (``cmake/bnb_cuda_archs.cmake``) runs in CMake's script mode for any CUDA version; the facts it
encodes are NVIDIA's (12.8 added sm_100/101/120, 12.9 sm_103/121, 13.0 renamed sm_101 to sm_110 and stopped
compiling anything before sm_75) and, for the installed nvcc, its own ``--list-gpu-code``. A real configure
of the package runs with the nvcc here.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bitsandbytes_cuda import archs

ROOT = Path(__file__).resolve().parents[1]
MODULE = ROOT / "cmake" / "bnb_cuda_archs.cmake"
CMAKE = shutil.which("cmake")
NVCC = shutil.which("nvcc")
DEFAULT = "75;80;86;89;90;100;120"
needs_cmake = pytest.mark.skipif(CMAKE is None, reason="needs cmake")


def _script(version: str, requested: str) -> dict[str, str]:
    run = subprocess.run(
        [CMAKE, f"-DBNB_NVCC_VERSION={version}", f"-DBNB_REQUESTED={requested}", "-P", str(MODULE)],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    return dict(line.split("=", 1) for line in (run.stdout + run.stderr).splitlines() if "=" in line)


@needs_cmake
@pytest.mark.parametrize(
    ("version", "kept", "cmake", "described"),
    [
        (
            "12.4",
            "75;80;86;89;90",
            "75;80-real;86-real;89-real;90",
            "sm_75 sm_80 sm_86 sm_89 sm_90 compute_75 compute_90 (PTX)",
        ),
        (
            "12.8",
            DEFAULT,
            "75;80-real;86-real;89-real;90-real;100-real;120",
            "sm_75 sm_80 sm_86 sm_89 sm_90 sm_100 sm_120 compute_75 compute_120 (PTX)",
        ),
        (
            "13.0",
            DEFAULT,
            "75;80-real;86-real;89-real;90-real;100-real;120",
            "sm_75 sm_80 sm_86 sm_89 sm_90 sm_100 sm_120 compute_75 compute_120 (PTX)",
        ),
    ],
)
def test_default_list_per_cuda_version(version, kept, cmake, described):
    out = _script(version, DEFAULT)
    assert (out["kept"], out["cmake"], out["described"]) == (kept, cmake, described)
    if version == "12.4":
        assert out["dropped"] == "sm_100 (CUDA >= 12.8);sm_120 (CUDA >= 12.8)"
    else:
        assert out["dropped"] == ""


@needs_cmake
@pytest.mark.parametrize(
    ("version", "kept", "dropped"),
    [
        ("12.4", "61;70;90a", "sm_103 (CUDA >= 12.9);sm_110 (CUDA >= 13.0);sm_101 (CUDA 12.8 to < 13.0)"),
        ("12.8", "61;70;90a;101", "sm_103 (CUDA >= 12.9);sm_110 (CUDA >= 13.0)"),
        ("13.0", "90a;103;110", "sm_61 (CUDA 8.0 to < 13.0);sm_70 (CUDA 9.0 to < 13.0);sm_101 (CUDA 12.8 to < 13.0)"),
    ],
)
def test_old_and_renamed_archs(version, kept, dropped):
    out = _script(version, "61;70;90a;103;110;101")
    assert (out["kept"], out["dropped"]) == (kept, dropped)


@needs_cmake
def test_one_arch_is_sass_and_ptx_and_unknown_archs_pass_through():
    out = _script("13.0", "90")
    assert (out["cmake"], out["described"]) == ("90", "sm_90 compute_90 (PTX)")
    assert _script("13.0", "130")["kept"] == "130"  # a newer nvcc than this table decides for itself


@needs_cmake
@pytest.mark.skipif(NVCC is None, reason="needs the CUDA compiler nvcc")
def test_the_table_agrees_with_the_installed_nvcc():
    listed = subprocess.run([NVCC, "--list-gpu-code"], capture_output=True, text=True).stdout.split()
    version = re.search(
        r"release (\d+\.\d+)", subprocess.run([NVCC, "--version"], capture_output=True, text=True).stdout
    )
    numbers = sorted(int(c[3:]) for c in listed if re.fullmatch(r"sm_\d+", c))
    every = "50;52;53;60;61;62;70;72;75;80;86;87;88;89;90;100;101;103;110;120;121"
    kept = _script(version.group(1), every)["kept"]
    assert [int(a) for a in kept.split(";")] == numbers


@needs_cmake
def test_the_library_text_parses_as_the_loader_reads_it():
    described = _script("12.8", DEFAULT)["described"]
    sass, ptx = archs.parse(described)
    assert [f"{a}{b}" for a, b, _ in sass] == DEFAULT.split(";")
    assert [f"{a}{b}" for a, b, _ in ptx] == ["75", "120"]
    assert archs.covers(described, 11, 0)  # a GPU newer than the list JITs the lowest PTX


@needs_cmake
@pytest.mark.skipif(NVCC is None, reason="needs the CUDA compiler nvcc")
@pytest.mark.parametrize(("env", "expect", "warn"), [(DEFAULT, DEFAULT, None), ("70;90", "90", "sm_70")])
def test_configure_reports_the_architectures_it_builds(tmp_path, env, expect, warn):
    run = subprocess.run(
        [CMAKE, "-S", str(ROOT), "-B", str(tmp_path), f"-DPython_EXECUTABLE={sys.executable}"],
        capture_output=True,
        text=True,
        env={**os.environ, "BNB_CUDA_ARCHS": env},
    )
    assert run.returncode == 0, run.stdout + run.stderr
    archs_line = re.search(r"bitsandbytes-cuda architectures \(nvcc [\d.]+\): (.*)", run.stdout).group(1)
    expected = expect.split(";")
    ptx = sorted({expected[0], expected[-1]}, key=int)
    assert archs_line == " ".join(f"sm_{a}" for a in expected) + " " + " ".join(f"compute_{a}" for a in ptx) + " (PTX)"
    flags = (tmp_path / "CMakeFiles" / "bnb_cuda.dir" / "flags.make").read_text()
    assert f"arch=compute_{expected[0]},code=[compute_{expected[0]},sm_{expected[0]}]" in flags
    if warn:
        assert re.search(rf"nvcc [\d.]+ cannot compile {warn} \(CUDA 9\.0 to < 13\.0\)", run.stderr)
        assert f"sm_{warn[3:]}" not in flags
