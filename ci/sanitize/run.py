"""The sanitizer run of `nox -s sanitize`: every step in a child process under the ASan runtime.

Run from the repository root with a venv that holds torch, the core and the CPU backend built with
BNB_SANITIZE (the nox session does both). Arguments name steps to run (default: all of them, in order):

    python ci/sanitize/run.py [--sanitize address,undefined] [--isas native,avx2,scalar] [STEP ...]

The instrumented libraries need the sanitizer runtime loaded before anything else, so each child gets
LD_PRELOAD of the compiler's libasan (`$CXX -print-file-name=libasan.so`, the compiler that built them).
A step fails on a non-zero exit, and also on any sanitizer report in its output, since a report printed
by a process whose exit status is ignored would otherwise pass unseen.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
# --capture=sys: pytest's default fd capture would swallow a report written just before the abort.
CONFORMANCE = (PY, "-m", "bitsandbytes.testing", "--device", "cpu", "-q", "--capture=sys")
PYTEST = (PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--capture=sys")
EMULATED_BAD_INPUT = (
    "packages/backends-cuda/tests/test_bad_input_cuda.py",
    "packages/backends-mps/tests/test_bad_input_mps.py",
)

# detect_leaks=0: CPython and torch keep process-lifetime allocations (interned objects, op registries,
# the extension's own static tables) that are never freed by design, so LeakSanitizer would report
# thousands of "leaks" at exit that no code path can fix. Memory errors stay fatal.
ASAN_OPTIONS = "detect_leaks=0:abort_on_error=1:halt_on_error=1:print_summary=1"
UBSAN_OPTIONS = "halt_on_error=1:abort_on_error=1:print_stacktrace=1"
REPORT = re.compile(
    r"ERROR: (Address|Leak|UndefinedBehavior)Sanitizer|SUMMARY: \w+Sanitizer|: runtime error: |"
    r"WARNING: ASan is ignoring requested __asan_handle_no_return"
)


def runtime_library(name: str) -> str:
    """The sanitizer runtime of the compiler that built the instrumented code (scikit-build's CMake and the
    emulator both use $CXX, else the system's c++/g++)."""
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        sys.exit("ci/sanitize/run.py: no C++ compiler found (set CXX) to locate the sanitizer runtime")
    path = subprocess.run([cxx, f"-print-file-name={name}"], capture_output=True, text=True, check=True).stdout.strip()
    if not Path(path).is_file():  # the compiler echoes the bare name back when it has no such library
        sys.exit(f"ci/sanitize/run.py: {cxx} has no {name} (install its sanitizer runtime, e.g. libasan8)")
    return str(Path(path).resolve())


def steps(isas: list[str]) -> dict[str, tuple[tuple[str, ...], dict[str, str]]]:
    """Step name -> (command, extra environment)."""
    cpu = {f"conformance-cpu-{isa}": (CONFORMANCE, {"BNB_CPU_ISA": isa}) for isa in isas}
    emulated = {
        "BNB_BACKENDS": "none",
        "PYTHONPATH": _pythonpath("packages/backends-cuda/src", "packages/backends-mps/src"),
    }
    return {
        # First: proves the instrumentation is live, so the steps after it can fail at all.
        "selfcheck": ((*PYTEST, "ci/sanitize/test_live.py"), {}),
        **cpu,
        "backends-cpu-tests": ((*PYTEST, "packages/backends-cpu/tests"), {}),
        "bad-input-matrix": ((*PYTEST, "packages/core/tests/reliability/test_bad_input_matrix.py"), {}),
        # The kernel sources straight from the checkout (the emulator needs no nvcc or Mac): each package's
        # emulated plugin registers its kernels for device cpu, over the reference kernels.
        "emulated-cuda": ((*CONFORMANCE, "-p", "bitsandbytes_cuda.testing.emulated"), emulated),
        "emulated-mps": ((*CONFORMANCE, "-p", "bitsandbytes_mps.testing.emulated"), emulated),
        # The bad-input matrix through both packages' glue into their emulated kernels.
        "bad-input-emulated": ((*PYTEST, *EMULATED_BAD_INPUT), emulated),
    }


def _pythonpath(*dirs: str) -> str:
    return os.pathsep.join([*(str(ROOT / d) for d in dirs), *filter(None, [os.environ.get("PYTHONPATH")])])


def run_step(name: str, cmd: tuple[str, ...], env: dict[str, str]) -> tuple[bool, float, list[str]]:
    """Runs one step, echoing its output; (passed, seconds, sanitizer report lines)."""
    print(f"\n=== sanitize: {name}: {' '.join(cmd)}", flush=True)
    start = time.monotonic()
    reports = []
    with subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            if REPORT.search(line):
                reports.append(line.rstrip())
        rc = proc.wait()
    seconds = time.monotonic() - start
    return rc == 0 and not reports, seconds, reports


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sanitize", default="address,undefined", help="the -fsanitize= list of the build")
    parser.add_argument("--isas", default="native,avx2,scalar", help="BNB_CPU_ISA levels for the conformance")
    parser.add_argument("steps", nargs="*", help="steps to run (default: all)")
    args = parser.parse_args()
    table = steps(args.isas.split(","))
    unknown = [s for s in args.steps if s not in table]
    if unknown:
        parser.error(f"unknown step(s) {unknown}; the steps are: {', '.join(table)}")
    chosen = args.steps or list(table)

    # libstdc++ right after the runtime: ASan resolves its __cxa_throw interceptor when it starts, and
    # python itself does not link libstdc++ (torch loads it later), so the first C++ exception would
    # otherwise hit "CHECK failed: ... real___cxa_throw != 0".
    asan = "address" in args.sanitize.split(",")
    preload = [runtime_library("libasan.so"), runtime_library("libstdc++.so")] if asan else []
    base = {
        **os.environ,
        "LD_PRELOAD": ":".join([*preload, *filter(None, [os.environ.get("LD_PRELOAD")])]),
        "ASAN_OPTIONS": ASAN_OPTIONS,
        "UBSAN_OPTIONS": UBSAN_OPTIONS,
        "BNB_EMU_SANITIZE": args.sanitize,
        "BNB_STRICT_BACKENDS": "1",
        "PYTHONFAULTHANDLER": "1",
    }
    print(f"sanitize: LD_PRELOAD={base['LD_PRELOAD']} ASAN_OPTIONS={ASAN_OPTIONS} UBSAN_OPTIONS={UBSAN_OPTIONS}")

    results = []
    for name in chosen:
        cmd, extra = table[name]
        results.append((name, *run_step(name, cmd, {**base, **extra})))
    print("\n=== sanitize: summary")
    for name, passed, seconds, reports in results:
        print(f"{name:<24} {'ok' if passed else 'FAILED':<7} {seconds:7.1f} s")
        for line in reports[:20]:
            print(f"    {line}")
    total = sum(r[2] for r in results)
    failed = [r[0] for r in results if not r[1]]
    verdict = f"FAILED: {', '.join(failed)}" if failed else "no sanitizer findings"
    print(f"{len(results)} steps, {total:.0f} s, {verdict}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
