"""Python glue of the CPU kernels: one module per kernel family, each registering its ops for "cpu".

Every kernel validates its arguments with the core's contract (``bitsandbytes._ops.check_*``, the
same errors as the reference), makes inputs contiguous, allocates outputs with torch and then
calls into ``bitsandbytes_cpu._C``, which re-checks sizes and releases the GIL while it runs.
"""

from __future__ import annotations

import importlib
import pkgutil

from ._register import REGISTERED

__all__ = ["REGISTERED", "register_all"]


def register_all() -> None:
    for module in pkgutil.iter_modules(__path__):
        if not module.name.startswith("_"):
            importlib.import_module(f"{__name__}.{module.name}").register()
