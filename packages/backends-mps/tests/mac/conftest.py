"""On a Mac, every test here fails when a Metal kernel was dropped while it ran: in production a kernel
whose dispatch raises falls back to the reference with only a warning, which would let a real kernel
failure pass as a green test."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def no_kernel_dropped():
    if not torch.backends.mps.is_available():
        yield
        return
    from bitsandbytes_mps import library

    before = dict(library.status().dropped)
    yield
    new = {k: v for k, v in library.status().dropped.items() if k not in before}
    assert not new, f"Metal kernels dropped during this test (their dispatch raised): {new}"
