"""Every task of the project. `nox -l` lists them; README.md names the two that matter most."""

from __future__ import annotations

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


def install(session: nox.Session, *args: str) -> None:
    """pip install with the project's constraints (torch pinned to the build on this machine's disk)."""
    session.install("-c", CONSTRAINTS, *args)


# ISA levels the CPU backend's conformance run covers; "native" is the best this machine has.
CPU_ISAS = ("native", "avx2", "scalar")


@nox.session
def tests(session: nox.Session) -> None:
    """Core tests on the reference kernels, then the CPU backend: built from source, its own tests, and
    the conformance suite through its kernels at every ISA level."""
    install(session, "torch", "-e", f"{CORE}[test]")
    strict = {"BNB_STRICT_BACKENDS": "1"}
    session.run("pytest", "packages/core/tests", *session.posargs, env={**strict, "BNB_BACKENDS": "none"})
    # The conformance suite as a backend author runs it: installed package, one device.
    session.run("python", "-m", "bitsandbytes.testing", "--device", "cpu", env={**strict, "BNB_BACKENDS": "none"})

    install(session, "./packages/backends-cpu")
    session.run("pytest", "packages/backends-cpu/tests", *session.posargs, env=strict)
    # Upstream's bytes must come out of the native kernels too.
    session.run("pytest", "-q", "packages/core/tests/test_compat_upstream.py", env=strict)
    for isa in CPU_ISAS:
        session.log(f"conformance on the CPU backend, BNB_CPU_ISA={isa}")
        session.run("python", "-m", "bitsandbytes.testing", "--device", "cpu", "-q", env={**strict, "BNB_CPU_ISA": isa})


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check over the whole tree."""
    session.install("ruff==0.17.5")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def demo(session: nox.Session) -> None:
    """The main job: quantize a small MLP to NF4 and 8-bit and report bytes, error and time."""
    install(session, "torch", "-e", CORE)
    session.run("python", "examples/demo.py", *session.posargs)


@nox.session
def docs(session: nox.Session) -> None:
    """Build the documentation site (mkdocs, warnings are errors) into site/."""
    install(session, "torch", "-e", CORE, "-r", "docs/requirements.txt")
    session.run("mkdocs", "build", "--strict", "-f", "docs/mkdocs.yml", "-d", str(ROOT / "site"))


@nox.session(name="compat-fixtures")
def compat_fixtures(session: nox.Session) -> None:
    """Regenerate the fixtures from upstream bitsandbytes in this session's own venv."""
    install(session, "torch", UPSTREAM)
    out = ROOT / "packages" / "core" / "tests" / "fixtures" / "upstream"
    session.run("python", "ci/make_compat_fixtures.py", str(out), env={"BNB_FIXTURE_UPSTREAM": UPSTREAM})
