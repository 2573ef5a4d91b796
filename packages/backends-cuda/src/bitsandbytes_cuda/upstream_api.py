"""Upstream's C entry points in the kernel library (``csrc/upstream_api.cu``), for ctypes callers.

On a GPU they are symbols of ``launch.library()``, which the plugin hands to the core as
``bitsandbytes.functional.lib``. ``emulated_library()`` builds the same C file, over the same generated
launchers and kernel sources, in the kernel emulator: a ``ctypes.CDLL`` whose entry points take host
pointers (CPU tensors) for device memory, so their argument handling is tested without a GPU.
"""

from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path

from . import _generate, tables
from .launch import emulator, kernel_dir

__all__ = ["ENTRY_POINTS", "KERNEL_SOURCES", "emulated_library"]

# The entry points upstream_api.cu defines (upstream's names).
ENTRY_POINTS = (
    *(f"cdequantize_blockwise_{t}" for t in ("fp32", "fp16", "bf16")),
    *(f"cdequantize_blockwise_{t}_{q}" for q in ("nf4", "fp4") for t in ("fp32", "fp16", "bf16")),
    *(f"cgemm_4bit_inference_naive_{t}" for t in ("fp16", "bf16", "fp32")),
)
# The kernel families they launch.
KERNEL_SOURCES = ("blockwise.cu", "fourbit.cu", "matmul_4bit.cu")

_lock = threading.Lock()
_library: ctypes.CDLL | None = None


def _gen_dir() -> Path:
    # Stable across runs, so that the emulator's build cache (keyed by the include paths too) is reused.
    root = os.environ.get("BNB_EMU_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "bitsandbytes", "emu")
    return Path(root) / "bitsandbytes_cuda_gen"


def emulated_library() -> ctypes.CDLL:
    """``upstream_api.cu`` with its launchers and kernels compiled for the emulator, loaded (once)."""
    global _library
    with _lock:
        if _library is None:
            import bitsandbytes

            csrc = kernel_dir()
            groups = tables.by_source()
            gen = _gen_dir()
            gen.mkdir(parents=True, exist_ok=True)
            _generate._write(
                gen / "launchers.gen.h", _generate.header_text([k for s in KERNEL_SOURCES for k in groups[s]])
            )
            # One translation unit: the launchers of these families (each including its kernel source), then
            # the entry points, exactly the files the real build compiles separately.
            code = "".join(_generate.source_text(s, groups[s]) for s in KERNEL_SOURCES)
            code += '#include "upstream_api.cu"\n'
            first = groups[KERNEL_SOURCES[0]][0]
            module = emulator().load_cuda(
                csrc / "upstream_api.cu",
                {first.name: first.expr},
                code=code,
                include_dirs=[csrc, gen, bitsandbytes.get_include()],
            )
            _library = ctypes.CDLL(str(module.path))
    return _library
