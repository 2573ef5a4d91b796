"""Backend plugins: how native kernels reach bitsandbytes.

A backend is a distribution that declares an entry point in the group ``bitsandbytes.backends``. The
entry point names either a callable (upstream's convention: called once with no arguments, it
registers kernels with ``torch.library``) or a :class:`Backend` object, which the core validates
(plugin API version, the device types it claims) before calling its ``load()``.

Environment variables read at ``import bitsandbytes``:

* ``BNB_BACKENDS=cpu,mps`` loads only the named entry points; ``BNB_BACKENDS=none`` loads none.
* ``BNB_STRICT_BACKENDS=1`` turns a broken plugin into an import error instead of a warning.

``bitsandbytes.backends.kit`` holds the helpers a backend package is built from (registration, the
family-module walk, ``.out`` pairs, the emulated test plugin).

``python -m bitsandbytes`` prints every backend's status and the op x device coverage matrix.
"""

from . import kit
from .discovery import (
    GROUP,
    RECORDS,
    BackendLoadError,
    BackendLoadWarning,
    BackendRecord,
    MissingBackendWarning,
    load_backends,
    missing_accelerators,
)
from .dispatch import coverage
from .plugin import API_VERSION, Backend

__all__ = [
    "API_VERSION",
    "GROUP",
    "Backend",
    "BackendLoadError",
    "BackendLoadWarning",
    "BackendRecord",
    "MissingBackendWarning",
    "coverage",
    "kit",
    "load_backends",
    "missing_accelerators",
    "records",
]


def records() -> list[BackendRecord]:
    """One record per installed backend plugin: distribution, status, device types, kernels."""
    return list(RECORDS)
