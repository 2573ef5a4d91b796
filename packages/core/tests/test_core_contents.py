"""The core holds the spec: Python and the one format header, no kernel emulator (its own distribution,
bitsandbytes-emu, packages/kernel-emulator). Checked on the source tree the wheel is built from, and the
wheel check itself (ci/check_wheel_files.py, run by `nox -s wheels` on the built wheels) on fake wheels."""

from __future__ import annotations

import ast
import importlib.util
import shutil
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
CORE_SRC = ROOT / "packages" / "core" / "src"
CORE_TESTS = ROOT / "packages" / "core" / "tests"


def _checker():
    spec = importlib.util.spec_from_file_location("check_wheel_files", ROOT / "ci" / "check_wheel_files.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


check = _checker()


def _package_files() -> list[str]:
    """What hatchling packs from src/bitsandbytes (every file but byte code), as the wheel names them."""
    return sorted(
        p.relative_to(CORE_SRC).as_posix()
        for p in (CORE_SRC / "bitsandbytes").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".so")
    )


def test_the_core_package_holds_no_native_source_but_the_format_header():
    assert check.check_core(_package_files()) == []


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
    return names


def test_neither_the_core_nor_its_tests_import_the_kernel_emulator():
    # The emulator is a leaf beside the core: only the CUDA and MPS backends' emulated runs use it.
    found = {
        str(path.relative_to(ROOT)): sorted(n for n in _imported_modules(path) if n.split(".")[0] == "bitsandbytes_emu")
        for path in [*CORE_SRC.rglob("*.py"), *CORE_TESTS.rglob("*.py")]
    }
    assert not {k: v for k, v in found.items() if v}


def _wheel(tmp_path: Path, name: str, files: list[str]) -> Path:
    wheel = tmp_path / name
    with zipfile.ZipFile(wheel, "w") as z:
        for f in files:
            z.writestr(f, "")
        z.writestr(f"{name.split('-')[0]}-1.0.0.dev0.dist-info/METADATA", "")
    return wheel


CORE_OK = ["bitsandbytes/__init__.py", "bitsandbytes/_ops.py", check.CORE_HEADER]


def test_the_wheel_check_passes_a_core_wheel_of_python_and_the_header(tmp_path):
    assert check.check_wheel(_wheel(tmp_path, "bitsandbytes-1.0.0.dev0-py3-none-any.whl", CORE_OK)) == []


@pytest.mark.parametrize(
    ("extra", "problem"),
    [
        ("bitsandbytes/testing/emu/src/runtime.cpp", "runtime.cpp: C/C++ source in the core wheel"),
        ("bitsandbytes/testing/emu/include/bnb_emu/metal_headers/metal_stdlib", "metal_stdlib: C/C++ source"),
        ("bitsandbytes/include/bitsandbytes/other.h", "other.h: C/C++ source"),
        ("bitsandbytes_emu/__init__.py", "bitsandbytes_emu/__init__.py: outside the bitsandbytes package"),
    ],
)
def test_the_wheel_check_names_what_does_not_belong_in_the_core(tmp_path, extra, problem):
    wheel = _wheel(tmp_path, "bitsandbytes-1.0.0.dev0-py3-none-any.whl", [*CORE_OK, extra])
    assert [p for p in check.check_wheel(wheel) if problem in p]


def test_the_wheel_check_wants_the_format_header_in_the_core(tmp_path):
    wheel = _wheel(tmp_path, "bitsandbytes-1.0.0.dev0-py3-none-any.whl", CORE_OK[:-1])
    (problem,) = check.check_wheel(wheel)
    assert problem.startswith(f"{check.CORE_HEADER}: missing")


def test_the_wheel_check_holds_the_emulator_wheel_to_its_tracked_files(tmp_path):
    tracked = ["bitsandbytes_emu/__init__.py", "bitsandbytes_emu/include/bnb_emu/metal_headers/metal_stdlib"]
    name = "bitsandbytes_emu-1.0.0.dev0-py3-none-any.whl"
    assert check.check_wheel(_wheel(tmp_path, name, tracked), tracked) == []
    lacking = check.check_wheel(_wheel(tmp_path, name, [*tracked[:1], "tests/test_x.py"]), tracked)
    assert lacking == [
        "bitsandbytes_emu/include/bnb_emu/metal_headers/metal_stdlib: tracked in packages/kernel-emulator/src but "
        "not in the wheel",
        "tests/test_x.py: in the wheel but not a tracked file of the emulator",
    ]


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs git and a checkout")
def test_the_emulators_tracked_files_are_its_sources_and_headers():
    tracked = check.tracked_emulator_files()
    for name in ["__init__.py", "build.py", "src/runtime.cpp", "include/bnb_emu/cuda.h", "include/bnb_emu/metal.h"]:
        assert f"bitsandbytes_emu/{name}" in tracked, name
    assert "bitsandbytes_emu/include/bnb_emu/metal_headers/metal_stdlib" in tracked


def test_other_wheels_have_no_rules_here(tmp_path):
    wheel = _wheel(tmp_path, "bitsandbytes_mps-1.0.0.dev0-py3-none-any.whl", ["bitsandbytes_mps/metal/quant.metal"])
    assert check.check_wheel(wheel) is None
