"""The thread count the kernels are given."""

from __future__ import annotations

import torch


def threads() -> int:
    """Threads the kernels may use: torch's intra-op setting, read on every call."""
    return torch.get_num_threads()
