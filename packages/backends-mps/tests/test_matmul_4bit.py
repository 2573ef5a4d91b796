"""metal/matmul_4bit.metal's gemv kernel run in the emulator against the reference: gemv_4bit, and gemm_4bit
(the gemv kernel for few rows, the weight dequantized by fourbit.metal and torch.matmul for many).

The kernel accumulates in float32 in another order than the reference: it is held to the conformance
suite's matmul bound. The op functions of ``bitsandbytes_mps.ops.matmul_4bit`` are called directly on
CPU tensors with the library in emulator mode; the conformance suite runs them through
``bitsandbytes_mps.testing.emulated``. Also checked: the geometry constants shared by the kernel and the ops.
"""

from __future__ import annotations

import re

import pytest
import torch

from bitsandbytes import _formats
from bitsandbytes._reference import REFERENCE
from bitsandbytes.testing.cases import DTYPES, QUANT_TYPES, dtype_id
from bitsandbytes.testing.compare import assert_equal
from bitsandbytes.testing.conformance.test_fourbit import matmul_tolerance
from bitsandbytes_mps import _assemble
from bitsandbytes_mps.ops import _quantize, matmul_4bit
from bitsandbytes_mps.tables import matmul_4bit as table

pytestmark = pytest.mark.usefixtures("emulated")  # conftest: the library loads in the emulator


def test_geometry_constants_match_the_kernel_source():
    text = _assemble.source_path(table.SOURCE).read_text()
    for macro, value in (("BNB_GEMV_FEATURES", table.GEMV_FEATURES), ("BNB_GEMV_ROWS", table.GEMV_ROWS)):
        assert re.search(rf"#define {macro} {value}\n", text), macro
    max_sg = int(re.search(r"#define BNB_GEMV_MAX_SIMDGROUPS (\d+)", text).group(1))
    assert table.GEMV_THREADS % 32 == 0 and table.GEMV_THREADS <= 32 * max_sg


def assert_matmul_close(out, ref, A, W):
    """Within the conformance suite's bound, element by element."""
    assert out.dtype == ref.dtype == A.dtype and out.shape == ref.shape
    diff = (out.double() - ref.double()).abs()
    bound = matmul_tolerance(A, W, ref)
    bad = diff > bound
    assert not bad.any(), f"{int(bad.sum())} elements off; worst {diff.max().item()} (bound there {bound[bad][0]})"


def quantized(N, K, blocksize, quant_type, seed, storage=torch.uint8):
    """(packed, absmax, the dequantized [N, K] weight in float64)."""
    W = torch.randn((N, K), generator=torch.Generator().manual_seed(seed))
    packed, absmax = REFERENCE["quantize_4bit"](W, blocksize, quant_type, storage)
    W64 = REFERENCE["dequantize_4bit"](packed, absmax, blocksize, quant_type, [N, K], torch.float32).double()
    return packed, absmax, W64


def code_of(quant_type):
    return _formats.code_table(quant_type).float()


def rand(shape, dtype, seed):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


# (A's shape, N, blocksize): tails in every direction.
GEMV_CASES = [
    ((1, 64), 7, 64),  # N % 4 != 0: a threadgroup with fewer features
    ((1, 600), 5, 64),  # K > 2 * threads: two steps for some threads
    ((3, 96), 9, 32),
    ((6, 160), 6, 4096),  # M > rows per threadgroup; one block of scales spans every row
    ((5, 200), 3, 128),  # blocks of scales end mid-row
    ((4, 204), 6, 128),  # even K, K % 8 != 0: the byte-pair path
    ((2, 1, 33), 5, 64),  # odd K: every other row starts on a low nibble
    ((37,), 3, 32),  # 1-D A, odd K
    ((1, 1), 1, 32),  # a single weight
]


@pytest.mark.parametrize(("a_shape", "N", "blocksize"), GEMV_CASES, ids=str)
@pytest.mark.parametrize("quant_type", QUANT_TYPES)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_gemv_4bit(dispatched, dtype, quant_type, a_shape, N, blocksize):
    K = a_shape[-1]
    packed, absmax, W64 = quantized(N, K, blocksize, quant_type, seed=N * K + blocksize)
    A = rand(a_shape, dtype, seed=K)
    args = (A, packed, [N, K], absmax, code_of(quant_type), blocksize)
    out = matmul_4bit.gemv_4bit(*args)
    assert dispatched == [f"gemv_4bit_{dtype_id(dtype)}".replace(dtype_id(dtype), matmul_4bit.suffix(dtype))]
    assert_matmul_close(out, REFERENCE["gemv_4bit"](*args), A, W64)
    assert_matmul_close(out, (A.double() @ W64.T).to(dtype), A, W64)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_gemv_misaligned_weight_view(dtype):
    """A weight whose bytes start at an odd offset cannot be read as words: the byte path (the sums come
    in another order, so the same values up to the matmul bound)."""
    N, K = 6, 128
    packed, absmax, W64 = quantized(N, K, 64, "nf4", seed=1)
    view = torch.cat([packed.new_zeros(1, 1), packed])[1:]  # contiguous, storage offset 1
    assert matmul_4bit.gemv_reads_words(_quantize.as_bytes(packed), K)
    assert not matmul_4bit.gemv_reads_words(_quantize.as_bytes(view), K)
    A = rand((2, K), dtype, seed=2)
    out = matmul_4bit.gemv_4bit(A, view, [N, K], absmax, code_of("nf4"), 64)
    assert_matmul_close(out, REFERENCE["gemv_4bit"](A, packed, [N, K], absmax, code_of("nf4"), 64), A, W64)
    assert_matmul_close(out, (A.double() @ W64.T).to(dtype), A, W64)


@pytest.mark.parametrize("K", [136, 130, 131], ids=["words", "pairs", "odd"])
def test_gemv_float32_is_the_reference_up_to_summation_order(K):
    """With float32 weights and integer-valued A, every partial sum is exact: any order gives the same bits."""
    N = 6
    packed, absmax, _ = quantized(N, K, 32, "nf4", seed=12)
    absmax = torch.full_like(absmax, 16.0)  # weights k / 8 * 16: small integers
    A = torch.randint(-3, 4, (2, K), generator=torch.Generator().manual_seed(0)).float()
    args = (A, packed, [N, K], absmax, torch.arange(-8, 8) / 8.0, 32)
    assert_equal(matmul_4bit.gemv_4bit(*args), REFERENCE["gemv_4bit"](*args), "gemv")


@pytest.mark.parametrize("storage", [torch.float16, torch.float32])
def test_gemv_reads_the_bytes_of_any_quant_storage(storage):
    """A weight stored as float16 / float32 words is bound as its bytes (ops/_quantize.as_bytes): the same
    result as the uint8 weight (the .out overload is the conformance suite's)."""
    N, K = 10, 64
    packed, absmax, _ = quantized(N, K, 32, "fp4", seed=3)
    stored, _, _ = quantized(N, K, 32, "fp4", seed=3, storage=storage)
    A = rand((7, K), torch.bfloat16, seed=4)
    out = matmul_4bit.gemv_4bit(A, stored, [N, K], absmax, code_of("fp4"), 32)
    assert_equal(out, matmul_4bit.gemv_4bit(A, packed, [N, K], absmax, code_of("fp4"), 32), "gemv")


def nested_scales(absmax):
    """gemm_4bit's double-quantized form of ``absmax``: (its keyword arguments, absmax2, the expanded scales)."""
    dyn = torch.linspace(-1, 1, 256)
    offset = absmax.mean()
    absmax_8bit, absmax2 = REFERENCE["quantize_blockwise"](absmax - offset, dyn, 256)
    kwargs = {"absmax_8bit": absmax_8bit, "absmax_code": dyn, "absmax_offset": offset.reshape(1)}
    expanded = REFERENCE["dequantize_blockwise"](absmax_8bit, absmax2, dyn, 256, torch.float32) + offset
    return kwargs, absmax2, expanded


def gemm_kernels(rows, nested, dtype, quant_type="nf4"):
    """The kernels gemm_4bit dispatches: the gemv kernel for few rows, else the whole weight dequantized."""
    sfx = matmul_4bit.suffix(dtype)
    matmul = f"gemv_4bit_{sfx}" if rows <= matmul_4bit.GEMM_FUSED_MAX_ROWS else f"dequantize_4bit_{quant_type}_{sfx}"
    return [*(["dequantize_blockwise_f32"] if nested else []), matmul]


@pytest.mark.parametrize("rows", [1, 2, matmul_4bit.GEMM_FUSED_MAX_ROWS, matmul_4bit.GEMM_FUSED_MAX_ROWS + 1, 11])
@pytest.mark.parametrize("nested", [False, True], ids=["plain", "nested"])
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_gemm_4bit(dispatched, dtype, bias, nested, rows):
    N, K, blocksize = 13, 96, 32
    packed, absmax, W64 = quantized(N, K, blocksize, "nf4", seed=5)
    A = rand((rows, K), dtype, seed=6)
    kwargs = {"bias": rand((N,), dtype, seed=7)} if bias else {}
    if nested:
        nested_kwargs, absmax, effective = nested_scales(absmax)
        kwargs |= nested_kwargs
        W64 = REFERENCE["dequantize_4bit"](packed, effective, blocksize, "nf4", [N, K], torch.float32).double()
    args = (A, packed, [N, K], absmax, blocksize, "nf4")
    out = matmul_4bit.gemm_4bit(*args, **kwargs)
    assert dispatched == gemm_kernels(rows, nested, dtype)
    assert_matmul_close(out, REFERENCE["gemm_4bit"](*args, **kwargs), A, W64)
    truth = A.double() @ W64.T + (kwargs["bias"].double() if bias else 0)
    assert_matmul_close(out, truth.to(dtype), A, W64)


@pytest.mark.parametrize("quant_type", QUANT_TYPES)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_gemm_4bit_one_nested_row_is_the_gemv_kernel_on_the_expanded_scales(dispatched, dtype, quant_type):
    """The core's decoding step with double quantization: the scales expanded by one dequantize_blockwise
    launch, then the gemv kernel with quant_type's table (never the whole weight dequantized): the same bits
    as gemv_4bit on the reference's expanded scales. The bias is added in float32 before the one rounding,
    as the reference adds it: for float32 A, exactly the unbiased sum + bias."""
    N, K, blocksize = 9, 256, 64
    packed, absmax, _ = quantized(N, K, blocksize, quant_type, seed=8)
    nested_kwargs, absmax2, expanded = nested_scales(absmax)
    W64 = REFERENCE["dequantize_4bit"](packed, expanded, blocksize, quant_type, [N, K], torch.float32).double()
    A = rand((1, K), dtype, seed=9)
    args = (A, packed, [N, K], absmax2, blocksize, quant_type)
    out = matmul_4bit.gemm_4bit(*args, **nested_kwargs)
    assert dispatched == gemm_kernels(1, True, dtype, quant_type)
    assert_equal(out, matmul_4bit.gemv_4bit(A, packed, [N, K], expanded, code_of(quant_type), blocksize), "gemv")
    assert_matmul_close(out, REFERENCE["gemm_4bit"](*args, **nested_kwargs), A, W64)
    bias = rand((N,), dtype, seed=10)
    with_bias = matmul_4bit.gemm_4bit(*args, bias=bias, **nested_kwargs)
    assert_matmul_close(with_bias, REFERENCE["gemm_4bit"](*args, bias=bias, **nested_kwargs), A, W64)
    if dtype == torch.float32:
        assert_equal(with_bias, out + bias, "gemm + bias")


def test_empty_dimensions(dispatched):
    packed, absmax, _ = quantized(4, 32, 32, "nf4", seed=10)
    code = code_of("nf4")
    assert matmul_4bit.gemv_4bit(torch.empty(0, 32), packed, [4, 32], absmax, code, 32).shape == (0, 4)
    out = matmul_4bit.gemm_4bit(torch.empty(2, 0), torch.empty(0, dtype=torch.uint8), [3, 0], torch.empty(0), 32, "nf4")
    assert torch.equal(out, torch.zeros(2, 3))
    bias = torch.randn(3)
    out = matmul_4bit.gemm_4bit(
        torch.empty(2, 0), torch.empty(0, dtype=torch.uint8), [3, 0], torch.empty(0), 32, "nf4", bias
    )
    assert torch.equal(out, bias.expand(2, 3))
    assert dispatched == []


# ------------------------------------------------------------------------------------ errors, fallback


def test_missing_bfloat_kernels_fall_back_to_the_reference(monkeypatch, dispatched):
    """Where MSL < 3.1 the bf16 instances are absent: gemv runs the reference, the float32 kernel stays native."""
    real = matmul_4bit.native

    def without_bfloat(name, threads=0):
        return not name.endswith("_bf16") and real(name, threads)

    monkeypatch.setattr(matmul_4bit, "native", without_bfloat)
    packed, absmax, _ = quantized(3, 70, 64, "nf4", seed=1)
    for dtype in (torch.bfloat16, torch.float32):
        A = rand((2, 70), dtype, seed=0)
        out = matmul_4bit.gemv_4bit(A, packed, [3, 70], absmax, code_of("nf4"), 64)
        ref = REFERENCE["gemv_4bit"](A, packed, [3, 70], absmax, code_of("nf4"), 64)
        if dtype == torch.bfloat16:
            assert_equal(out, ref, "gemv")
            assert dispatched == []
    assert dispatched == ["gemv_4bit_f32"]  # float32 still runs its kernel


def test_ops_table():
    assert set(matmul_4bit.OPS) == {"gemv_4bit", "gemv_4bit.out", "gemm_4bit"}
    assert matmul_4bit.SOURCES == (table.SOURCE,)
