"""Compiling kernel modules with the host C++ compiler, cached by content hash.

The runtime (src/runtime.cpp) is compiled once per compiler and flags into an object file; each kernel
module is one generated translation unit linked with it into a shared library. A module is rebuilt when its text,
the emulator's own sources, the compiler or any header it included changed (the compiler's dependency
list is kept next to the library with a hash of every file on it).

BNB_EMU_SANITIZE=address,undefined (any -fsanitize= list) builds the runtime and every module with those
sanitizers; the flags are part of the cache key. The process must then have the sanitizer runtime loaded
first (LD_PRELOAD of the compiler's libasan; `nox -s sanitize` does this).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from .errors import EmulationCompileError, EmulationError

HERE = Path(__file__).parent
INCLUDE = HERE / "include"
CUDA_HEADERS = INCLUDE / "bnb_emu" / "cuda_headers"
RUNTIME = HERE / "src" / "runtime.cpp"

# -O1 keeps compiles fast; no fp contraction so results do not depend on the host's FMA support.
CXXFLAGS = (
    "-std=c++17",
    "-O1",
    "-pthread",
    "-fPIC",
    "-fvisibility=hidden",
    "-ffp-contract=off",
    "-fno-strict-aliasing",
)
# CUDA sources carry pragmas and attributes the host compiler does not know.
KERNEL_WARNINGS = ("-Wno-unknown-pragmas", "-Wno-attributes")
NEED_COMPILER = "a C++ compiler (g++ or clang++)"
SANITIZE_ENV = "BNB_EMU_SANITIZE"


def sanitizer_flags() -> tuple[str, ...]:
    """The extra compile flags $BNB_EMU_SANITIZE asks for (none when unset)."""
    wanted = os.environ.get(SANITIZE_ENV, "").strip()
    if not wanted:
        return ()
    if not re.fullmatch(r"[a-z0-9-]+(,[a-z0-9-]+)*", wanted):
        raise EmulationError(f"{SANITIZE_ENV} must be a -fsanitize= list such as 'address,undefined', got {wanted!r}")
    if "address" in wanted.split(",") and not _asan_runtime_loaded():
        # dlopen of an ASan-instrumented library into a process without the runtime fails with a message
        # that does not say what to do.
        raise EmulationError(
            f"{SANITIZE_ENV}={wanted} needs the ASan runtime loaded before Python starts: run with "
            "LD_PRELOAD=$($CXX -print-file-name=libasan.so) (ci/sanitize/run.py sets up the environment)"
        )
    return (f"-fsanitize={wanted}", "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer", "-g")


def _asan_runtime_loaded() -> bool:
    import ctypes

    try:
        return hasattr(ctypes.CDLL(None), "__asan_init")
    except OSError:
        return False


def _flags() -> tuple[str, ...]:
    return (*CXXFLAGS, *sanitizer_flags())


def _compiler_env() -> dict[str, str] | None:
    """The environment for the compiler: this one less any preloaded sanitizer runtime, since the compiler
    is not instrumented (under the runtime it only runs slower, and some toolchains crash); None: unchanged."""
    preload = os.environ.get("LD_PRELOAD", "").replace(":", " ").split()
    kept = [p for p in preload if not _SANITIZER_RUNTIME.match(Path(p).name)]
    if len(kept) == len(preload):
        return None
    env = dict(os.environ)
    env["LD_PRELOAD"] = ":".join(kept)
    return env


_SANITIZER_RUNTIME = re.compile(r"lib(asan|ubsan|tsan|lsan|hwasan)\.so|libclang_rt\.")


def find_compiler() -> str | None:
    """The host C++ compiler: $CXX, else g++, else clang++; None when there is none."""
    cxx = os.environ.get("CXX")
    if cxx:
        return shutil.which(cxx) or (cxx if Path(cxx).is_file() else None)
    return shutil.which("g++") or shutil.which("clang++")


def unavailable_reason() -> str | None:
    """Why kernels cannot be emulated here (naming what is missing), or None."""
    if find_compiler() is None:
        return f"kernel emulation needs {NEED_COMPILER}; none found (set CXX or install g++)"
    return None


@functools.cache
def _compiler_identity(cxx: str) -> str:
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=60, env=_compiler_env())
    except OSError as e:
        raise EmulationError(f"cannot run the C++ compiler {cxx!r}: {e}") from None
    return cxx + "\n" + out.stdout.splitlines()[0] if out.stdout else cxx


def cache_dir() -> Path:
    """$BNB_EMU_CACHE, else ~/.cache/bitsandbytes/emu (a temp dir when home is not writable)."""
    env = os.environ.get("BNB_EMU_CACHE")
    path = Path(env) if env else Path.home() / ".cache" / "bitsandbytes" / "emu"
    try:
        path.mkdir(parents=True, exist_ok=True)
        return path
    except OSError:
        fallback = Path(tempfile.gettempdir()) / f"bnb-emu-{os.getuid() if hasattr(os, 'getuid') else 0}"
        fallback.mkdir(parents=True, exist_ok=True)
        return fallback


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@functools.cache
def _emulator_sources_hash() -> str:
    h = hashlib.sha256()
    for p in sorted([*INCLUDE.rglob("*"), RUNTIME]):
        if p.is_file():
            h.update(str(p.relative_to(HERE)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def _run(cmd: list[str], what: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_compiler_env())
    if proc.returncode != 0:
        raise EmulationCompileError(f"{what} failed to compile in emulation:\n{proc.stderr.strip()}", proc.stderr)


def _runtime_object(cxx: str, base_flags: tuple[str, ...]) -> Path:
    key = _sha((_compiler_identity(cxx) + "\0" + " ".join(base_flags) + "\0" + _emulator_sources_hash()).encode())
    obj = cache_dir() / f"runtime-{key[:24]}.o"
    if not obj.exists():
        tmp = obj.with_suffix(f".{os.getpid()}.tmp.o")
        _run([cxx, *base_flags, "-I", str(INCLUDE), "-c", str(RUNTIME), "-o", str(tmp)], "the emulator runtime")
        os.replace(tmp, obj)
    return obj


def _deps_fresh(manifest: Path) -> bool:
    try:
        recorded = json.loads(manifest.read_text())
        return all(_sha(Path(f).read_bytes()) == h for f, h in recorded.items())
    except (OSError, ValueError):
        return False


def _parse_depfile(text: str) -> list[str]:
    body = text.replace("\\\n", " ").split(":", 1)[-1]
    files, cur = [], ""
    for tok in body.split(" "):
        if tok.endswith("\\"):  # an escaped space inside a path
            cur += tok[:-1] + " "
            continue
        cur += tok
        if cur.strip():
            files.append(cur.strip())
        cur = ""
    return files


def _user_file(path: Path, generated: Path) -> bool:
    # The compiler and the emulator are already in the key; only the kernel's own headers are tracked.
    path = path.resolve()
    return path != generated.resolve() and not path.is_relative_to(INCLUDE.resolve()) and path.parts[1:2] != ("usr",)


def build(
    tu_text: str,
    *,
    dialect: str,
    label: str,
    include_dirs: list[str],
    defines: dict[str, object],
    extra_flags: tuple[str, ...] = (),
) -> Path:
    """Compile one generated translation unit into a shared library (or find it cached); its path.
    ``extra_flags`` apply to the module only (not the runtime) and are part of the cache key."""
    cxx = find_compiler()
    if cxx is None:
        raise EmulationError(unavailable_reason())
    base_flags = _flags()
    runtime = _runtime_object(cxx, base_flags)
    flags = [*base_flags, *extra_flags, *KERNEL_WARNINGS, "-I", str(INCLUDE)]
    if dialect == "cuda":
        flags += ["-I", str(CUDA_HEADERS)]
    for d in include_dirs:
        flags += ["-I", str(d)]
    for name, value in sorted(defines.items()):
        flags.append(f"-D{name}" if value is None else f"-D{name}={value}")
    flags += ["-include", f"bnb_emu/{dialect}.h"]

    key = _sha("\0".join([_compiler_identity(cxx), " ".join(flags), _emulator_sources_hash(), tu_text]).encode())
    out_dir = cache_dir() / "modules"
    out_dir.mkdir(exist_ok=True)
    lib = out_dir / f"{key[:32]}.so"
    manifest = out_dir / f"{key[:32]}.deps.json"
    if lib.exists() and _deps_fresh(manifest):
        return lib

    stem = out_dir / f"{key[:32]}.{os.getpid()}"
    src, tmp_lib, depfile = Path(f"{stem}.cc"), Path(f"{stem}.tmp.so"), Path(f"{stem}.d")
    src.write_text(tu_text)
    try:
        _run(
            [cxx, *flags, "-MD", "-MF", str(depfile), "-shared", str(src), str(runtime), "-o", str(tmp_lib)],
            label,
        )
        deps = [f for f in _parse_depfile(depfile.read_text()) if _user_file(Path(f), src)]
        manifest.write_text(json.dumps({f: _sha(Path(f).read_bytes()) for f in deps if Path(f).is_file()}))
        os.replace(tmp_lib, lib)
    finally:
        for p in (src, tmp_lib, depfile):
            p.unlink(missing_ok=True)
    return lib
