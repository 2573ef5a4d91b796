"""The ``Backend`` object the core finds through the ``bitsandbytes.backends`` entry point.

Importing it registers nothing; ``backend.load()`` imports the extension, applies ``BNB_CPU_ISA``
and registers the kernels for the ``cpu`` device. It lives apart from the package's ``__init__`` so
that ``import bitsandbytes_cpu`` never imports bitsandbytes (whose import loads this plugin).
"""

from __future__ import annotations

import os

from bitsandbytes.backends import Backend

__all__ = ["backend"]


def _load() -> None:
    from . import _C

    isa = os.environ.get("BNB_CPU_ISA", "").strip().lower()
    if isa and isa != "native":
        _C.set_isa(isa)
    from . import ops

    ops.register_all()


def _diagnostics() -> dict:
    import torch

    from bitsandbytes.backends import dispatch

    from . import _C, ops

    return {
        "isa": _C.isa(),
        "best isa": _C.best_isa(),
        "supported isas": ", ".join(_C.supported_isas()),
        "compiled isas": ", ".join(_C.compiled_isas()),
        "threads (torch.get_num_threads)": torch.get_num_threads(),
        # How AVX-512 kernels read 8-bit code tables (same bits either way; by CPU vendor unless set).
        "8-bit table lookup": _C.map_lookup() if _C.isa() == "avx512" else "- (avx512 only)",
        # Our bf16 GEMM on AMX tiles (gemm_4bit, many rows): "yes", or why it cannot run here.
        "AMX bf16 GEMM": _C.amx_bf16_unavailable() or "yes",
        "native ops": sum(dispatch.has_kernel(op, "CPU") for op in ops.all_ops()),
    }


backend = Backend("cpu", ["cpu"], api_version="1.2", load=_load, diagnostics=_diagnostics)
