"""Upstream's C entry points in the kernel library (csrc/upstream_api.cu), called through ctypes.

The signatures are upstream's (bitsandbytes-foundation/bitsandbytes csrc/pythonInterface.cpp, 0.50:
the ``extern "C"`` block), written out below and compared with our source. The calls run the C file
over the generated launchers and the kernel sources in the emulator (``upstream_api.emulated_library``:
CPU memory stands in for device memory), with the arguments unsloth and axolotl pass (pointers from
``get_ptr``, ``ctypes.c_int`` sizes, a stream last). Dequantization is compared bit for bit with the
reference (one fp32 product rounded once); the gemv bit for bit with the op on the same kernel, and
with the reference within the conformance suite's matmul tolerance (fp32 accumulation in another order).
"""

from __future__ import annotations

import ctypes
import re
from pathlib import Path

import pytest
import torch

import bitsandbytes.functional as F
import bitsandbytes_emu as emu
from bitsandbytes import _formats, cextension
from bitsandbytes._reference import REFERENCE
from bitsandbytes.testing.compare import matmul_tolerance
from bitsandbytes_cuda import upstream_api
from bitsandbytes_cuda.ops import blockwise as quant_ops
from bitsandbytes_cuda.ops import matmul_4bit as matmul_ops
from bitsandbytes_cuda.tables import matmul_4bit as matmul_table

CSRC = Path(__file__).resolve().parents[1] / "csrc"
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
C_TYPE = {"fp32": "float", "fp16": "__half", "bf16": "__nv_bfloat16"}
INVALID = 1  # cudaErrorInvalidValue

# Upstream's declarations, parameter types in order (``half`` spelled ``__half``, top-level const dropped).
UPSTREAM = {
    **{
        f"cdequantize_blockwise_{t}{q}": ["float*", "unsigned char*", "float*", f"{C_TYPE[t]}*", "int", "int",
                                          "cudaStream_t"]
        for t in DTYPES for q in ("", "_nf4", "_fp4")
    },
    **{
        f"cgemm_4bit_inference_naive_{t}": ["int", "int", "int", f"{C_TYPE[t]}*", "unsigned char*", "float*", "float*",
                                            f"{C_TYPE[t]}*", "int", "int", "int", "int", "cudaStream_t"]
        for t in DTYPES
    },
}  # fmt: skip


def _declared() -> dict[str, list[str]]:
    text = (CSRC / "upstream_api.cu").read_text()
    found = {}
    for name, params in re.findall(r"BNB_EXPORT int (\w+)\(([^)]*)\)", text):
        types = []
        for p in params.split(","):
            words = p.split()
            type_ = " ".join(w for w in words[:-1] if w != "const")
            types.append(type_ + "*" * words[-1].count("*") if "*" in words[-1] else type_)
        found[name] = [t.replace(" *", "*") for t in types]
    return found


def test_entry_points_have_upstreams_names_argument_order_and_types():
    assert _declared() == UPSTREAM
    assert sorted(upstream_api.ENTRY_POINTS) == sorted(UPSTREAM)


def test_entry_points_use_the_ops_launch_geometry():
    text = (CSRC / "upstream_api.cu").read_text()

    def constant(name):
        return int(re.search(rf"constexpr \w+(?: \w+)? {name} = (\d+);", text).group(1))

    assert constant("kDequantThreads") == quant_ops.THREADS
    assert constant("kDequantItems") == quant_ops.ITEMS_PER_THREAD
    assert constant("kDequantMaxGrid") == quant_ops.MAX_GRID
    assert constant("kGemvWarps") == matmul_table.GEMV_WARPS
    assert constant("kGemvWarpFeatures") == matmul_table.GEMV_WARP_FEATURES[1]


@pytest.fixture(scope="module")
def lib():
    emu.skip_unless_available()
    library = upstream_api.emulated_library()
    library.bnb_cuda_emu_stream_seen.restype = ctypes.c_void_p
    return library


def _seen(lib) -> int | None:
    return lib.bnb_cuda_emu_stream_seen()


def _c(n):
    return ctypes.c_int(n)


# ------------------------------------------------------------------------------------------- 8-bit


@pytest.mark.parametrize("t", list(DTYPES))
@pytest.mark.parametrize(("n", "blocksize"), [(3001, 64), (5000, 256), (9000, 4096), (1, 64)])
def test_dequantize_blockwise_matches_the_reference_bit_for_bit(lib, t, n, blocksize):
    g = torch.Generator().manual_seed(n + blocksize)
    code = F.create_dynamic_map()  # the default map of 8-bit blockwise quantization
    A = torch.randn(n, generator=g) * 3
    q, absmax = REFERENCE["quantize_blockwise"](A, code, blocksize)
    out = torch.full((n,), float("nan"), dtype=DTYPES[t])
    stream = ctypes.c_void_p(0x5000 + blocksize)
    rc = getattr(lib, f"cdequantize_blockwise_{t}")(F.get_ptr(code), F.get_ptr(q), F.get_ptr(absmax), F.get_ptr(out),
                                                    _c(blocksize), _c(n), stream)  # fmt: skip
    assert rc == 0
    assert _seen(lib) == stream.value  # the caller's stream reached the launch
    assert torch.equal(out, REFERENCE["dequantize_blockwise"](q, absmax, code, blocksize, DTYPES[t]))


def test_unsloths_nested_absmax_call(lib):
    """unsloth: cdequantize_blockwise_fp32(code2, absmax (uint8), absmax2, out_absmax, 256, n, stream)."""
    W = torch.randn(64, 320, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(3))
    _, state = F.quantize_4bit(W, blocksize=64, compress_statistics=True)
    out_absmax = torch.empty(state.absmax.numel())
    rc = lib.cdequantize_blockwise_fp32(F.get_ptr(state.state2.code), F.get_ptr(state.absmax),
                                        F.get_ptr(state.state2.absmax), F.get_ptr(out_absmax),
                                        _c(state.state2.blocksize), _c(out_absmax.numel()), None)  # fmt: skip
    assert rc == 0
    out_absmax += state.offset
    expected = F.dequantize_blockwise(state.absmax, state.state2) + state.offset
    assert torch.equal(out_absmax, expected)


# ------------------------------------------------------------------------------------------- 4-bit


@pytest.mark.parametrize("t", list(DTYPES))
@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
@pytest.mark.parametrize(("n", "blocksize"), [(777, 32), (4096, 64), (2049, 128)])
def test_dequantize_4bit_matches_the_reference_bit_for_bit(lib, t, quant_type, n, blocksize):
    g = torch.Generator().manual_seed(n)
    A = torch.randn(n, generator=g).to(DTYPES[t])
    packed, absmax = REFERENCE["quantize_4bit"](A, blocksize, quant_type, torch.uint8)
    out = torch.full((n,), float("nan"), dtype=DTYPES[t])
    stream = ctypes.c_void_p(0x4B17)
    fn = getattr(lib, f"cdequantize_blockwise_{t}_{quant_type}")
    # Upstream's callers pass a null code for NF4/FP4 (get_ptr(None)).
    assert fn(F.get_ptr(None), F.get_ptr(packed), F.get_ptr(absmax), F.get_ptr(out), _c(blocksize), _c(n), stream) == 0
    assert _seen(lib) == stream.value
    expected = REFERENCE["dequantize_4bit"](packed, absmax, blocksize, quant_type, [n], DTYPES[t])
    assert torch.equal(out, expected)


# -------------------------------------------------------------------------------------------- gemv


def _gemv_case(t, N, K, blocksize, quant_type, seed):
    g = torch.Generator().manual_seed(seed)
    W = torch.randn(N, K, generator=g).to(DTYPES[t])
    packed, absmax = REFERENCE["quantize_4bit"](W, blocksize, quant_type, torch.uint8)
    code = _formats.code_table(quant_type, torch.device("cpu")).float()
    W64 = REFERENCE["dequantize_4bit"](packed, absmax, blocksize, quant_type, [N, K], torch.float32).double()
    return packed, absmax, code, W64


def _call_gemv(lib, t, A, packed, absmax, code, N, K, blocksize, stream=None, ldb=None):
    """unsloth's fast_gemv call: m = N, n = 1, k = K, lda = ldc = N, ldb = (K + 1) // 2, all c_int32."""
    out = torch.full((1, N), float("nan"), dtype=DTYPES[t])
    i32 = ctypes.c_int32
    rc = getattr(lib, f"cgemm_4bit_inference_naive_{t}")(
        i32(N), i32(1), i32(K), F.get_ptr(A), F.get_ptr(packed), F.get_ptr(absmax), F.get_ptr(code), F.get_ptr(out),
        i32(N), i32((K + 1) // 2 if ldb is None else ldb), i32(N), i32(blocksize), stream,
    )  # fmt: skip
    return rc, out


@pytest.mark.parametrize("t", list(DTYPES))
@pytest.mark.parametrize(
    ("N", "K", "blocksize", "offset"),
    [
        (37, 256, 64, 0),  # v16 path, N not a multiple of the features per block
        (8, 2048, 256, 0),  # v16 path, two steps per lane
        (5, 200, 64, 0),  # K % 32 != 0: the v4 path
        (13, 100, 64, 0),  # K % 8 != 0: the any-alignment path
        (9, 33, 32, 0),  # odd K: rows start mid-byte
        (12, 64, 32, 1),  # A misaligned by one element: the any-alignment path
    ],
)
def test_gemm_4bit_inference_naive_is_the_ops_gemv(lib, emulated, t, N, K, blocksize, offset):
    packed, absmax, code, W64 = _gemv_case(t, N, K, blocksize, "nf4", seed=N * K)
    g = torch.Generator().manual_seed(K)
    A = torch.randn(1, K + offset, generator=g).to(DTYPES[t])[:, offset:]
    stream = ctypes.c_void_p(0x6E3)
    rc, out = _call_gemv(lib, t, A, packed, absmax, code, N, K, blocksize, stream)
    assert rc == 0 and _seen(lib) == stream.value
    # The op on the same kernel, with the same path chosen for the same alignment: identical.
    assert torch.equal(out, matmul_ops.gemv_4bit(A, packed, [N, K], absmax, code, blocksize))
    ref = REFERENCE["gemv_4bit"](A.contiguous(), packed, [N, K], absmax, code, blocksize)
    diff = (out.double() - ref.double()).abs()
    assert (diff <= matmul_tolerance(A.contiguous(), W64, ref)).all()


# ------------------------------------------------------------------------------------- bad arguments


def test_arguments_the_kernels_cannot_serve_launch_nothing(lib):
    code = F.create_dynamic_map()
    q = torch.zeros(100, dtype=torch.uint8)
    absmax = torch.ones(2)
    out = torch.full((100,), 7.0)
    before = ctypes.c_void_p(0x1111)
    lib.cdequantize_blockwise_fp32(F.get_ptr(code), F.get_ptr(q), F.get_ptr(absmax), F.get_ptr(out), _c(64), _c(100),
                                   before)  # fmt: skip
    out.fill_(7.0)
    probe = ctypes.c_void_p(0x2222)
    for blocksize, n, ptrs in [
        (3, 100, None),  # not a power of two
        (0, 100, None),
        (64, -1, None),
        (64, 100, (None, q, absmax, out)),  # null code for 8-bit
        (64, 100, (code, None, absmax, out)),
        (64, 100, (code, q, absmax, None)),
    ]:
        c, a, m, o = ptrs or (code, q, absmax, out)
        rc = lib.cdequantize_blockwise_fp32(F.get_ptr(c), F.get_ptr(a), F.get_ptr(m), F.get_ptr(o), _c(blocksize),
                                            _c(n), probe)  # fmt: skip
        assert rc == INVALID, (blocksize, n)
    assert (
        lib.cdequantize_blockwise_fp16_nf4(None, F.get_ptr(q), None, None, _c(64), _c(0), probe) == 0
    )  # nothing to do
    assert lib.cdequantize_blockwise_bf16_fp4(None, None, F.get_ptr(absmax), None, _c(64), _c(10), probe) == INVALID
    assert _seen(lib) == before.value  # none of these launched
    assert torch.equal(out, torch.full((100,), 7.0))

    packed, absmax4, table, _ = _gemv_case("fp16", 8, 64, 64, "nf4", seed=1)
    A = torch.randn(1, 64).half()
    assert _call_gemv(lib, "fp16", A, packed, absmax4, table, 8, 64, 64, probe, ldb=64)[0] == INVALID  # not [m, k]
    assert _call_gemv(lib, "fp16", A, packed, absmax4, table, 8, 64, 48, probe)[0] == INVALID
    assert _call_gemv(lib, "fp16", A, packed, absmax4, None, 8, 64, 64, probe)[0] == INVALID
    assert _seen(lib) == before.value


# ------------------------------------------------------------------------------------ lib in the core


def test_the_emulated_library_serves_bitsandbytes_functional_lib(lib):
    previous = cextension.provide_native_library(None)
    try:
        # What the emulated plugin's pytest_configure does (the client tests run under that plugin).
        cextension.provide_native_library(upstream_api.emulated_library, "the CUDA backend's kernel library (emulated)")
        assert F.lib._lib is lib
        for name in upstream_api.ENTRY_POINTS:
            assert hasattr(getattr(F.lib, name), "restype"), name  # unsloth keeps 4-bit on
        with pytest.raises(RuntimeError, match=r"lib\.cadam32bit_grad_fp32\(\).*does not export"):
            F.lib.cadam32bit_grad_fp32()
    finally:
        cextension.provide_native_library(*previous)
