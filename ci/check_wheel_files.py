"""What the pure wheels hold, beyond check-wheel-contents' generic checks (`nox -s wheels` runs both).

- bitsandbytes (the core) is the spec and the reference: Python, and of C/C++ only the format header
  (include/bitsandbytes/formats.h, for backends that compile against it). The CUDA/Metal kernel emulator
  is a distribution of its own (bitsandbytes-emu), so none of its shims or runtime may come back here.
- bitsandbytes-emu carries its C++ side as package data, compiled on the user's machine: every file of
  packages/kernel-emulator/src/bitsandbytes_emu that git tracks (headers without a suffix, such as the
  stand-in <metal_stdlib>, included) and nothing else, tests least of all.

    python ci/check_wheel_files.py WHEEL [WHEEL ...]

Other wheels are passed over (named in the output). Exit status 1 lists every problem.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parents[1]
# C, C++, CUDA, Objective-C++ and Metal sources and headers, and textual includes.
NATIVE_SUFFIXES = frozenset({".c", ".cc", ".cpp", ".cxx", ".h", ".hh", ".hpp", ".cu", ".cuh", ".inc", ".mm", ".metal"})
CORE_HEADER = "bitsandbytes/include/bitsandbytes/formats.h"
EMU_SOURCE = ROOT / "packages" / "kernel-emulator" / "src"


def is_native_source(name: str) -> bool:
    """A C-family source or header; a file without a suffix counts (standard-library style headers)."""
    path = PurePosixPath(name)
    return path.suffix in NATIVE_SUFFIXES or (path.suffix == "" and not path.name.startswith("."))


def _payload(names: list[str]) -> list[str]:
    """The package's files: the wheel's listing less its .dist-info metadata and directory entries."""
    return [n for n in names if not n.endswith("/") and ".dist-info/" not in n]


def check_core(names: list[str]) -> list[str]:
    files = _payload(names)
    problems = [
        f"{n}: C/C++ source in the core wheel (only {CORE_HEADER} belongs there; kernel code goes to a backend, "
        "emulator code to packages/kernel-emulator)"
        for n in files
        if is_native_source(n) and n != CORE_HEADER
    ]
    if CORE_HEADER not in files:
        problems.append(f"{CORE_HEADER}: missing (bitsandbytes.get_include() must find the format header)")
    problems += [f"{n}: outside the bitsandbytes package" for n in files if not n.startswith("bitsandbytes/")]
    return problems


def tracked_emulator_files(root: Path = EMU_SOURCE) -> list[str]:
    """The files git tracks under the emulator's package, relative to src/ (as the wheel names them)."""
    listed = subprocess.run(
        ["git", "ls-files", "bitsandbytes_emu"], cwd=root, check=True, capture_output=True, text=True
    ).stdout.split()
    return sorted(listed)


def check_emulator(names: list[str], tracked: list[str]) -> list[str]:
    files = set(_payload(names))
    problems = [f"{n}: tracked in packages/kernel-emulator/src but not in the wheel" for n in tracked if n not in files]
    problems += [f"{n}: in the wheel but not a tracked file of the emulator" for n in sorted(files - set(tracked))]
    return problems


def check_wheel(wheel: Path, tracked: list[str] | None = None) -> list[str] | None:
    """The problems of one wheel; None for a wheel this script has no rules for."""
    dist = wheel.name.split("-")[0]
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    if dist == "bitsandbytes":
        return check_core(names)
    if dist == "bitsandbytes_emu":
        return check_emulator(names, tracked_emulator_files() if tracked is None else tracked)
    return None


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python ci/check_wheel_files.py WHEEL [WHEEL ...]", file=sys.stderr)
        return 2
    failed = False
    for wheel in map(Path, argv):
        problems = check_wheel(wheel)
        if problems is None:
            print(f"{wheel.name}: no rules here (check-wheel-contents covers it)")
        elif problems:
            failed = True
            print(f"{wheel.name}:", *problems, sep="\n  ")
        else:
            print(f"{wheel.name}: ok")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
