"""bitsandbytes-cpu: native CPU kernels for every bitsandbytes op.

Installing the package is enough: ``import bitsandbytes`` finds ``bitsandbytes_cpu.plugin:backend``
through the ``bitsandbytes.backends`` entry point and registers the kernels; ``python -m bitsandbytes``
shows them. The functions here only say which ISA levels the kernels can run at (x86: ``scalar``,
``avx2``, ``avx512``; arm64: ``scalar``, ``neon``, ``neon_dotprod``, ``neon_bf16``), which is what
``BNB_CPU_ISA`` accepts on this machine. They import the extension, never bitsandbytes.
"""

from __future__ import annotations

__all__ = ["best_isa", "compiled_isas", "supported_isas"]


def supported_isas() -> list[str]:
    """The levels this build and this CPU can run, lowest first (``BNB_CPU_ISA`` accepts each)."""
    from . import _C

    return list(_C.supported_isas())


def compiled_isas() -> list[str]:
    """The levels this build compiled, lowest first; this CPU may run fewer."""
    from . import _C

    return list(_C.compiled_isas())


def best_isa() -> str:
    """The highest level this CPU runs: what the kernels use unless ``BNB_CPU_ISA`` lowers it."""
    from . import _C

    return str(_C.best_isa())
