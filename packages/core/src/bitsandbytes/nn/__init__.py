"""torch.nn modules with quantized weights (upstream's ``bitsandbytes.nn``)."""

from .modules import *  # noqa: F403
from .modules import __all__  # noqa: F401
