"""Fixtures: ``emulated`` loads the Metal kernels in the emulator for one test and forgets them after;
``dispatched`` records the kernels the ops dispatch; ``code`` is the signed dynamic 8-bit map."""

from __future__ import annotations

import pytest
import torch

from bitsandbytes import functional
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


@pytest.fixture
def dispatched(monkeypatch) -> list[str]:
    """The kernels the ops dispatch, in order."""
    names: list[str] = []
    real = library.dispatch

    def recording(name, *args, **kwargs):
        names.append(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(library, "dispatch", recording)
    return names


@pytest.fixture(scope="session")
def code() -> torch.Tensor:
    return functional.create_dynamic_map(signed=True).float()
