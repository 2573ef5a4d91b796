"""Compile every Metal source of bitsandbytes-mps with Apple's offline compiler at one language version.

torch.mps.compile_shader compiles the same assembled text (prelude + source, ``_assemble.py``) at run time
as MSL 3.1 on macOS 14, 3.2 on macOS 15 and 4.0 on macOS 26; a construct one version rejects would show
on that OS only, as a silent fall back to the reference kernels for the whole family. So CI runs this on
one runner per version (.github/workflows/tests.yml, job `metal`):

    python ci/mps/compile_metal.py --std metal3.2

Per source: ``xcrun -sdk macosx metal -std=STD -mmacosx-version-min=OS -fno-fast-math -Wall -c``, the
compiler's output printed as it is (warnings shown, not turned into errors), then one ``metallib`` link of
all of them (the sources share one library, so a symbol defined twice fails there). Ends with a summary
line per source; exits 1 if anything failed, 2 if the compiler cannot be run at all.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "packages" / "backends-mps" / "src" / "bitsandbytes_mps"
ASSEMBLE = PACKAGE / "_assemble.py"

# The macOS release of each language version torch selects, which is also the lowest deployment target
# Apple's compiler accepts with it.
MACOS_OF_STD = {"metal3.1": "14.0", "metal3.2": "15.0", "metal4.0": "26.0"}
FLAGS = ("-fno-fast-math", "-Wall")

DIAGNOSTIC = re.compile(r"^(?P<file>[^:\n]+):(?P<line>\d+):(?P<col>\d+): (?P<kind>warning|error): (?P<msg>.*)$", re.M)


def sources(out: Path) -> list[str]:
    """Assemble the sources into ``out`` exactly as the CMake build does; their names."""
    subprocess.run([sys.executable, str(ASSEMBLE), "--out", str(out)], check=True)
    listed = subprocess.run(
        [sys.executable, str(ASSEMBLE), "--list", "--out", str(out)], check=True, capture_output=True, text=True
    )
    return listed.stdout.split()


def annotate(output: str, names: list[str]) -> None:
    """GitHub annotations for the compiler's diagnostics, on the files in the repository."""
    for d in DIAGNOSTIC.finditer(output):
        name = Path(d["file"]).name
        if d["file"] == name and name in names:  # `#line 1 "<source>"`: a line of metal/<source>
            where = f"file={(PACKAGE / 'metal' / name).relative_to(ROOT)},line={d['line']},col={d['col']}"
        else:  # the assembled file's own lines: the prelude
            where = f"file={ASSEMBLE.relative_to(ROOT)}"
        print(f"::{d['kind']} {where}::{d['msg']}")


def run(cmd: list[str]) -> subprocess.CompletedProcess:
    print("$ " + shlex.join(cmd), flush=True)
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    output = result.stdout + result.stderr
    if output:
        print(output, end="" if output.endswith("\n") else "\n", flush=True)
    return result


def count(output: str, kind: str) -> int:
    return sum(d["kind"] == kind for d in DIAGNOSTIC.finditer(output))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--std", required=True, help="Metal language version, as -std= takes it (metal3.1, ...)")
    parser.add_argument(
        "--macos-min", help="-mmacosx-version-min (default: the macOS of --std: " + str(MACOS_OF_STD) + ")"
    )
    parser.add_argument("--xcrun", default="xcrun", help="the xcrun to run (default: xcrun on PATH)")
    parser.add_argument("--out", type=Path, help="keep the assembled sources and .air files here")
    args = parser.parse_args(argv)
    macos = args.macos_min or MACOS_OF_STD.get(args.std)
    if macos is None:
        parser.error(f"--std {args.std!r} has no known macOS; pass --macos-min")

    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp)
        names = sources(out)
        xcrun = [args.xcrun, "-sdk", "macosx"]
        flags = [f"-std={args.std}", f"-mmacosx-version-min={macos}", *FLAGS]
        summary: list[str] = []
        airs: list[str] = []
        for name in names:
            air = out / (Path(name).stem + ".air")
            try:
                result = run([*xcrun, "metal", *flags, "-c", str(out / name), "-o", str(air)])
            except OSError as e:
                print(f"error: cannot run {args.xcrun!r}: {e}", file=sys.stderr)
                return 2
            output = result.stdout + result.stderr
            if os.environ.get("GITHUB_ACTIONS") == "true":
                annotate(output, names)
            warnings = count(output, "warning")
            if result.returncode == 0:
                summary.append(f"{name}: ok ({warnings} warnings)")
                airs.append(str(air))
            else:
                errors = count(output, "error")
                summary.append(f"{name}: FAILED (exit {result.returncode}, {errors} errors, {warnings} warnings)")
        if len(airs) == len(names):
            result = run([*xcrun, "metallib", *airs, "-o", str(out / "bitsandbytes.metallib")])
            ok = result.returncode == 0
            summary.append("link: ok" if ok else f"link: FAILED (exit {result.returncode})")
        else:
            summary.append("link: not tried (a source failed)")

    print(f"--- {args.std} (-mmacosx-version-min={macos}) ---")
    print("\n".join(summary))
    return 0 if all(": ok" in line for line in summary) else 1


if __name__ == "__main__":
    sys.exit(main())
