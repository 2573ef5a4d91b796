"""Fixtures: ``emulated`` runs launch() in the kernel emulator for the duration of a test."""

from __future__ import annotations

import pytest

import bitsandbytes_emu as emu
from bitsandbytes_cuda import launch


@pytest.fixture
def emulated():
    emu.skip_unless_available()  # names the missing C++ compiler
    old = launch.use_emulator(True)
    yield
    launch.use_emulator(old)
