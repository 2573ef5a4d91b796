"""pytest plugin: device ``cpu`` runs this package's ops on its CUDA kernels in the emulator.

    BNB_BACKENDS=none python -m bitsandbytes.testing --device cpu -p bitsandbytes_cuda.testing.emulated

Every op of ``bitsandbytes_cuda.ops`` is registered for ``cpu`` with ``launch`` in emulator mode, so the
conformance cases of ``--device cpu`` run the real kernel sources ("emulated cuda"). Ops without a CUDA
implementation keep whatever ``cpu`` kernel they had: the reference under ``BNB_BACKENDS=none``.
``bitsandbytes.functional.lib`` becomes the kernel library's upstream C entry points built in the
emulator (``upstream_api.emulated_library``, compiled at its first use), taking CPU tensors' pointers.
An emulated out-of-bounds access, race or deadlock (``EmulationError``) fails a bad-input row, whatever
the row expects (``pytest_bnb_harness_errors``).
"""

from __future__ import annotations

from bitsandbytes import cextension
from bitsandbytes.backends import kit

from .. import launch, ops, upstream_api

__all__ = ["REGISTERED_OPS", "pytest_bnb_harness_errors", "pytest_configure", "pytest_report_header"]


def _enable() -> dict:
    launch.use_emulator(True)
    registered = ops.register_all("cpu")
    cextension.provide_native_library(upstream_api.emulated_library, "the CUDA backend's kernel library (emulated)")
    return registered


_plugin = kit.emulated_plugin(
    __name__, "cuda", "CUDA", unavailable_reason=lambda: launch.emulator().unavailable_reason(), enable=_enable
)
pytest_configure, pytest_report_header = _plugin.pytest_configure, _plugin.pytest_report_header
# The ops registered for cpu, once pytest configured the plugin (the ctypes clients' tests ask whether the
# emulated library serves this run).
REGISTERED_OPS = _plugin.registered


def pytest_bnb_harness_errors(config) -> tuple[type[BaseException], ...]:
    from bitsandbytes_emu.errors import EmulationError

    return (EmulationError,)
