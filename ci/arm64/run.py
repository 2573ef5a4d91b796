"""`nox -s tests-arm64`: the CPU backend built and tested on emulated arm64 (ci/arm64/root.py).

Steps, in order (name some to run only those: `nox -s tests-arm64 -- build conformance-best`):

    setup             host packages, binfmt, the Debian arm64 root, the base venv (cached: skipped next time)
    build             the core's and the CPU backend's wheels, cross-compiled on the host (ci/arm64/cross.py;
                      natively in the root under qemu-user, an hour, only where the cross build cannot
                      run), installed into the root's venv
    detect            the ISA level detected under several emulated CPUs (QEMU_CPU) and natively-read features
    conformance       `python -m bitsandbytes.testing --device cpu -q` at every arm64 level (QEMU_CPU=max)
    conformance-best  the same at the best level only (the short selection)
    bytes             packages/backends-cpu/tests/test_cross_arch_bytes.py: x86's bytes at every level; then
                      every kernel must have run at every level (conformance and this step together)
    compat            the upstream compatibility fixtures (packages/core/tests/test_compat_*.py)
    backend-tests     packages/backends-cpu/tests (less the host-side qemu driver test); the longest, last

The test steps count the calls into each of the backend's kernels per ISA level (kernel_coverage.py) and
print them. Every step runs even when an earlier test step failed; the exit status says whether all
passed. The wall time of each step goes to build/arm64/times.json and the log, the kernel counts to
build/arm64/coverage-*.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cross  # this folder's cross.py
import root as arm64  # this folder's root.py, not an installed module

STEPS = ("setup", "build", "detect", "conformance", "bytes", "compat", "backend-tests")
OPTIONAL = ("conformance-best",)
STRICT = {"BNB_STRICT_BACKENDS": "1"}
PYTEST = ("python", "-m", "pytest", "-q", "-p", "no:cacheprovider")
COMPAT = ("packages/core/tests/test_compat_upstream.py", "packages/core/tests/test_compat_checkpoints.py")
OUT = arm64.REPO / "build" / "arm64"
TIMES = OUT / "times.json"
# The qemu driver test cross-compiles and runs qemu itself: a host-side test (nox -s tests-neon).
HOST_ONLY = ("packages/backends-cpu/tests/test_neon_native.py",)
COVERAGE = ("-p", "kernel_coverage")


class Runner:
    def __init__(self, cache: Path, venv_name: str, jobs: int):
        self.cache = cache
        self.venv_name = venv_name
        self.venv: str | None = None
        self.jobs = jobs
        self.times: dict[str, float] = {}
        self.failed: list[str] = []
        self._levels: list[str] | None = None  # asked once, after the build

    def run(self, argv, **kwargs) -> int:
        return arm64.run_in_root(self.cache, list(argv), venv=self.venv, check=False, **kwargs)

    def step(self, name: str, fn) -> None:
        arm64.log(f"--- {name}")
        start = time.monotonic()
        ok = fn()
        self.times[name] = round(time.monotonic() - start, 1)
        arm64.log(f"--- {name}: {'ok' if ok else 'FAILED'} in {self.times[name]:.1f} s")
        if not ok:
            self.failed.append(name)

    def setup(self) -> bool:
        arm64.setup(self.cache)
        self.venv = arm64.ensure_venv(self.cache, self.venv_name)
        return True

    def build(self) -> bool:
        pip = ("python", "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps", "--force-reinstall")
        missing = cross.why_not(self.cache)
        if missing is None:
            start = time.monotonic()
            wheels = cross.build_wheels(self.cache, OUT / "wheels", self.jobs)
            self.times["build[cross-compile]"] = round(time.monotonic() - start, 1)
            start = time.monotonic()
            ok = self.run([*pip, "--no-index", *map(str, wheels)]) == 0
            self.times["build[install]"] = round(time.monotonic() - start, 1)
        else:
            arm64.log(f"NOT cross-compiling ({missing}): building natively in the root under qemu (about an hour)")
            env = {"CMAKE_BUILD_PARALLEL_LEVEL": str(self.jobs)}
            ok = self.run([*pip, "./packages/core", "./packages/backends-cpu"], env=env) == 0
        return ok and self.run(["python", "-m", "bitsandbytes"], env=STRICT) == 0

    def coverage_env(self, tag: str) -> dict[str, str]:
        """The kernel_coverage plugin on the path, its counts to OUT/coverage-<tag>.json."""
        path = OUT / f"coverage-{tag}.json"
        path.unlink(missing_ok=True)
        return {"PYTHONPATH": str(Path(__file__).resolve().parent), "BNB_KERNEL_COVERAGE": str(path)}

    def covered(self, tags: list[str], level: str) -> bool:
        """Whether every kernel ran at `level` in the runs that wrote coverage-<tag>.json (those present)."""
        kernels: list[str] = []
        calls: dict[str, int] = {}
        for tag in tags:
            path = OUT / f"coverage-{tag}.json"
            if path.exists():
                data = json.loads(path.read_text())
                kernels = data["kernels"]
                for k, n in data["calls"].get(level, {}).items():
                    calls[k] = calls.get(k, 0) + n
        if not kernels:
            arm64.log(f"no kernel counts from {', '.join(tags)}")
            return False
        missing = [k for k in kernels if not calls.get(k)]
        arm64.log(f"kernels run at {level} ({' + '.join(tags)}): {len(kernels) - len(missing)} of {len(kernels)}"
                  f"{'; never run: ' + ', '.join(missing) if missing else ''}")  # fmt: skip
        arm64.log("  " + ", ".join(f"{k} {calls.get(k, 0)}" for k in kernels))
        return not missing

    def levels(self) -> list[str]:
        if self._levels is None:
            self._levels = self._read_levels()
        return self._levels

    def _read_levels(self) -> list[str]:
        out = arm64.REPO / "build" / "arm64" / "levels.txt"
        out.parent.mkdir(parents=True, exist_ok=True)
        code = "import bitsandbytes_cpu as c, sys; open(sys.argv[1], 'w').write(' '.join(c.supported_isas()))"
        if self.run(["python", "-c", code, str(out)]) != 0:
            return []
        return out.read_text().split()

    def detect(self) -> bool:
        test = "packages/backends-cpu/tests/test_isa_detection.py"
        return self.run([*PYTEST, "-rs", test], env=STRICT) == 0

    def conformance(self, best_only: bool) -> bool:
        levels = self.levels()
        if not levels:
            return False
        ok = True
        for level in levels[-1:] if best_only else levels:
            arm64.log(f"conformance at BNB_CPU_ISA={level}")
            start = time.monotonic()
            argv = ["python", "-m", "bitsandbytes.testing", "--device", "cpu", "-q", *COVERAGE]
            env = {**STRICT, "BNB_CPU_ISA": level, **self.coverage_env(f"conformance-{level}")}
            ok &= self.run(argv, env=env) == 0
            self.covered([f"conformance-{level}"], level)  # informative; `bytes` checks every kernel ran
            self.times[f"conformance[{level}]"] = round(time.monotonic() - start, 1)
        return ok

    def backend_tests(self) -> bool:
        ignore = [f"--ignore={p}" for p in HOST_ONLY]
        env = {**STRICT, **self.coverage_env("backend-tests")}
        ok = self.run([*PYTEST, *COVERAGE, "packages/backends-cpu/tests", *ignore], env=env) == 0
        for level in self.levels():  # informative: these tests switch levels themselves
            self.covered(["backend-tests"], level)
        return ok

    def bytes(self) -> bool:
        env = {**STRICT, **self.coverage_env("bytes")}
        ok = self.run([*PYTEST, *COVERAGE, "packages/backends-cpu/tests/test_cross_arch_bytes.py"], env=env) == 0
        levels = self.levels()
        for level in levels:
            ok &= self.covered([f"conformance-{level}", "bytes"], level)
        return ok and bool(levels)

    def compat(self) -> bool:
        return self.run([*PYTEST, *COMPAT], env=STRICT) == 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("steps", nargs="*", help=f"steps to run (default: all of {', '.join(STEPS)})")
    parser.add_argument("--cache", type=Path, default=arm64.DEFAULT_CACHE)
    parser.add_argument("--venv", default=arm64.venv_name())
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    args = parser.parse_args()
    unknown = [s for s in args.steps if s not in STEPS + OPTIONAL]
    if unknown:
        parser.error(f"unknown step(s) {unknown}; steps are {', '.join(STEPS + OPTIONAL)}")
    wanted = args.steps or list(STEPS)
    r = Runner(args.cache, args.venv, args.jobs)
    total = time.monotonic()
    # setup always runs (a no-op once cached): every other step needs the root and the venv.
    r.step("setup", r.setup)
    actions = {
        "build": r.build,
        "detect": r.detect,
        "conformance": lambda: r.conformance(best_only=False),
        "conformance-best": lambda: r.conformance(best_only=True),
        "bytes": r.bytes,
        "backend-tests": r.backend_tests,
        "compat": r.compat,
    }
    for name in STEPS + OPTIONAL:
        if name in wanted and name != "setup":
            if name != "build" and "build" in r.failed:
                r.failed.append(name)
                arm64.log(f"--- {name}: skipped, the build failed")
                continue
            r.step(name, actions[name])
    r.times["total"] = round(time.monotonic() - total, 1)
    TIMES.parent.mkdir(parents=True, exist_ok=True)
    TIMES.write_text(json.dumps({"steps": wanted, "seconds": r.times, "failed": r.failed}, indent=2) + "\n")
    arm64.log("times (s): " + ", ".join(f"{k} {v}" for k, v in r.times.items()))
    if r.failed:
        arm64.log(f"FAILED: {', '.join(r.failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
