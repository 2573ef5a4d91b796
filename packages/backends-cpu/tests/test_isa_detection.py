"""The ISA level the backend detects, against what the CPU has as read independently of csrc/isa.cpp:
the Linux kernel's /proc/cpuinfo flags (x86 and arm64), macOS's sysctl command, and under qemu-user the
feature sets of the emulated CPU models (QEMU_CPU; `nox -s tests-arm64` runs this file there)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

import bitsandbytes_cpu

MACHINE = platform.machine().lower()
ARM64 = MACHINE in ("aarch64", "arm64")
X86 = MACHINE in ("x86_64", "amd64")
# qemu-user reads QEMU_CPU at every exec; tests-arm64 sets it, so its presence says we run emulated (where
# /proc/cpuinfo is the x86 host's).
EMULATED = ARM64 and sys.platform == "linux" and "QEMU_CPU" in os.environ

# What each qemu 7.2 CPU model offers of the features our levels need (qemu's target/arm/cpu64.c):
# Cortex-A72 is Armv8.0 (no DotProd); Cortex-A76 and Neoverse-N1 are Armv8.2 with DotProd but no BF16 or
# I8MM; `max` has every feature qemu implements.
ARM64_LEVELS = ["scalar", "neon", "neon_dotprod", "neon_bf16"]
QEMU_CPUS = {"cortex-a72": "neon", "cortex-a76": "neon_dotprod", "neoverse-n1": "neon_dotprod", "max": "neon_bf16"}


def expected_arm64_level(features: set[str]) -> str:
    """The contract (docs/pages/cpu.md): neon_dotprod needs DotProd; neon_bf16 needs DotProd, BF16, FHM, I8MM."""
    if not {"dotprod"} <= features:
        return "neon"
    if {"bf16", "fhm", "i8mm"} <= features and "neon_bf16" in bitsandbytes_cpu.compiled_isas():
        return "neon_bf16"
    return "neon_dotprod"


def cpuinfo_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def child_levels(env: dict[str, str]) -> subprocess.CompletedProcess:
    code = "import bitsandbytes_cpu as c; print(c.best_isa(), ' '.join(c.supported_isas()))"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)


def test_levels_are_a_prefix_of_what_was_compiled():
    compiled, supported = bitsandbytes_cpu.compiled_isas(), bitsandbytes_cpu.supported_isas()
    assert compiled[0] == "scalar" and supported == compiled[: len(supported)]
    assert bitsandbytes_cpu.best_isa() == supported[-1]
    if ARM64:
        assert compiled[:2] == ["scalar", "neon"], "the aarch64 baseline (neon) must always be built"
    if X86:
        assert compiled == ["scalar", "avx2", "avx512"]


@pytest.mark.skipif(sys.platform != "linux" or EMULATED, reason="needs /proc/cpuinfo of the CPU that runs us")
def test_best_level_follows_the_kernels_cpu_flags():
    flags = cpuinfo_flags()
    if X86:
        avx2 = {"avx2", "fma", "f16c"} <= flags
        avx512 = avx2 and {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags
        expected = "avx512" if avx512 else "avx2" if avx2 else "scalar"
    elif ARM64:
        names = {"asimddp": "dotprod", "bf16": "bf16", "asimdfhm": "fhm", "i8mm": "i8mm"}
        expected = expected_arm64_level({names[f] for f in flags if f in names})
    else:
        pytest.skip(f"no ISA levels above scalar on {MACHINE}")
    assert bitsandbytes_cpu.best_isa() == expected, f"/proc/cpuinfo flags: {sorted(flags)}"


@pytest.mark.skipif(not (ARM64 and sys.platform == "darwin"), reason="needs macOS on Apple Silicon")
def test_best_level_follows_macos_sysctl():
    def has(feature: str) -> bool:
        proc = subprocess.run(["sysctl", "-n", f"hw.optional.arm.FEAT_{feature}"], capture_output=True, text=True)
        return proc.returncode == 0 and proc.stdout.strip() == "1"

    names = {"DotProd": "dotprod", "BF16": "bf16", "FHM": "fhm", "I8MM": "i8mm"}
    expected = expected_arm64_level({ours for theirs, ours in names.items() if has(theirs)})
    assert bitsandbytes_cpu.best_isa() == expected


@pytest.mark.skipif(not EMULATED, reason="needs aarch64 Linux under qemu-user with QEMU_CPU set (nox -s tests-arm64)")
@pytest.mark.parametrize(("cpu", "level"), sorted(QEMU_CPUS.items()))
def test_best_level_under_emulated_cpu(cpu, level):
    proc = child_levels({**os.environ, "QEMU_CPU": cpu})
    assert proc.returncode == 0, proc.stderr
    best, levels = proc.stdout.split(maxsplit=1)
    assert best == level
    assert levels.split() == ARM64_LEVELS[: ARM64_LEVELS.index(level) + 1]


@pytest.mark.skipif(not EMULATED, reason="needs aarch64 Linux under qemu-user with QEMU_CPU set (nox -s tests-arm64)")
def test_a_level_above_the_emulated_cpu_is_refused_by_name():
    env = {**os.environ, "QEMU_CPU": "cortex-a72", "BNB_CPU_ISA": "neon_dotprod", "BNB_STRICT_BACKENDS": "1"}
    proc = subprocess.run([sys.executable, "-c", "import bitsandbytes"], env=env, capture_output=True, text=True)
    assert proc.returncode != 0
    assert "got 'neon_dotprod'" in proc.stderr and "scalar, neon)" in proc.stderr
