"""CPU features that choose between our kernels and torch's own, where torch's win by measurement."""

from __future__ import annotations

import functools

import torch


def _torch_cpu_reports(probe: str) -> bool:
    fn = getattr(getattr(torch, "cpu", None), probe, None)
    return bool(fn()) if fn is not None else False


@functools.cache
def bf16_gemm_hardware() -> bool:
    """Whether torch's bf16 GEMM has bf16 hardware under it here (AVX512-BF16 or AMX) rather than
    converting to fp32 inside its kernel."""
    return _torch_cpu_reports("_is_avx512_bf16_supported") or _torch_cpu_reports("_is_amx_tile_supported")


@functools.cache
def amx_tiles() -> bool:
    """Whether torch's oneDNN runs its bf16 and int8 GEMMs on AMX tiles here (CPUID and the OS's
    permission, as torch itself checks them). Our kernels use AVX-512 only, so on such a CPU torch's
    GEMMs do many rows several times faster (numbers in docs/pages/cpu.md, "AMX")."""
    return _torch_cpu_reports("_is_amx_tile_supported")


def onednn_enabled() -> bool:
    """Whether torch's CPU GEMMs run through oneDNN now. ``torch.backends.mkldnn.enabled`` is a runtime
    switch (``torch.backends.mkldnn.flags(enabled=False)`` too), so this is asked per call, never cached.
    With it off torch's bf16 GEMM and ``torch._int_mm`` fall back to kernels of their own, measured on a
    Zen 4 (2 threads, [512, 4096] x [4096, 4096]): bf16 ``F.linear`` 40 -> 373 ms, ``_int_mm`` 25 ms ->
    3.2 s. The routes that hand rows to those GEMMs for oneDNN's speed follow it; torch's fp32 GEMM
    (BLAS) does not change (164 / 147 ms)."""
    return torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled
