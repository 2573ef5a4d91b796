"""The bytes the formats define are x86's on every architecture and ISA level.

data/cross_arch_digests.json holds, per case of cross_arch_cases.py (the code tables, 4-bit and 8-bit
blockwise quantize and dequantize, LLM.int8() row quantization and the int8 GEMM, one 8-bit optimizer
step's state, gemm_4bit's dequantize + GEMM path with nested scales on one-hot rows), the
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


def test_digest_sees_a_changed_byte():
    out = cases()["4bit-nf4-fp32-bs64"](native)
    before = digest(out)
    out[0].view(-1)[5] ^= 1
    assert digest(out) != before
