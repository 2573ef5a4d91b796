"""Fixtures for the emulator's self-tests: kernels from kernels/, compiled once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

import bitsandbytes_emu as emu

KERNELS = Path(__file__).parent / "kernels"


@pytest.fixture(scope="session")
def cuda_kernels():
    """``cuda_kernels("reduce.cu", {...})`` loads a kernel file of kernels/ in emulation (skips, naming
    the missing compiler, where there is none)."""
    emu.skip_unless_available()

    def load(filename: str, kernels, **kwargs) -> emu.Module:
        return emu.load_cuda(KERNELS / filename, kernels, **kwargs)

    return load


@pytest.fixture
def compile_cuda(tmp_path):
    """Compile CUDA source text in emulation (for the tests of what must not compile)."""
    emu.skip_unless_available()

    def compile_(code: str, kernels, name: str = "snippet.cu") -> emu.Module:
        return emu.load_cuda(tmp_path / name, kernels, code=code)

    return compile_
