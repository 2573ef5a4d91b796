"""Fixtures: ``emulated`` loads the Metal kernels in the emulator for one test and forgets them after."""

from __future__ import annotations

import pytest

import bitsandbytes_emu as emu
from bitsandbytes_mps import library


@pytest.fixture
def emulated():
    emu.skip_unless_available()  # names the missing C++ compiler
    old = library.use_emulator(True)
    library.reset()
    yield library.load()
    library.use_emulator(old)
    library.reset()
