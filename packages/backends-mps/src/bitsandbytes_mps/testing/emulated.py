"""pytest plugin: device ``cpu`` runs this package's ops on its Metal kernels in the emulator.

    BNB_BACKENDS=none python -m bitsandbytes.testing --device cpu -p bitsandbytes_mps.testing.emulated

The kernels are loaded by ``library`` in emulator mode (``emu.metal_library`` of the same assembled
sources torch.mps.compile_shader gets) and every native op of ``bitsandbytes_mps.ops`` is registered for
``cpu``, so the conformance cases of ``--device cpu`` run the real Metal sources ("emulated mps"). Ops
without a Metal implementation keep whatever ``cpu`` kernel they had: the reference under
``BNB_BACKENDS=none``.
"""

from __future__ import annotations

from bitsandbytes.backends import kit

from .. import library, ops


def _enable() -> list[str]:
    library.use_emulator(True)
    status = library.load()
    failed = {s: r for s, r in status.reasons.items() if s != "metallib"}
    if failed or status.missing or status.dropped:
        # In emulation every source must compile and every kernel fit its declared launch size: a
        # failure here is a kernel bug, not a fallback.
        raise RuntimeError(f"emulated Metal sources failed to load: {failed or status.missing or status.dropped}")
    return list(ops.register_all("cpu"))


_plugin = kit.emulated_plugin(
    __name__, "mps", "Metal", unavailable_reason=lambda: library.emulator().unavailable_reason(), enable=_enable
)
pytest_configure, pytest_report_header = _plugin.pytest_configure, _plugin.pytest_report_header


def pytest_bnb_harness_errors(config) -> tuple[type[BaseException], ...]:
    """The emulator's own errors (an out-of-bounds access, a race, a deadlock): a kernel bug, never an
    expected outcome of a bad-input case."""
    from bitsandbytes_emu.errors import EmulationError

    return (EmulationError,)
