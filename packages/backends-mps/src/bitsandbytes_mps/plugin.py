"""The ``Backend`` object the core finds through the ``bitsandbytes.backends`` entry point (``mps``).

``is_available()``: torch sees an MPS device. ``load()`` loads the Metal kernels once (``library.load``:
prebuilt metallib, else the sources through ``torch.mps.compile_shader``, else none) and registers for
``mps`` the ops whose kernels loaded; every other op stays on the core's reference kernels, which run on
the MPS device through torch. ``diagnostics()`` says which load path won and why the others did not.
Importing this module registers nothing and loads nothing.
"""

from __future__ import annotations

import platform

from bitsandbytes.backends import Backend

__all__ = ["backend"]


def _is_available() -> bool:
    import torch

    return bool(torch.backends.mps.is_available())


def _load() -> None:
    from bitsandbytes._functional.paged import register_paged_memory

    from . import ops

    ops.register_all("mps")
    # Apple Silicon memory is unified: an ordinary MPS tensor already lives where both the CPU and the GPU
    # reach it, so a paged optimizer's state is plain MPS memory and prefetching has nothing to move.
    register_paged_memory("mps", _allocate_unified, _prefetch_unified)


def _allocate_unified(shape, dtype, device):
    import torch

    return torch.zeros(shape, dtype=dtype, device=device)


def _prefetch_unified(tensor, device) -> None:
    return None


def _macos() -> str:
    version = platform.mac_ver()[0]
    return f"{version} ({platform.machine()})" if version else f"not macOS ({platform.system()})"


def _metal_language() -> str:
    """The Metal language version torch.mps.compile_shader compiles the sources as on this macOS (torch
    2.8+; 2.7 used 3.1 from macOS 14 on), the version the CI jobs compile each source with."""
    version = platform.mac_ver()[0]
    if not version:
        return "none (not macOS)"
    major = int(version.split(".")[0])
    return "4.0" if major >= 26 else "3.2" if major == 15 else "3.1"


def _diagnostics() -> dict:
    import torch

    from . import __version__, library, ops, tables

    st = library.status()
    kernels = tables.all_kernels()
    native = ops.native_ops()
    info = {
        "version": __version__,
        "kernels loaded from": st.path,
        "macOS": _macos(),
        "torch": torch.__version__,
        "torch.mps.compile_shader": hasattr(torch.mps, "compile_shader"),
        "torch.mps.load_metallib": hasattr(torch.mps, "load_metallib"),
        "Metal language of compile_shader": _metal_language(),
        "PYTORCH_MPS_FAST_MATH": (
            f"{library.fast_math()} (fast math; these kernels test NaN/Inf on bits, so results do not change)"
            if library.fast_math()
            else "unset (safe math)"
        ),
        "metallib": str(library.METALLIB) if library.METALLIB.is_file() else "not in this install",
        "kernels": f"{sum(library.has(k) for k in kernels)} of {len(kernels)}",
        "ops on Metal kernels": ", ".join(sorted(native)) or "none",
        "ops on the reference": ", ".join(sorted(set(ops.all_ops()) - set(native))) or "none",
    }
    for source, how in st.sources.items():
        info[f"source {source}"] = how
    for what, reason in st.reasons.items():
        info[f"why not {'the metallib' if what == 'metallib' else what}"] = reason
    if st.missing:
        info["kernels absent from the library"] = ", ".join(st.missing)
    for name, reason in st.dropped.items():
        info[f"dropped {name}"] = reason
    return info


backend = Backend("mps", ["mps"], api_version="1.2", load=_load, is_available=_is_available, diagnostics=_diagnostics)
