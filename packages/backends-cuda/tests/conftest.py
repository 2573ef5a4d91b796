"""Fixtures: ``emulated`` runs launch() in the kernel emulator for the duration of a test."""

from __future__ import annotations

import pytest

from bitsandbytes_cuda import launch


@pytest.fixture
def emulated():
    # Imported here, not at the top: the GPU-only tests (tests/gpu) run without the emulator installed.
    launch.emulator().skip_unless_available()  # names the missing C++ compiler
    old = launch.use_emulator(True)
    yield
    launch.use_emulator(old)


@pytest.fixture(scope="module")
def code():
    """The signed dynamic 8-bit map, float32: the default code of blockwise quantization."""
    from bitsandbytes import functional

    return functional.create_dynamic_map(signed=True).float()
