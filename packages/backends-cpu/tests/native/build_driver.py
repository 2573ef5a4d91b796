"""Cross-compiles the NEON kernel check (neon_driver.cpp) for aarch64 and runs it under qemu-aarch64.

Each kernel file is compiled once per arm64 ISA level into bnb::<level>, with the flags and definitions
the CMake build uses (scalar, neon, neon_dotprod, neon_bf16), and linked with the real thread pool.

    python packages/backends-cpu/tests/native/build_driver.py [--out DIR] [--cpu max] [--coverage] [level ...]

With --coverage the objects are built with gcov instrumentation and, after the run, each level's
executed share of the NEON-only source lines (inside `#if ... BNB_ISA_NEON ...` branches and
neon_simd.h) is printed per kernel file and per function.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import gzip
import hashlib
import json
import os
import re
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


def build(out: Path, jobs: int = 2, coverage: bool = False) -> Path:
    """Builds (incrementally, by modification time) out/neon_driver and returns its path."""
    cxx = compiler()
    common = [*COMMON, "--coverage", "-O1"] if coverage else COMMON
    if cxx is None:
        raise RuntimeError("aarch64-linux-gnu-g++ not found (apt-get install g++-aarch64-linux-gnu)")
    out.mkdir(parents=True, exist_ok=True)
    headers = sorted(CSRC.rglob("*.h")) + sorted(CORE_INCLUDE.rglob("*.h"))
    jobs_list = []
    for level, (defs, flags) in LEVELS.items():
        for src in sorted((CSRC / "kernels").glob("*.cpp")):
            cmd = [cxx, *common, f"-DBNB_ISA_NS={level}", *(f"-D{d}=1" for d in defs), *flags, "-c", str(src)]
            obj = out / f"{src.stem}.{level}.{_tag(cmd)}.o"
            jobs_list.append((obj, [src, *headers], [*cmd, "-o", str(obj)]))
    for name, src in (("thread_pool", CSRC / "thread_pool.cpp"), ("neon_driver", HERE / "neon_driver.cpp")):
        cmd = [cxx, *common, "-c", str(src)]
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
        link = ["--coverage"] if coverage else []
        subprocess.run([cxx, *map(str, objs), "-o", str(exe), "-pthread", "-static", *link], check=True)
    return exe


def _neon_lines(path: Path) -> set[int]:
    """Line numbers of `path` inside a preprocessor branch whose condition names a BNB_ISA_NEON* macro
    (nested branches included); every line of neon_simd.h."""
    lines = path.read_text().splitlines()
    if path.name == "neon_simd.h":
        return set(range(1, len(lines) + 1))
    stack: list[bool] = []
    out: set[int] = set()
    for no, line in enumerate(lines, 1):
        t = line.strip()
        if re.match(r"#\s*if", t):
            stack.append("BNB_ISA_NEON" in t)
        elif re.match(r"#\s*elif", t) and stack:
            stack[-1] = "BNB_ISA_NEON" in t
        elif re.match(r"#\s*else", t) and stack:
            stack[-1] = False
        elif re.match(r"#\s*endif", t) and stack:
            stack.pop()
        elif any(stack):
            out.add(no)
    return out


def coverage_report(out: Path) -> dict[str, dict[str, tuple[int, int, list[str]]]]:
    """After a coverage run: {level: {kernel file: (NEON lines executed, NEON lines, NEON functions never
    run)}} from gcov's JSON, for the three NEON levels. Lines of a header count toward the kernel file
    whose object compiled them."""
    gcov = shutil.which("aarch64-linux-gnu-gcov")
    if gcov is None:
        raise RuntimeError("aarch64-linux-gnu-gcov not found")
    report: dict[str, dict[str, tuple[int, int, list[str]]]] = {}
    for obj in sorted(out.glob("*.o")):
        stem, level = obj.name.split(".")[:2]
        if not level.startswith("neon"):
            continue
        r = subprocess.run([gcov, "--json-format", "--stdout", str(obj)], capture_output=True, check=True, cwd=out)
        data = r.stdout
        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
        hit = total = 0
        unrun: list[str] = []
        for doc in data.decode().splitlines():
            if not doc.strip():
                continue
            for f in json.loads(doc)["files"]:
                src = Path(f["file"])
                if not src.is_absolute():
                    src = (Path(json.loads(doc).get("current_working_directory", ".")) / src).resolve()
                if CSRC not in src.parents:
                    continue
                neon = _neon_lines(src)
                counts = {ln["line_number"]: ln["count"] for ln in f["lines"] if ln["line_number"] in neon}
                hit += sum(1 for c in counts.values() if c > 0)
                total += len(counts)
                for fn in f.get("functions", []):
                    if fn["start_line"] in neon and fn["execution_count"] == 0:
                        unrun.append(f"{src.name}:{fn['start_line']} {fn['demangled_name']}")
        report.setdefault(level, {})[stem] = (hit, total, unrun)
    return report


def build_host(out: Path, jobs: int = 2) -> Path:
    """The driver for this machine with the scalar kernels only (-DBNB_DRIVER_SCALAR_ONLY): it prints the
    digest of their outputs on the same inputs as the arm64 run."""
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        raise RuntimeError("no host C++ compiler (g++)")
    out.mkdir(parents=True, exist_ok=True)
    headers = sorted(CSRC.rglob("*.h")) + sorted(CORE_INCLUDE.rglob("*.h"))
    sources = [
        (f"{src.stem}.scalar", src, ["-DBNB_ISA_NS=scalar", "-DBNB_ISA_SCALAR=1"])
        for src in sorted((CSRC / "kernels").glob("*.cpp"))
    ]
    sources += [
        ("thread_pool", CSRC / "thread_pool.cpp", []),
        ("neon_driver", HERE / "neon_driver.cpp", ["-DBNB_DRIVER_SCALAR_ONLY=1"]),
    ]
    jobs_list = []
    for name, src, extra in sources:
        cmd = [cxx, *COMMON, *extra, "-c", str(src)]
        obj = out / f"{name}.{_tag(cmd)}.o"
        jobs_list.append((obj, [src, *headers], [*cmd, "-o", str(obj)]))

    def run_job(job):
        obj, deps, cmd = job
        if _stale(obj, deps):
            subprocess.run(cmd, check=True)
        return obj

    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        objs = list(pool.map(run_job, jobs_list))
    exe = out / "scalar_driver"
    if _stale(exe, objs):
        subprocess.run([cxx, *map(str, objs), "-o", str(exe), "-pthread"], check=True)
    return exe


def digest(stdout: str) -> str:
    """The `scalar digest:` line a driver run printed."""
    for line in stdout.splitlines():
        if line.startswith("scalar digest:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError(f"no digest in the driver's output:\n{stdout}")


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
    p.add_argument("--coverage", action="store_true")
    p.add_argument("levels", nargs="*")
    a = p.parse_args()
    out = a.out / "coverage" if a.coverage else a.out
    exe = build(out, a.jobs, a.coverage)
    for stale in out.glob("*.gcda"):
        stale.unlink()
    r = run(exe, a.cpu, a.levels)
    sys.stdout.write(r.stdout + r.stderr)
    if a.coverage:
        for level, files in coverage_report(out).items():
            for stem, (hit, total, unrun) in sorted(files.items()):
                print(f"{level:13} {stem:11} NEON lines run: {hit:4} of {total:4}")
                for name in unrun:
                    print(f"{'':13} never run: {name}")
    return r.returncode


if __name__ == "__main__":
    sys.exit(main())
