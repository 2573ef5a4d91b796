"""Autograd functions for the quantized matmuls (upstream's ``bitsandbytes.autograd``)."""

from ._functions import *  # noqa: F403
from ._functions import __all__  # noqa: F401
