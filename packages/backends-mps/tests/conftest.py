"""Fixtures: ``emulated`` loads the Metal kernels in the emulator for one test and forgets them after."""

from __future__ import annotations

import pytest

from bitsandbytes_mps import library


@pytest.fixture
def emulated():
    # Imported here, not at the top: the Mac-only tests (tests/mac) run without the emulator installed.
    library.emulator().skip_unless_available()  # names the missing C++ compiler
    old = library.use_emulator(True)
    library.reset()
    yield library.load()
    library.use_emulator(old)
    library.reset()
