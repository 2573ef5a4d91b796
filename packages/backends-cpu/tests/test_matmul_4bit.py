"""Native gemv_4bit / gemm_4bit: every path (fused fp32 FMA, AVX512-BF16 dot, generic odd layout, slab
dequantize + torch GEMM) at every ISA level, against the reference within the conformance tolerance."""

from __future__ import annotations

import pytest
import torch
from native_helpers import LEVEL_LOOKUPS, isa, map_lookup, num_threads

import bitsandbytes
from bitsandbytes import _formats
from bitsandbytes._reference import REFERENCE
from bitsandbytes.testing.cases import randn
from bitsandbytes.testing.conformance.test_fourbit import matmul_tolerance
from bitsandbytes_cpu import _C
from bitsandbytes_cpu.ops import matmul_4bit as mm

ISAS = _C.supported_isas()


def quantized(N, K, blocksize, quant_type="nf4", storage=torch.uint8, seed=0):
    W = randn((N, K), torch.float32, seed, spread=False)
    q, absmax = REFERENCE["quantize_4bit"](W, blocksize, quant_type, storage)
    table = _formats.code_table(quant_type, "cpu")
    W32 = REFERENCE["dequantize_4bit"](q, absmax, blocksize, quant_type, [N, K], torch.float32)
    return q, absmax, table, W32


def check_close(out, ref, A, W32, what):
    assert out.dtype == ref.dtype and out.shape == ref.shape, what
    diff = (out.double() - ref.double()).abs()
    tol = matmul_tolerance(A.reshape(-1, A.shape[-1]), W32, ref.reshape(-1, ref.shape[-1])).reshape(ref.shape)
    bad = ~(diff <= tol)
    assert not bad.any(), f"{what}: {int(bad.sum())} elements out of tolerance, max diff {diff.max().item()}"


# (M rows of A, N, K, blocksize): fast layouts, K not a multiple of the chunk, odd K (rows starting
# mid-byte), blocks straddling rows, blocksize > K, and row counts on both sides of the crossover. One row
# with K % 128 == 64 and an odd N: the bf16 kernel's half step, in row pairs and in the single last row,
# with 128-blocks that a 128-step of an odd row straddles.
SHAPES = [
    (1, 64, 256, 64),
    (1, 33, 192, 128),
    (1, 9, 320, 64),
    (3, 33, 4096, 4096),
    (1, 7, 96, 32),
    (5, 17, 100, 64),
    (2, 9, 129, 32),
    (1, 11, 3, 64),
    (6, 40, 192, 128),
    (20, 70, 160, 64),
    (33, 45, 77, 32),
]


@pytest.mark.parametrize("level", ISAS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize(("M", "N", "K", "blocksize"), SHAPES, ids=str)
def test_gemv_matches_reference(level, dtype, M, N, K, blocksize):
    q, absmax, table, W32 = quantized(N, K, blocksize, seed=M * 1000 + K)
    A = randn((M, K), dtype, seed=N, spread=False)
    ref = REFERENCE["gemv_4bit"](A, q, [N, K], absmax, table, blocksize)
    with isa(level):
        out = torch.ops.bitsandbytes.gemv_4bit(A, q, [N, K], absmax, table, blocksize)
    check_close(out, ref, A, W32, f"gemv {level}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("M", [1, 4, 24])
def test_gemm_bias_nested_storage(dtype, M):
    N, K, blocksize = 300, 320, 64
    W = randn((N, K), torch.float32, 7, spread=False)
    q, absmax = REFERENCE["quantize_4bit"](W, blocksize, "fp4", torch.bfloat16)
    dyn = bitsandbytes.functional.create_dynamic_map(signed=True).float()
    offset = absmax.mean()
    absmax_8bit, absmax2 = REFERENCE["quantize_blockwise"](absmax - offset, dyn, 256)
    A = randn((2, M, K), dtype, 8, spread=False)
    bias = randn((N,), dtype, 9, spread=False)
    kw = {"bias": bias, "absmax_8bit": absmax_8bit, "absmax_code": dyn, "absmax_offset": offset.reshape(1)}
    ref = REFERENCE["gemm_4bit"](A, q, [N, K], absmax2, blocksize, "fp4", **kw)
    out = torch.ops.bitsandbytes.gemm_4bit(A, q, [N, K], absmax2, blocksize, "fp4", **kw)
    effective = _C_expand(absmax_8bit, absmax2, dyn, offset.reshape(1))
    nested = REFERENCE["dequantize_blockwise"](absmax_8bit, absmax2, dyn, 256, torch.float32) + offset
    assert torch.equal(effective, nested), "double-quantized absmax bit-exact"
    W32 = REFERENCE["dequantize_4bit"](q, nested, blocksize, "fp4", [N, K], torch.float32)
    diff = (out.double() - ref.double()).abs()
    tol = (
        matmul_tolerance(A.reshape(-1, K), W32, ref.reshape(-1, N)).reshape(ref.shape)
        + 2 * torch.finfo(dtype).eps * bias.double().abs()
    )
    assert (diff <= tol).all()


def _C_expand(q, absmax2, code, offset):
    out = torch.empty(q.numel(), dtype=torch.float32)
    _C.expand_nested_absmax(q, absmax2, code, offset, out, 1)
    return out


@pytest.mark.parametrize("M", [1, 3, 40])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_thread_count_does_not_change_results(dtype, M):
    q, absmax, table, _ = quantized(257, 512, 64)
    A = randn((M, 512), dtype, 3, spread=False)
    outs = []
    for n in (1, 2, 3):
        with num_threads(n):
            outs.append(torch.ops.bitsandbytes.gemv_4bit(A, q, [257, 512], absmax, table, 64))
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def test_bf16_dot_and_fp32_paths_agree_within_tolerance():
    q, absmax, table, W32 = quantized(64, 1024, 64)
    A = randn((3, 1024), torch.bfloat16, 4, spread=False)
    ref = REFERENCE["gemv_4bit"](A, q, [64, 1024], absmax, table, 64)
    with isa(_C.best_isa()):
        have = _C.gemv_4bit_bf16_dot()
        try:
            for mode in (0, 1):
                _C.gemv_4bit_bf16_dot(mode)
                check_close(torch.ops.bitsandbytes.gemv_4bit(A, q, [64, 1024], absmax, table, 64), ref, A, W32, "bf16")
        finally:
            _C.gemv_4bit_bf16_dot(1)
        assert _C.gemv_4bit_bf16_dot() == have  # asked at the same level: the answer is per level


# The route (_bf16_tiles) and the kernel ask the same question of the same level: the AVX512-BF16 dot
# products exist only in the avx512 build of the kernels, so a level lowered by BNB_CPU_ISA / set_isa
# reports them off even on a CPU that has them, and bf16 rows above FUSED_MAX_ROWS then take the GEMM
# route rather than a fused kernel without the dot products.
@pytest.mark.parametrize("level", ISAS)
def test_bf16_dot_is_reported_per_level(level):
    with isa(level):
        used = _C.gemv_4bit_bf16_dot()
        if level != "avx512":
            assert not used
        elif hasattr(torch.cpu, "_is_avx512_bf16_supported"):
            assert used == torch.cpu._is_avx512_bf16_supported()
        assert mm._bf16_tiles(4096, 64) == used


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_dequantize_range_identical_across_isas(dtype):
    N, K, bs = 19, 333, 32
    W = randn((N, K), torch.float32, 5)
    W[3, :40] = float("nan")
    q, absmax = REFERENCE["quantize_4bit"](W, bs, "nf4", torch.uint8)
    table = _formats.code_table("nf4", "cpu")
    ref = REFERENCE["dequantize_4bit"](q, absmax, bs, "nf4", [N, K], dtype).reshape(-1)
    for i0, i1 in [(0, N * K), (1, N * K - 1), (64, 2000), (5, 5)]:
        outs = []
        for level in ISAS:
            with isa(level):
                out = torch.empty(i1 - i0, dtype=dtype)
                _C.dequantize_4bit_range(q.view(-1), absmax, table, bs, i0, i1, out, 2)
                outs.append(out)
        r = ref[i0:i1]
        for out in outs:
            assert torch.equal(out.isnan(), r.isnan())
            assert torch.equal(out[~r.isnan()], r[~r.isnan()])
            assert torch.equal(out.view(torch.uint8), outs[0].view(torch.uint8))


def test_empty_and_degenerate():
    q, absmax, table, _ = quantized(5, 8, 32)
    for shape in [(0, 8), (2, 0, 8)]:
        out = torch.ops.bitsandbytes.gemv_4bit(torch.zeros(shape), q, [5, 8], absmax, table, 32)
        assert out.shape == (*shape[:-1], 5)
    # K == 0: the product is the bias (or zero).
    e = torch.empty(0, dtype=torch.uint8)
    a0 = torch.empty(0)
    out = torch.ops.bitsandbytes.gemm_4bit(torch.zeros(3, 0), e, [4, 0], a0, 64, "nf4", bias=torch.ones(4))
    assert torch.equal(out, torch.ones(3, 4))
    out = torch.ops.bitsandbytes.gemv_4bit(torch.zeros(2, 0), e, [4, 0], a0, table, 64)
    assert torch.equal(out, torch.zeros(2, 4))


def test_gemv_out_and_batch_shape():
    q, absmax, table, _ = quantized(12, 64, 64)
    A = randn((2, 1, 64), torch.bfloat16, 1, spread=False)
    out = torch.full((2, 1, 12), float("nan"), dtype=torch.bfloat16)
    torch.ops.bitsandbytes.gemv_4bit.out(A, q, [12, 64], absmax, table, 64, out=out)
    assert torch.equal(out, torch.ops.bitsandbytes.gemv_4bit(A, q, [12, 64], absmax, table, 64))


def test_custom_table():
    # gemv_4bit takes any 16-entry table, not only nf4 / fp4.
    q, absmax, _, _ = quantized(9, 64, 32)
    table = torch.linspace(-3, 5, 16)
    A = randn((1, 64), torch.float32, 2, spread=False)
    ref = REFERENCE["gemv_4bit"](A, q, [9, 64], absmax, table, 32)
    W32 = REFERENCE["gemv_4bit"](torch.eye(64), q, [9, 64], absmax, table, 32).T
    check_close(torch.ops.bitsandbytes.gemv_4bit(A, q, [9, 64], absmax, table, 32), ref, A, W32, "custom table")


def test_cxx_rechecks_sizes():
    q, absmax, table, _ = quantized(8, 64, 64)
    qb = q.view(-1)
    A = torch.zeros(1, 64)
    out = torch.empty(1, 8)
    _C.gemv_4bit(A, qb, 1, 8, 64, absmax, table, 64, None, out, 1)
    with pytest.raises(ValueError, match="B holds"):
        _C.gemv_4bit(A, qb[:-1], 1, 8, 64, absmax, table, 64, None, out, 1)
    with pytest.raises(ValueError, match="absmax"):
        _C.gemv_4bit(A, qb, 1, 8, 64, absmax[:-1], table, 64, None, out, 1)
    with pytest.raises(ValueError, match="A must have"):
        _C.gemv_4bit(A, qb, 2, 8, 64, absmax, table, 64, None, torch.empty(2, 8), 1)
    with pytest.raises(ValueError, match="out"):
        _C.gemv_4bit(A, qb, 1, 8, 64, absmax, table, 64, None, torch.empty(1, 7), 1)
    with pytest.raises(ValueError, match="bias"):
        _C.gemv_4bit(A, qb, 1, 8, 64, absmax, table, 64, torch.zeros(7), out, 1)
    with pytest.raises(ValueError, match="code"):
        _C.gemv_4bit(A, qb, 1, 8, 64, absmax, table[:15], 64, None, out, 1)
    with pytest.raises(ValueError, match="dtype mismatch"):
        _C.gemv_4bit(A, qb, 1, 8, 64, absmax, table, 64, None, out.bfloat16(), 1)
    with pytest.raises(ValueError, match="blocksize"):
        _C.gemv_4bit(A, qb, 1, 8, 64, absmax, table, 48, None, out, 1)
    with pytest.raises(ValueError, match="B holds"):
        _C.dequantize_4bit_range(qb, absmax, table, 64, 0, 513, torch.empty(513), 1)
    with pytest.raises(ValueError, match="absmax"):
        _C.dequantize_4bit_range(qb, absmax[:1], table, 64, 0, 512, torch.empty(512), 1)
    with pytest.raises(ValueError, match="absmax"):
        _C.expand_nested_absmax(
            torch.zeros(300, dtype=torch.uint8), torch.ones(1), table.repeat(16), torch.zeros(1), torch.empty(300), 1
        )


def test_crossover_constants_cover_every_dtype():
    for dt in (torch.float32, torch.bfloat16, torch.float16):
        assert mm.FUSED_MAX_ROWS[dt] >= 1 and dt in mm.GEMM_DTYPE


# Register-blocked bf16 GEMM (AVX512-BF16, FUSED_MAX_ROWS < M <= BF16_TILE_MAX_ROWS): row tails (M not a
# multiple of the 6-row tile), weight-row tails (N % 4), K split into passes of 4096 (K = 4160) and A split
# into several blocks of rows (M = 64 at K >= 4096), bias, 1 / 2 / 3 threads bit-identical.
@pytest.mark.parametrize(("M", "N", "K", "blocksize"), [(9, 257, 512, 64), (37, 6, 192, 128), (64, 131, 4160, 64)])
def test_bf16_tiled_gemm(M, N, K, blocksize, monkeypatch):
    # At the avx512 level whatever BNB_CPU_ISA chose: the GEMM is compiled there only. An AMX CPU routes
    # these rows elsewhere (our AMX kernel, torch's bf16 GEMM); the kernel is still the one AVX512-BF16 CPUs
    # without AMX run.
    monkeypatch.setattr(mm, "AMX_BF16", False)
    monkeypatch.setattr(mm, "AMX_GEMM", False)
    with isa("avx512" if "avx512" in ISAS else _C.best_isa()):
        if not mm._bf16_tiles(K, blocksize):
            pytest.skip("needs AVX512-BF16 (this CPU or build has no avx512 level with it)")
        _check_bf16_tiled_gemm(M, N, K, blocksize)


def _check_bf16_tiled_gemm(M, N, K, blocksize):
    assert mm.FUSED_MAX_ROWS[torch.bfloat16] < M <= mm.BF16_TILE_MAX_ROWS
    q, absmax, _, W32 = quantized(N, K, blocksize, seed=M + K)
    A = randn((M, K), torch.bfloat16, seed=N, spread=False)
    bias = randn((N,), torch.bfloat16, seed=5, spread=False)
    ref = REFERENCE["gemm_4bit"](A, q, [N, K], absmax, blocksize, "nf4", bias=bias)
    outs = []
    for n in (1, 2, 3):
        with num_threads(n):
            outs.append(torch.ops.bitsandbytes.gemm_4bit(A, q, [N, K], absmax, blocksize, "nf4", bias=bias))
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])
    diff = (outs[0].double() - ref.double()).abs()
    tol = matmul_tolerance(A, W32, ref) + 2 * torch.finfo(torch.bfloat16).eps * bias.double().abs()
    assert (diff <= tol).all(), f"max diff {diff.max().item()}"


def _nested_weight(N, K, blocksize, seed=11):
    W = randn((N, K), torch.float32, seed, spread=False)
    q, absmax = REFERENCE["quantize_4bit"](W, blocksize, "nf4", torch.uint8)
    dyn = bitsandbytes.functional.create_dynamic_map(signed=True).float()
    offset = absmax.mean().reshape(1)
    absmax_8bit, absmax2 = REFERENCE["quantize_blockwise"](absmax - offset, dyn, 256)
    expanded = REFERENCE["dequantize_blockwise"](absmax_8bit, absmax2, dyn, 256, torch.float32) + offset
    return q, absmax_8bit, absmax2, dyn, offset, expanded


# The fused kernel expands double-quantized scales as its rows read them: bit-identical to the same
# kernel on the scales expanded up front, at every ISA level and thread count; shapes with whole blocks
# per row (the fast paths), blocks straddling rows (odd K), blocks larger than a row, and rows whose scales
# are expanded in several pieces per thread (K = 4096: 64 rows a piece; an odd row count), with the scale
# codes read both ways at avx512 (K = 4096's pieces are large enough for the registers).
@pytest.mark.parametrize(("level", "lookup"), LEVEL_LOOKUPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize(
    ("M", "N", "K", "blocksize"),
    [(1, 300, 256, 64), (3, 77, 100, 64), (1, 40, 64, 128), (1, 301, 4096, 64), (2, 133, 4096, 64)],
)
def test_nested_scales_fused_in_the_kernel_are_bit_exact(level, lookup, dtype, M, N, K, blocksize):
    q, absmax_8bit, absmax2, dyn, offset, expanded = _nested_weight(N, K, blocksize)
    A = randn((M, K), dtype, seed=3, spread=False)
    ops = torch.ops.bitsandbytes
    with isa(level), map_lookup(lookup):
        plain = ops.gemm_4bit(A, q, [N, K], expanded, blocksize, "nf4")
        for n in (1, 2, 3):
            with num_threads(n):
                nested = {"absmax_8bit": absmax_8bit, "absmax_code": dyn, "absmax_offset": offset}
                fused = ops.gemm_4bit(A, q, [N, K], absmax2, blocksize, "nf4", **nested)
            assert torch.equal(fused, plain), f"{n} threads"


def test_nested_arguments_are_checked_in_cxx():
    q, absmax_8bit, absmax2, dyn, offset, _ = _nested_weight(8, 64, 64)
    A, out = torch.zeros(1, 64), torch.empty(1, 8)
    args = (A, q.view(-1), 1, 8, 64, absmax2, _formats.code_table("nf4", "cpu").float(), 64, None, out, 1)
    _C.gemv_4bit(*args, absmax_8bit, dyn, offset)
    with pytest.raises(ValueError, match="absmax_code and absmax_offset"):
        _C.gemv_4bit(*args, absmax_8bit)
    with pytest.raises(ValueError, match="absmax_8bit must have at least 8"):
        _C.gemv_4bit(*args, absmax_8bit[:7], dyn, offset)
    with pytest.raises(ValueError, match="absmax_code"):
        _C.gemv_4bit(*args, absmax_8bit, dyn[:255], offset)


AVX2_SHUFFLE_SHAPES = [(1, 33, 64, 64), (2, 20, 192, 64), (4, 9, 640, 128), (5, 7, 320, 256)]


# K % 64 == 0 and blocksize >= 64 take the AVX2 vpshufb kernels (bf16 A: bf16 code tables; fp32 and fp16 A:
# the exact fp32 codes from four byte tables): K tails (K = 64, one chunk after pairs), several rows of A,
# blocksizes above 64, both formats, against the reference; every thread count gives the same bits.
@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize(("M", "N", "K", "blocksize"), AVX2_SHUFFLE_SHAPES)
def test_avx2_shuffle_kernels(M, N, K, blocksize, dtype, quant_type):
    if "avx2" not in ISAS:
        pytest.skip("no AVX2 here")
    q, absmax, table, W32 = quantized(N, K, blocksize, quant_type, seed=K)
    A = randn((M, K), dtype, seed=N, spread=False)
    ref = REFERENCE["gemv_4bit"](A, q, [N, K], absmax, table, blocksize)
    outs = []
    with isa("avx2"):
        for n in (1, 2, 3):
            with num_threads(n):
                outs.append(torch.ops.bitsandbytes.gemv_4bit(A, q, [N, K], absmax, table, blocksize))
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])
    check_close(outs[0], ref, A, W32, f"avx2 {dtype}")


# fp32 and fp16 A read the codes at full fp32 precision: A = e_k picks column k, whose exact value is
# code * absmax rounded once (the block scale times a sum of one exact product), i.e. the reference's
# weight bit for bit. A table of codes rounded to bf16 or fp16 would be off by up to 2^-9 relative.
# avx2: the vpshufb kernels; avx512: the nibble-shift kernel, at every nibble position of a dword
# (k = 0 .. 15) and on both sides of a block edge.
EXACT_WEIGHT_CASES = {
    "avx2": (24, 128, (0, 1, 63, 64, 127), "no AVX2 here"),
    "avx512": (
        5,
        256,
        (*range(16), 63, 64, 127, 128, 200, 255),
        "needs AVX-512 (this CPU or build has no avx512 level)",
    ),
}


@pytest.mark.parametrize("level", sorted(EXACT_WEIGHT_CASES))
@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_fp32_and_fp16_weights_are_exact(level, dtype, quant_type):
    N, K, columns, missing = EXACT_WEIGHT_CASES[level]
    if level not in ISAS:
        pytest.skip(missing)
    q, absmax, table, W32 = quantized(N, K, 64, quant_type, seed=5)
    with isa(level):
        for k in columns:
            A = torch.zeros(1, K, dtype=dtype)
            A[0, k] = 1
            out = torch.ops.bitsandbytes.gemv_4bit(A, q, [N, K], absmax, table, 64)
            assert torch.equal(out[0], W32[:, k].to(dtype)), f"{level}: column {k}"


NIBBLE_SHIFT_SHAPES = [(33, 128, 64), (20, 384, 64), (9, 640, 128), (7, 256, 4096), (1, 128, 64), (2, 1152, 256)]


# Batch 1 with K % 128 == 0 and blocksize >= 64 takes the AVX-512 nibble-shift kernel (fp32 codes, the
# block scale on each block's partial sum; rows in pairs, an odd last row alone): blocksize 64 (two scales
# per 128-chunk), larger blocks, blocks longer than a row, one row, against the reference; every thread
# count gives the same bits. bf16 A goes there too when the AVX512-BF16 kernel is off.
@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize(("N", "K", "blocksize"), NIBBLE_SHIFT_SHAPES, ids=str)
def test_avx512_nibble_shift_gemv(N, K, blocksize, dtype, quant_type):
    if "avx512" not in ISAS:
        pytest.skip("needs AVX-512 (this CPU or build has no avx512 level)")
    q, absmax, table, W32 = quantized(N, K, blocksize, quant_type, seed=K + N)
    A = randn((1, K), dtype, seed=N, spread=False)
    bias = randn((N,), dtype, seed=7, spread=False)
    ref = REFERENCE["gemv_4bit"](A, q, [N, K], absmax, table, blocksize) + bias
    outs = []
    used = _C.gemv_4bit_bf16_dot(-1)
    try:
        _C.gemv_4bit_bf16_dot(0)
        with isa("avx512"):
            for n in (1, 2, 3):
                out = torch.empty(1, N, dtype=dtype)
                _C.gemv_4bit(A, q.view(-1), 1, N, K, absmax, table, blocksize, bias, out, n)
                outs.append(out)
    finally:
        _C.gemv_4bit_bf16_dot(1 if used else 0)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])
    check_close(outs[0], ref, A, W32, f"avx512 nibble shift {dtype}")


# F.gemv_4bit of a double-quantized state: on the CPU it takes gemm_4bit's nested arguments (the kernel
# expands the 8-bit scales as it reads them) instead of expanding them into fresh tensors first. The same
# bits as the expanded route, every dtype and format, K % 128 == 64 included (the bf16 kernel's half step).
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
@pytest.mark.parametrize(("N", "K"), [(64, 4096), (33, 192), (17, 320)])
def test_gemv_4bit_nested_state_takes_the_nested_kernel(monkeypatch, dtype, quant_type, N, K):
    from bitsandbytes import functional as F
    from bitsandbytes._functional import quant

    W = randn((N, K), dtype, 5, spread=False)
    q, st = F.quantize_4bit(W, blocksize=64, quant_type=quant_type, compress_statistics=True)
    x = randn((1, K), dtype, 6)
    flat = F.QuantState(
        absmax=quant._nested_absmax(st), shape=st.shape, code=st.code, blocksize=64, quant_type=quant_type, dtype=dtype
    )
    expected = F.gemv_4bit(x, q.t(), state=flat)
    calls = []
    real = quant._nested_absmax
    monkeypatch.setattr(quant, "_nested_absmax", lambda qs: calls.append(qs) or real(qs))
    got = F.gemv_4bit(x, q.t(), state=st)
    assert not calls, "a nested state's scales were expanded in Python"
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert torch.equal(
        got.view(torch.int16 if dtype != torch.float32 else torch.int32),
        expected.view(torch.int16 if dtype != torch.float32 else torch.int32),
    )
    # A hand-made state whose code is not quant_type's table keeps the expanded route (gemm_4bit reads
    # quant_type's table), and its result follows that code.
    st.code = st.code * 0.5
    halved = F.gemv_4bit(x, q.t(), state=st)
    assert len(calls) == 1
    assert torch.equal(
        halved,
        F.gemv_4bit(
            x,
            q.t(),
            state=F.QuantState(
                absmax=real(st), shape=st.shape, code=st.code, blocksize=64, quant_type=quant_type, dtype=dtype
            ),
        ),
    )
