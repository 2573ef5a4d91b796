"""Kernel emulator: runs real CUDA (and Metal, see ``.metal``) kernel sources on the CPU, for tests.

The kernel source is compiled unchanged by the host C++ compiler through a shim header (``bnb_emu/cuda.h``)
and runs on a lane scheduler: every thread of a block is a fiber, barriers and warp collectives are where
lanes meet, shared memory is one region per block. Deadlocks, out-of-bounds accesses and constructs
outside the documented subset are errors, never hangs or silent results. See docs/pages/emulator.md.

    import bitsandbytes_emu as emu

    mod = emu.load_cuda("kernels/reduce.cu", kernels={"block_sum": "block_sum<128>"})
    mod.block_sum[blocks, 128](x, out, x.numel())       # like block_sum<128><<<blocks, 128>>>(...)

Compiled modules are cached by content hash under ``$BNB_EMU_CACHE`` (default ~/.cache/bitsandbytes/emu).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from .address_spaces import MetalAddressSpaceError, check_metal_address_spaces, clang_unavailable_reason
from .build import NEED_COMPILER, build, find_compiler, unavailable_reason
from .errors import EmulationCompileError, EmulationError
from .metal import MetalLibrary, MetalSubsetError, metal_library
from .module import Kernel, Module
from .source import translation_unit

__all__ = [
    "NEED_COMPILER",
    "EmulationCompileError",
    "EmulationError",
    "Kernel",
    "MetalAddressSpaceError",
    "MetalLibrary",
    "MetalSubsetError",
    "Module",
    "check_metal_address_spaces",
    "clang_unavailable_reason",
    "find_compiler",
    "include_dir",
    "load_cuda",
    "metal_library",
    "skip_unless_available",
    "unavailable_reason",
]

_loaded: dict[tuple, Module] = {}


def include_dir() -> str:
    """The directory holding ``bnb_emu/runtime.h`` and the shims."""
    return str(Path(__file__).parent / "include")


def _exports(kernels) -> dict[str, str]:
    if isinstance(kernels, str):
        kernels = [kernels]
    if isinstance(kernels, Mapping):
        items = [(str(k), str(v)) for k, v in kernels.items()]
    elif isinstance(kernels, Iterable):
        items = [(str(k), str(k)) for k in kernels]
    else:
        raise TypeError(f"kernels must be a name, a list of names or a dict name -> expression, got {kernels!r}")
    if not items:
        raise ValueError("kernels must name at least one kernel to export")
    for name, _ in items:
        if not name.isidentifier():
            raise ValueError(f"kernels: export name {name!r} must be a C identifier (give a dict name -> expression)")
    return dict(items)


def load_cuda(
    source,
    kernels,
    *,
    code: str | None = None,
    include_dirs: Iterable = (),
    defines: Mapping[str, object] | None = None,
) -> Module:
    """Compile a CUDA kernel source for emulation (or reuse the cached build) and load it.

    Args:
        source: path of the kernel source file; with ``code``, only the name used in messages.
        kernels: the kernels to export: a name, a list of names, or a dict from export name to a C++
            expression naming the kernel (e.g. ``{"sum128": "block_sum<128>"}`` for a template instance).
        code: the source text, when it does not come from a file.
        include_dirs: extra include directories (the source's own directory is always searched).
        defines: preprocessor macros, name -> value (None for a bare ``-Dname``).

    Raises:
        EmulationCompileError: the source does not compile in emulation (the message has the compiler's).
        EmulationError: no C++ compiler here (the message names what to install).
    """
    exports = _exports(kernels)
    path = Path(os.fspath(source))
    if code is None:
        try:
            code = path.read_text()
        except OSError as e:
            raise FileNotFoundError(f"kernel source {str(path)!r} cannot be read: {e.strerror}") from None
        path = path.resolve()
    dirs = [str(path.parent), *(str(Path(d)) for d in include_dirs)]
    defs = dict(defines or {})
    key = (str(path), code, tuple(exports.items()), tuple(dirs), tuple(sorted(defs.items(), key=str)))
    if key not in _loaded:
        tu = translation_unit(code, str(path), "cuda", exports)
        lib = build(tu, dialect="cuda", label=str(path), include_dirs=dirs, defines=defs)
        _loaded[key] = Module(lib, path.name, code, exports)
    return _loaded[key]


def skip_unless_available() -> None:
    """In a test: skip it, naming what is missing, when kernels cannot be emulated here."""
    reason = unavailable_reason()
    if reason:
        import pytest

        pytest.skip(reason)
