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

# ISA levels the CPU backend's conformance run covers; "native" is the best this machine has.
CPU_ISAS = ("native", "avx2", "scalar")

# The one architecture CI builds the CUDA backend for (the full list is in its CMakeLists.txt).
CUDA_CI_ARCH = os.environ.get("BNB_CUDA_ARCHS", "80")
CUDA = "./packages/backends-cuda"


@nox.session
def tests(session: nox.Session) -> None:
    """Core tests on the reference kernels, then the CPU backend: built from source, its own tests, and
    the conformance suite through its kernels at every ISA level; last, the real clients (transformers,
    PEFT, accelerate) on the native kernels."""
    install(session, "torch", "-e", f"{CORE}[test]")
    strict = {"BNB_STRICT_BACKENDS": "1"}
    session.run(
        "pytest",
        "packages/core/tests",
        f"--ignore={CLIENT_TESTS}",
        *session.posargs,
        env={**strict, "BNB_BACKENDS": "none"},
    )
    # The conformance suite as a backend author runs it: installed package, one device.
    session.run("python", "-m", "bitsandbytes.testing", "--device", "cpu", env={**strict, "BNB_BACKENDS": "none"})

    install(session, "./packages/backends-cpu")
    session.run("pytest", "packages/backends-cpu/tests", *session.posargs, env=strict)
    # Upstream's bytes must come out of the native kernels too.
    session.run("pytest", "-q", "packages/core/tests/test_compat_upstream.py", env=strict)
    for isa in CPU_ISAS:
        session.log(f"conformance on the CPU backend, BNB_CPU_ISA={isa}")
        session.run("python", "-m", "bitsandbytes.testing", "--device", "cpu", "-q", env={**strict, "BNB_CPU_ISA": isa})

    _tests_cuda_emulated(session, strict)

    install(session, *CLIENTS)
    session.run("pytest", "-q", CLIENT_TESTS, *session.posargs, env=strict)


def _tests_cuda_emulated(session: nox.Session, strict: dict) -> None:
    """The CUDA backend without a GPU: built with nvcc for one architecture (BNB_CUDA_ARCHS, default 80,
    keeps CI time modest), its own tests, then the conformance suite on its kernels in the emulator."""
    import shutil

    if shutil.which("nvcc") is None:
        session.log("skipping the CUDA backend: nvcc is not on PATH (install the CUDA toolkit to build it)")
        return
    install(session, CUDA, env={"BNB_CUDA_ARCHS": CUDA_CI_ARCH})
    session.run("pytest", "packages/backends-cuda/tests", *session.posargs, env=strict)
    session.log("conformance on the emulated CUDA kernels")
    emulated = ("-p", "bitsandbytes_cuda.testing.emulated")
    session.run(
        "python",
        "-m",
        "bitsandbytes.testing",
        "--device",
        "cpu",
        "-q",
        *emulated,
        env={**strict, "BNB_BACKENDS": "none"},
    )


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check over the Python, clang-format (.clang-format) over the C++."""
    session.install("ruff==0.17.5", "clang-format==23.1.3")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("clang-format", "--dry-run", "--Werror", *_cxx_sources())


def _cxx_sources() -> list[str]:
    """The C++/CUDA/Metal sources under version control, less generated ones (their generator owns the layout)."""
    import subprocess

    patterns = ["*.c", "*.cc", "*.cpp", "*.h", "*.hpp", "*.cu", "*.cuh", "*.mm"]
    listed = subprocess.run(["git", "ls-files", *patterns], cwd=ROOT, check=True, capture_output=True, text=True)
    return [f for f in listed.stdout.split() if not f.endswith("include/bitsandbytes/formats.h")]


@nox.session
def demo(session: nox.Session) -> None:
    """The main job: QLoRA on CPU. A small Llama-style model quantized to NF4 through transformers,
    LoRA adapters trained with bitsandbytes' PagedAdamW8bit on a synthetic task; prints a report."""
    install(session, "torch", "-e", CORE, *CLIENTS, "tqdm", "matplotlib")
    install(session, "./packages/backends-cpu")
    session.run("python", "examples/demo.py", *session.posargs)


@nox.session
def docs(session: nox.Session) -> None:
    """Build the documentation site (mkdocs, warnings are errors) into site/."""
    install(session, "torch", "-e", CORE, "-r", "docs/requirements.txt")
    session.run("mkdocs", "build", "--strict", "-f", "docs/mkdocs.yml", "-d", str(ROOT / "site"))


@nox.session
def bench(session: nox.Session) -> None:
    """CPU benchmark of issue 3 (a benchmark, not a test): native kernels vs the reference, upstream
    bitsandbytes in a venv of its own, and dense torch; 2 threads. Writes
    packages/backends-cpu/bench/results/cpu_bench.{md,json}. `nox -s bench -- --quick`: one shape, ~2 min."""
    install(session, "torch", "-e", CORE)
    install(session, "./packages/backends-cpu")
    # Upstream needs a venv of its own (both distributions are named bitsandbytes), kept beside this
    # session's; the harness runs its worker script there as a subprocess in this same invocation.
    upstream = Path(session.virtualenv.location).parent / "bench-upstream"
    python = upstream / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")
    if not python.exists():
        session.run("python", "-m", "venv", str(upstream))
    session.run(str(python), "-m", "pip", "install", "-q", "-c", CONSTRAINTS, "torch", UPSTREAM, external=True)
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


@nox.session(name="tests-cuda")
def tests_cuda(session: nox.Session) -> None:
    """On a machine with an NVIDIA GPU: the CUDA backend built for that GPU, its tests, the conformance
    suite on device cuda and the nn/optim tests on cuda (packages/backends-cuda/tests/gpu)."""
    install(session, "torch", "-e", f"{CORE}[test]")
    _install_cuda_for_this_gpu(session)
    strict = {"BNB_STRICT_BACKENDS": "1"}
    session.run("python", "-m", "bitsandbytes", env=strict)  # diagnostics: archs, driver, runtime
    session.run("pytest", "packages/backends-cuda/tests", *session.posargs, env=strict)
    session.run("python", "-m", "bitsandbytes.testing", "--device", "cuda", "-q", *session.posargs, env=strict)


@nox.session(name="bench-cuda")
def bench_cuda(session: nox.Session) -> None:
    """On a GPU: per op, ours vs upstream bitsandbytes==0.50.2 (CUDA, in a venv of its own) vs dense torch;
    GB/s and % of the device's peak bandwidth. Writes packages/backends-cuda/bench/results/cuda_bench.md."""
    install(session, "torch", "-e", CORE)
    _install_cuda_for_this_gpu(session)
    upstream = Path(session.virtualenv.location).parent / "bench-cuda-upstream"
    python = upstream / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")
    if not python.exists():
        session.run("python", "-m", "venv", str(upstream))
    session.run(str(python), "-m", "pip", "install", "-q", "-c", CONSTRAINTS, "torch", UPSTREAM, external=True)
    bench = "packages/backends-cuda/bench/bench_cuda.py"
    session.run("python", bench, "--upstream-python", str(python), *session.posargs)
