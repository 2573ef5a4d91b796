"""Registration of a Python kernel for the cpu device, and the record of what is native."""

from __future__ import annotations

from collections.abc import Callable

import torch

# op name -> kernel, for diagnostics and tests.
REGISTERED: dict[str, Callable] = {}


def cpu_kernel(op: str, fn: Callable) -> None:
    if op in REGISTERED:
        return  # already registered in this process (register_all is idempotent)
    torch.library.register_kernel(f"bitsandbytes::{op}", "cpu")(fn)
    REGISTERED[op] = fn


def threads() -> int:
    """Threads the kernels may use: torch's intra-op setting, read on every call."""
    return torch.get_num_threads()
