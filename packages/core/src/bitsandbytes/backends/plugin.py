"""The object a backend plugin hands to the core, and the plugin API version the core speaks."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

import torch

# The plugin API this core implements. A plugin declares the version it was built against; the major
# must match (a new major means the contract between core and kernels changed incompatibly), a minor
# only adds. Independent of the package version, which moves on every release.
API_VERSION = "1.2"  # 1.1: Backend(native_library=...); 1.2: bitsandbytes.backends.kit

_VERSION_RE = re.compile(r"^(\d+)\.(\d+)$")


def parse_api_version(value: object) -> tuple[int, int]:
    """``"MAJOR.MINOR"`` -> ``(major, minor)``; ``ValueError`` for anything else."""
    match = _VERSION_RE.match(value) if isinstance(value, str) else None
    if match is None:
        raise ValueError(f"api_version must be a string 'MAJOR.MINOR' like {API_VERSION!r}, got {value!r}")
    return int(match[1]), int(match[2])


class Backend:
    """A backend plugin: what an entry point of the group ``bitsandbytes.backends`` may point at.

    Either instantiate it with callables or subclass it and override the methods::

        backend = Backend("mydev", ["cuda"], api_version="1.0", load=register_kernels)

    Attributes:
        name: short name, shown in diagnostics; by convention the entry point's name.
        device_types: torch device types (``"cpu"``, ``"cuda"``, ``"mps"``, ...) the backend registers
            kernels for. Registering a kernel for any other device type gets the backend rejected.
        api_version: the plugin API (``"MAJOR.MINOR"``) the backend was written against; compare
            ``bitsandbytes.backends.API_VERSION``. Declare it literally, never copy the core's value.

    The core calls ``is_available()`` first; when it returns false the backend is skipped without
    error (e.g. a CUDA backend on a machine without a GPU). Otherwise it calls ``load()``, which
    registers kernels with ``torch.library.register_kernel("bitsandbytes::<op>", device_type)``.
    ``diagnostics()`` returns a JSON-friendly dict printed by ``python -m bitsandbytes``.
    ``native_library()`` (optional, once loaded) returns the backend's ``ctypes.CDLL`` exporting upstream's
    C entry points, or None; it becomes ``bitsandbytes.functional.lib`` (see ``bitsandbytes.cextension``).
    """

    def __init__(
        self,
        name: str,
        device_types: Iterable[str],
        *,
        api_version: str,
        load: Callable[[], Any] | None = None,
        is_available: Callable[[], bool] | None = None,
        diagnostics: Callable[[], dict] | None = None,
        native_library: Callable[[], Any] | None = None,
    ) -> None:
        self.name = name
        # A bare string would otherwise become a tuple of letters.
        self.device_types = (device_types,) if isinstance(device_types, str) else tuple(device_types)
        self.api_version = api_version
        self._load = load
        self._is_available = is_available
        self._diagnostics = diagnostics
        self._native_library = native_library

    def is_available(self) -> bool:
        return True if self._is_available is None else bool(self._is_available())

    def load(self) -> None:
        if self._load is not None:
            self._load()

    def diagnostics(self) -> dict:
        return {} if self._diagnostics is None else dict(self._diagnostics())

    def native_library(self) -> Any:
        return None if self._native_library is None else self._native_library()

    def __repr__(self) -> str:
        return f"Backend(name={self.name!r}, device_types={self.device_types!r}, api_version={self.api_version!r})"


def _is_device_type(name: str) -> bool:
    try:
        return torch.device(name).type == name  # rejects "cuda:0" as well as unknown names
    except RuntimeError:
        return False


def validate(backend: Backend) -> None:
    """Raise ``ValueError`` naming the attribute when ``backend`` does not describe itself correctly."""
    if not isinstance(backend.name, str) or not backend.name:
        raise ValueError(f"Backend.name must be a non-empty string, got {backend.name!r}")
    types = backend.device_types
    if not types or not all(isinstance(t, str) and _is_device_type(t) for t in types):
        raise ValueError(
            f"Backend.device_types must be a non-empty sequence of torch device types like 'cuda', got {types!r}"
        )
    parse_api_version(backend.api_version)
