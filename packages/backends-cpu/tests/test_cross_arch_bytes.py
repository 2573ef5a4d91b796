"""The bytes the formats define are x86's on every architecture and ISA level.

data/cross_arch_digests.json holds, per case of cross_arch_cases.py (the code tables, 4-bit and 8-bit
blockwise quantize and dequantize, LLM.int8() row quantization and the int8 GEMM, one 8-bit optimizer
step's state, gemm_4bit's dequantize + GEMM path with nested scales on one-hot rows, on both of its
routes for bf16 A), the
sha256 of the outputs an x86-64 machine's native kernels gave. Here the reference kernels must give the
same bytes (so the file is the format's bytes), and so must this machine's native kernels at each level it
runs: on arm64 (qemu in `nox -s tests-arm64`, GitHub's arm64 runners) every NEON level, on x86 avx2/avx512.
"""

from __future__ import annotations

import json

import pytest
from cross_arch_cases import DIGESTS, all_digests, cases, digest, native, reference
from native_helpers import isa

import bitsandbytes  # noqa: F401  (loads the cpu backend)
from bitsandbytes_cpu import _C
from bitsandbytes_cpu.ops import matmul_4bit

SAVED = json.loads(DIGESTS.read_text())
NAMES = sorted(cases())


def test_digests_cover_every_case_and_come_from_x86():
    assert sorted(SAVED["digests"]) == NAMES, "cases and data/cross_arch_digests.json differ: rewrite it on x86"
    assert SAVED["written_on"]["machine"].lower() in ("x86_64", "amd64")


@pytest.mark.parametrize("name", NAMES)
def test_reference_gives_the_saved_bytes(name):
    assert digest(cases()[name](reference)) == SAVED["digests"][name]


@pytest.mark.parametrize("level", _C.supported_isas())
def test_native_gives_x86_bytes(level):
    with isa(level):
        got = all_digests(native)
    differ = sorted(k for k in NAMES if got[k] != SAVED["digests"][k])
    assert not differ, f"at {level}, these outputs differ from x86's bytes: {differ}"


# gemm_4bit's routes for bf16 A above the fused kernel's rows: (FAST_BF16_GEMM, a kernel only it calls).
GEMM_ROUTES = {"fp32-tiles": (False, "dequantize_4bit_tile_f32"), "bf16-slabs": (True, "dequantize_4bit_range")}


@pytest.mark.parametrize("route", sorted(GEMM_ROUTES))
@pytest.mark.parametrize("level", _C.supported_isas())
def test_both_gemm_routes_give_x86_bytes(level, route, monkeypatch):
    """A CPU takes one route by its features (fp32 tiles with the nested scales expanded inside the tile
    kernel; bf16 slabs after expand_nested_absmax where torch's bf16 GEMM is fast), so an arm64 machine
    would never run the other's kernels: both are forced here, at every level."""
    fast, kernel = GEMM_ROUTES[route]
    monkeypatch.setattr(matmul_4bit, "FAST_BF16_GEMM", fast)
    monkeypatch.setattr(matmul_4bit, "BF16_TILE_MAX_ROWS", 0)  # nor the fused kernel's own bf16 GEMM
    monkeypatch.setattr(matmul_4bit, "AMX_BF16", False)  # nor the AMX crossover (more fused rows)
    monkeypatch.setattr(matmul_4bit, "AMX_GEMM", False)  # nor our AMX kernel (x86 only)
    calls = []
    real = getattr(_C, kernel)
    monkeypatch.setattr(_C, kernel, lambda *args: calls.append(args) or real(*args))
    name = "gemm4-nested-onehot-bf16"
    with isa(level):
        got = digest(cases()[name](native))
    assert calls, f"{name} did not take the {route} route ({kernel})"
    assert got == SAVED["digests"][name], f"at {level}, {name} on the {route} route differs from x86's bytes"


def test_digest_sees_a_changed_byte():
    out = cases()["4bit-nf4-fp32-bs64"](native)
    before = digest(out)
    out[0].view(-1)[5] ^= 1
    assert digest(out) != before
