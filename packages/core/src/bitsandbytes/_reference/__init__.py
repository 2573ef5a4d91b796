"""Pure-PyTorch reference kernels: the executable definition of every op's semantics.

They run on any device and are registered as each op's default kernel, so every op works everywhere
before any native kernel exists. Written for clarity, not speed; backends are checked against them.
"""

from . import blockwise, fourbit, int8, matmul_4bit, optimizers  # noqa: F401  (registration side effects)
from ._registry import REFERENCE

__all__ = ["REFERENCE"]
