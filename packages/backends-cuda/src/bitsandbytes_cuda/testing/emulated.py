"""pytest plugin: device ``cpu`` runs this package's ops on its CUDA kernels in the emulator.

    BNB_BACKENDS=none python -m bitsandbytes.testing --device cpu -p bitsandbytes_cuda.testing.emulated

Every op of ``bitsandbytes_cuda.ops`` is registered for ``cpu`` with ``launch`` in emulator mode, so the
conformance cases of ``--device cpu`` run the real kernel sources ("emulated cuda"). Ops without a CUDA
implementation keep whatever ``cpu`` kernel they had: the reference under ``BNB_BACKENDS=none``.
``bitsandbytes.functional.lib`` becomes the kernel library's upstream C entry points built in the
emulator (``upstream_api.emulated_library``, compiled at its first use), taking CPU tensors' pointers.
"""

from __future__ import annotations

from bitsandbytes import cextension

from .. import launch, ops, upstream_api

__all__ = ["REGISTERED_OPS"]

REGISTERED_OPS: list[str] = []


def pytest_configure(config) -> None:
    reason = launch.emulator().unavailable_reason()
    if reason:
        raise RuntimeError(f"bitsandbytes_cuda.testing.emulated needs the kernel emulator: {reason}")
    launch.use_emulator(True)
    REGISTERED_OPS[:] = sorted(ops.register_all("cpu"))
    cextension.provide_native_library(upstream_api.emulated_library, "the CUDA backend's kernel library (emulated)")


def pytest_report_header(config) -> str:
    return f"emulated cuda: {len(REGISTERED_OPS)} ops on emulated CUDA kernels ({', '.join(REGISTERED_OPS)})"
