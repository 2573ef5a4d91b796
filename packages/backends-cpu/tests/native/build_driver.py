"""Cross-compiles the NEON kernel check (neon_driver.cpp) for aarch64 and runs it under qemu-aarch64.

Each kernel file is compiled once per arm64 ISA level into bnb::<level>, with the flags and definitions
the CMake build uses (scalar, neon, neon_dotprod, neon_bf16), and linked with the real thread pool.

    python packages/backends-cpu/tests/native/build_driver.py [--out DIR] [--cpu max] [level ...]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BACKEND = HERE.parents[1]
CSRC = BACKEND / "csrc"
CORE_INCLUDE = BACKEND.parent / "core" / "src" / "bitsandbytes" / "include"

# The arm64 ISA levels, lowest first: cumulative definitions, and the -march each is built for (as
# CMakeLists.txt builds them).
LEVELS = {
    "scalar": (["BNB_ISA_SCALAR"], []),
    "neon": (["BNB_ISA_NEON"], ["-march=armv8-a"]),
    "neon_dotprod": (["BNB_ISA_NEON", "BNB_ISA_NEON_DOTPROD"], ["-march=armv8.2-a+dotprod"]),
    "neon_bf16": (
        ["BNB_ISA_NEON", "BNB_ISA_NEON_DOTPROD", "BNB_ISA_NEON_BF16"],
        ["-march=armv8.2-a+dotprod+fp16fml+bf16+i8mm"],
    ),
}
COMMON = ["-std=c++17", "-O3", "-ffp-contract=off", "-fno-math-errno", "-Wall", f"-I{CSRC}", f"-I{CORE_INCLUDE}"]
# qemu CPU models: `max` has every feature the levels need; cortex-a72 is Armv8.0 (NEON only).
QEMU_SYSROOT = "/usr/aarch64-linux-gnu"


def compiler() -> str | None:
    for name in ("aarch64-linux-gnu-g++",):
        if shutil.which(name):
            return name
    return None


def qemu() -> str | None:
    for name in ("qemu-aarch64-static", "qemu-aarch64"):
        if shutil.which(name):
            return name
    return None


def _tag(cmd: list[str]) -> str:
    # Objects are named by their command line, so a change of flags rebuilds them too.
    return hashlib.sha256(" ".join(cmd).encode()).hexdigest()[:10]


def _stale(obj: Path, deps: list[Path]) -> bool:
    return not obj.exists() or any(d.stat().st_mtime > obj.stat().st_mtime for d in deps)


def build(out: Path, jobs: int = 2) -> Path:
    """Builds (incrementally, by modification time) out/neon_driver and returns its path."""
    cxx = compiler()
    if cxx is None:
        raise RuntimeError("aarch64-linux-gnu-g++ not found (apt-get install g++-aarch64-linux-gnu)")
    out.mkdir(parents=True, exist_ok=True)
    headers = sorted(CSRC.rglob("*.h")) + sorted(CORE_INCLUDE.rglob("*.h"))
    jobs_list = []
    for level, (defs, flags) in LEVELS.items():
        for src in sorted((CSRC / "kernels").glob("*.cpp")):
            cmd = [cxx, *COMMON, f"-DBNB_ISA_NS={level}", *(f"-D{d}=1" for d in defs), *flags, "-c", str(src)]
            obj = out / f"{src.stem}.{level}.{_tag(cmd)}.o"
            jobs_list.append((obj, [src, *headers], [*cmd, "-o", str(obj)]))
    for name, src in (("thread_pool", CSRC / "thread_pool.cpp"), ("neon_driver", HERE / "neon_driver.cpp")):
        cmd = [cxx, *COMMON, "-c", str(src)]
        obj = out / f"{name}.{_tag(cmd)}.o"
        jobs_list.append((obj, [src, *headers], [*cmd, "-o", str(obj)]))

    def run(job):
        obj, deps, cmd = job
        if _stale(obj, deps):
            subprocess.run(cmd, check=True)
        return obj

    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        objs = list(pool.map(run, jobs_list))
    exe = out / "neon_driver"
    if _stale(exe, objs):
        subprocess.run([cxx, *map(str, objs), "-o", str(exe), "-pthread", "-static"], check=True)
    return exe


def run(exe: Path, cpu: str, levels: list[str]) -> subprocess.CompletedProcess:
    q = qemu()
    if q is None:
        raise RuntimeError("qemu-aarch64 not found (apt-get install qemu-user-static)")
    return subprocess.run(
        [q, "-L", QEMU_SYSROOT, "-cpu", cpu, str(exe), *levels], capture_output=True, text=True, check=False
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=BACKEND / "build" / "neon-driver")
    p.add_argument("--cpu", default="max")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    p.add_argument("levels", nargs="*")
    a = p.parse_args()
    exe = build(a.out, a.jobs)
    r = run(exe, a.cpu, a.levels)
    sys.stdout.write(r.stdout + r.stderr)
    return r.returncode


if __name__ == "__main__":
    sys.exit(main())
