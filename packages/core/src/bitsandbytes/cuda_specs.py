"""Upstream's ``bitsandbytes.cuda_specs``: what torch reports about CUDA (or ROCm) on this machine.

Pure queries of torch; none of them loads a native library. ``get_cuda_specs()`` is None without a
usable GPU, as upstream.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import subprocess
import sys

import torch

__all__ = [
    "CUDASpecs",
    "get_compute_capabilities",
    "get_cuda_specs",
    "get_cuda_version_string",
    "get_cuda_version_tuple",
    "get_rocm_gpu_arch",
    "get_rocm_warpsize",
]


@dataclasses.dataclass(frozen=True)
class CUDASpecs:
    highest_compute_capability: tuple[int, int]
    cuda_version_string: str
    cuda_version_tuple: tuple[int, int]

    @property
    def has_imma(self) -> bool:
        """Whether int8 tensor-core matmuls exist: sm_75 and newer (every ROCm GPU torch supports)."""
        return bool(torch.version.hip) or self.highest_compute_capability >= (7, 5)


def get_compute_capabilities() -> list[tuple[int, int]]:
    """The (major, minor) of every visible CUDA device, ascending."""
    return sorted(torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count()))


@functools.lru_cache(None)
def get_cuda_version_tuple() -> tuple[int, int] | None:
    """(major, minor) of the CUDA (or HIP) torch was built with; None for a CPU-only torch."""
    version = torch.version.cuda or torch.version.hip
    if not version:
        return None
    parts = version.split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def get_cuda_version_string() -> str | None:
    """``"124"`` for CUDA 12.4 (upstream's library-name spelling); None without CUDA."""
    version = get_cuda_version_tuple()
    return None if version is None else f"{version[0] * 10 + version[1]}"


def get_cuda_specs() -> CUDASpecs | None:
    """The highest compute capability and the CUDA version; None without a usable GPU."""
    if not torch.cuda.is_available():
        return None
    try:
        capabilities = get_compute_capabilities()
    except Exception:  # a driver that torch sees but cannot query
        return None
    version, string = get_cuda_version_tuple(), get_cuda_version_string()
    if not capabilities or version is None or string is None:
        return None
    return CUDASpecs(capabilities[-1], string, version)


def _rocminfo(pattern: str) -> str | None:
    tool = "hipinfo" if sys.platform == "win32" else "rocminfo"
    try:
        result = subprocess.run([tool], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(pattern, result.stdout)
    return match.group(1) if match else None


def get_rocm_gpu_arch() -> str:
    """``"gfx90a"`` and the like on ROCm (from rocminfo); ``"unknown"`` elsewhere or when it cannot tell."""
    if not torch.version.hip:
        return "unknown"
    arch = _rocminfo(r"Name:\s+gfx([a-zA-Z\d]+)")
    return "gfx" + arch if arch else "unknown"


def get_rocm_warpsize() -> int:
    """32 on NVIDIA; on ROCm the wavefront size rocminfo reports (64 when it cannot tell, as upstream)."""
    if not torch.version.hip:
        return 32
    size = _rocminfo(r"Wavefront Size:\s+([0-9]{2})\(0x[0-9]{2}\)")
    return int(size) if size else 64
