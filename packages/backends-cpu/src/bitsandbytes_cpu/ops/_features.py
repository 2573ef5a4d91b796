"""CPU features that choose between our kernels and torch's own, where torch's win by measurement."""

from __future__ import annotations

import functools

import torch


@functools.cache
def amx_tiles() -> bool:
    """Whether torch's oneDNN runs its bf16 and int8 GEMMs on AMX tiles here (CPUID and the OS's
    permission, as torch itself checks them). Our kernels use AVX-512 only, so on such a CPU torch's
    GEMMs do many rows several times faster (numbers in docs/pages/cpu.md, "AMX")."""
    probe = getattr(getattr(torch, "cpu", None), "_is_amx_tile_supported", None)
    return bool(probe()) if probe is not None else False
