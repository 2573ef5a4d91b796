"""The ``Backend`` object the core finds through the ``bitsandbytes.backends`` entry point (``cuda``).

``is_available()``: torch sees a CUDA device, the kernel library loads and holds code for at least one
visible device (``archs``: decided from the library's architecture list and each device's compute
capability, with a warning naming every device it cannot serve). ``load()`` checks that the driver can
run the library's runtime and registers every op of ``bitsandbytes_cuda.ops`` for ``cuda``; on a machine
with both kinds of GPU, calls on the devices without code run the reference kernels (``kit.routed``).
The library's own probe still runs at each device's first launch (``launch.check_device``).
``native_library()`` is the kernel library itself, which becomes ``bitsandbytes.functional.lib``.
Importing this module registers nothing and loads no library.
"""

from __future__ import annotations

import warnings

from bitsandbytes.backends import Backend

__all__ = ["backend", "check_driver", "unusable_devices"]


def _version(v: int) -> str:
    return f"{v // 1000}.{v % 1000 // 10}" if v > 0 else "none"


def unusable_devices() -> dict[int, str]:
    """The visible CUDA devices the library holds no code for: index -> a warning naming the device, its
    arch and what would serve it. Reads device properties only (no CUDA context is created)."""
    import torch

    from . import archs, launch

    held = launch.library().bnb_cuda_archs().decode()
    found = {}
    for i in range(torch.cuda.device_count()):
        major, minor = torch.cuda.get_device_capability(i)
        if not archs.covers(held, major, minor):
            found[i] = archs.unsupported_message(i, torch.cuda.get_device_name(i), major, minor, held)
    return found


_unusable: dict[int, str] = {}


def _is_available() -> bool:
    global _unusable
    import torch

    if not torch.cuda.is_available():
        return False
    from . import launch

    try:
        launch.library()
    except launch.LibraryError as e:
        # A GPU without our library is worth a word: the ops would silently stay on the reference.
        warnings.warn(f"bitsandbytes-cuda is not used: {e}", RuntimeWarning, stacklevel=2)
        return False
    _unusable = unusable_devices()
    for message in _unusable.values():
        warnings.warn(message, RuntimeWarning, stacklevel=2)
    return len(_unusable) < torch.cuda.device_count()


def check_driver() -> None:
    """Raise LibraryError when the driver is older than the CUDA runtime the library was built with.

    The runtime is linked statically; CUDA's minor-version compatibility lets any driver of the same
    major version (or newer) run it, so only the major version is compared.
    """
    from . import launch

    lib = launch.library()
    runtime, driver = lib.bnb_cuda_runtime_version(), lib.bnb_cuda_driver_version()
    if driver < 1000 * (runtime // 1000):
        raise launch.LibraryError(
            f"the NVIDIA driver supports CUDA {_version(driver)}, but bitsandbytes-cuda was built with CUDA "
            f"{_version(runtime)}, which needs a driver for CUDA {runtime // 1000}.x or newer: update the driver"
        )


def _load() -> None:
    import torch

    from . import launch, ops, paged

    check_driver()
    ops.register_all("cuda", unusable=[torch.device("cuda", i) for i in _unusable])
    paged.register(launch.library())  # managed memory for the paged optimizers


def _diagnostics() -> dict:
    import torch

    from . import archs, launch, ops

    lib = launch.library()
    held = lib.bnb_cuda_archs().decode()
    devices = []
    for i in range(torch.cuda.device_count()):
        major, minor = torch.cuda.get_device_capability(i)
        served = "" if archs.covers(held, major, minor) else ", no code in the library: reference kernels"
        devices.append(f"{i}: {torch.cuda.get_device_name(i)} (sm_{major}{minor}{served})")
    return {
        "library": str(launch.library_path()),
        "archs in the library": lib.bnb_cuda_archs().decode(),
        "CUDA runtime (static)": _version(lib.bnb_cuda_runtime_version()),
        "CUDA driver": _version(lib.bnb_cuda_driver_version()),
        "torch CUDA": torch.version.cuda,
        "devices": "; ".join(devices) or "none",
        "kernels": len(launch.tables.all_kernels()),
        "ops": ", ".join(sorted(ops.all_ops())),
    }


def _native_library():
    from . import launch

    return launch.library()  # exports upstream's C entry points (csrc/upstream_api.cu) for ctypes callers


backend = Backend(
    "cuda",
    ["cuda"],
    api_version="1.2",
    load=_load,
    is_available=_is_available,
    diagnostics=_diagnostics,
    native_library=_native_library,
)
