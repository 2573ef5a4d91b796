"""The table of reference kernels, and the decorator that registers one as an op's default kernel."""

from __future__ import annotations

from collections.abc import Callable

import torch

from .._ops import OPS, qualname

# op name ("quantize_4bit", "gemv_4bit.out", ...) -> the pure-PyTorch kernel that defines its semantics.
# The conformance suite calls these directly to get the expected result for any backend's kernel.
REFERENCE: dict[str, Callable] = {}


def reference(op: str):
    """Register ``fn`` as the default kernel of ``bitsandbytes::<op>`` for every device."""
    if op not in OPS:
        raise KeyError(f"unknown op {op!r}")

    def register(fn: Callable) -> Callable:
        if op in REFERENCE:
            raise RuntimeError(f"a reference kernel for {op} is already registered")
        REFERENCE[op] = fn
        # device_types=None registers under CompositeExplicitAutograd: the kernel for every device
        # that has no kernel of its own.
        torch.library.register_kernel(qualname(op), None)(fn)
        return fn

    return register
