"""pytest plugin: device ``cpu`` runs this package's ops on its Metal kernels in the emulator.

    BNB_BACKENDS=none python -m bitsandbytes.testing --device cpu -p bitsandbytes_mps.testing.emulated

The kernels are loaded by ``library`` in emulator mode (``emu.metal_library`` of the same assembled
sources torch.mps.compile_shader gets) and every native op of ``bitsandbytes_mps.ops`` is registered for
``cpu``, so the conformance cases of ``--device cpu`` run the real Metal sources ("emulated mps"). Ops
without a Metal implementation keep whatever ``cpu`` kernel they had: the reference under
``BNB_BACKENDS=none``.
"""

from __future__ import annotations

from .. import library, ops

__all__ = ["REGISTERED_OPS"]

REGISTERED_OPS: list[str] = []


def pytest_configure(config) -> None:
    reason = library.emulator().unavailable_reason()
    if reason:
        raise RuntimeError(f"bitsandbytes_mps.testing.emulated needs the kernel emulator: {reason}")
    library.use_emulator(True)
    status = library.load()
    failed = {s: r for s, r in status.reasons.items() if s != "metallib"}
    if failed or status.missing or status.dropped:
        # In emulation every source must compile and every kernel fit its declared launch size: a
        # failure here is a kernel bug, not a fallback.
        raise RuntimeError(f"emulated Metal sources failed to load: {failed or status.missing or status.dropped}")
    REGISTERED_OPS[:] = sorted(ops.register_all("cpu"))


def pytest_report_header(config) -> str:
    return f"emulated mps: {len(REGISTERED_OPS)} ops on emulated Metal kernels ({', '.join(REGISTERED_OPS)})"
