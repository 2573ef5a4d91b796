"""The quant family's Metal kernels (metal/quant.metal) run in the emulator against the reference.

Codes, absmax and dequantized values are bytes the formats define, so those comparisons are bit-exact
(only the payload of a dequantized NaN is free). gemv_4bit / gemm_4bit accumulate in float32 in another
order than the reference: they are held to the conformance suite's matmul bound. The op functions of
``bitsandbytes_mps.ops.quant`` are called directly on CPU tensors with the library in emulator mode; the
conformance suite runs them through ``bitsandbytes_mps.testing.emulated``. Also checked: the generated
regions of quant.metal (the NF4/FP4 constants against ``bitsandbytes._formats``, the instances against
the table) and the geometry constants shared by the kernels and the ops.
"""

from __future__ import annotations

import re
import struct

import pytest
import torch

from bitsandbytes import _formats, functional
from bitsandbytes._reference import REFERENCE
from bitsandbytes.testing.cases import (
    BLOCKSIZES,
    DTYPES,
    NONFINITE,
    QUANT_STORAGE_DTYPES,
    QUANT_TYPES,
    blockwise_cases,
    dtype_id,
    empty_shapes,
    randn,
    seed_of,
    with_nonfinite,
    with_zero_block,
)
from bitsandbytes.testing.compare import assert_equal
from bitsandbytes.testing.conformance.test_fourbit import matmul_tolerance
from bitsandbytes_mps import library
from bitsandbytes_mps.ops import quant
from bitsandbytes_mps.tables import parse_kernels
from bitsandbytes_mps.tables import quant as table

pytestmark = pytest.mark.usefixtures("emulated")  # conftest: the library loads in the emulator

CASES = list(blockwise_cases())
CASE_IDS = [f"{dtype_id(d)}-b{b}-{'x'.join(map(str, s))}" for d, b, s in CASES]


@pytest.fixture(scope="module")
def code() -> torch.Tensor:
    return functional.create_dynamic_map(signed=True).float()


@pytest.fixture
def dispatched(monkeypatch) -> list[str]:
    """The kernels the ops dispatch, in order."""
    names: list[str] = []
    real = library.dispatch

    def recording(name, *args, **kwargs):
        names.append(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(library, "dispatch", recording)
    return names


def same_nans(actual: torch.Tensor, expected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Both with every NaN where both have one replaced by 0: NaN payloads are not part of the format."""
    both = actual.isnan() & expected.isnan()
    return actual.masked_fill(both, 0), expected.masked_fill(both, 0)


def check_blockwise(A, code, blocksize, dtype=None):
    """quantize_blockwise and its dequantization (to ``dtype``, default A's) equal the reference's bytes."""
    q, absmax = quant.quantize_blockwise(A, code, blocksize)
    rq, rabsmax = REFERENCE["quantize_blockwise"](A, code, blocksize)
    assert_equal(q, rq, "codes")
    assert_equal(absmax, rabsmax, "absmax")
    dtype = dtype or A.dtype
    out = quant.dequantize_blockwise(q, absmax, code, blocksize, dtype)
    ref = REFERENCE["dequantize_blockwise"](rq, rabsmax, code, blocksize, dtype)
    assert_equal(*same_nans(out, ref), "dequantized")


def check_4bit(A, blocksize, quant_type, dtype=None, storage=torch.uint8):
    """quantize_4bit and its dequantization equal the reference's bytes."""
    packed, absmax = quant.quantize_4bit(A, blocksize, quant_type, storage)
    rpacked, rabsmax = REFERENCE["quantize_4bit"](A, blocksize, quant_type, storage)
    assert_equal(packed, rpacked, "packed codes")
    assert_equal(absmax, rabsmax, "absmax")
    dtype = dtype or A.dtype
    out = quant.dequantize_4bit(packed, absmax, blocksize, quant_type, list(A.shape), dtype)
    ref = REFERENCE["dequantize_4bit"](rpacked, rabsmax, blocksize, quant_type, list(A.shape), dtype)
    assert_equal(*same_nans(out, ref), "dequantized")


def on_midpoints(mids: torch.Tensor, blocksize: int, absmax: float) -> torch.Tensor:
    """A full block and a short last block of midpoints times ``absmax``: the full-block rule (multiply by
    1 / absmax) and the last-block rule (divide) put different values exactly on a midpoint (a tie), so
    each block checks that the kernel uses its rule."""
    block = torch.cat([torch.tensor([absmax]), mids * absmax])
    block = torch.cat([block, torch.zeros(blocksize - block.numel())])
    a = torch.tensor(absmax)
    x = mids * absmax
    multiply, divide = x * (1.0 / a) == mids, x / a == mids
    assert (multiply & ~divide).any() and (divide & ~multiply).any(), "each rule must make ties the other does not"
    return torch.cat([block, block[: mids.numel()]])


# --------------------------------------------------------------------------------- the source itself


def source_text() -> str:
    return table.SOURCE_PATH.read_text()


def test_generated_regions_are_current():
    """`python -m bitsandbytes_mps.tables.quant` would change nothing: constants and instances are fresh."""
    assert table.render_source(source_text()) == source_text()


def _constant_array(text: str, name: str) -> list[str]:
    m = re.search(rf"constant \w+ {name}\[\d+\] = \{{([^}}]*)\}};", text)
    assert m, f"{name} is not in quant.metal"
    return [v.strip() for v in m.group(1).split(",")]


def _f32_bits(literal: str) -> int:
    return struct.unpack("<I", struct.pack("<f", float(literal.rstrip("f"))))[0]


@pytest.mark.parametrize("quant_type", QUANT_TYPES)
def test_4bit_constants_are_the_formats(quant_type):
    """The tables in quant.metal, read back from the text, are bit for bit those of bitsandbytes._formats
    (and so of the core's formats.h)."""
    text, up = source_text(), quant_type.upper()
    table_values = _formats.code_table(quant_type).float()
    want = [struct.unpack("<I", struct.pack("<f", v))[0] for v in table_values.tolist()]
    assert [_f32_bits(v) for v in _constant_array(text, f"{up}_TABLE")] == want
    by_value, order = torch.sort(table_values, stable=True)
    mids = ((by_value[:-1] + by_value[1:]) / 2).tolist()
    assert [_f32_bits(v) for v in _constant_array(text, f"{up}_MIDPOINTS")] == [
        struct.unpack("<I", struct.pack("<f", m))[0] for m in mids
    ]
    assert [int(v) for v in _constant_array(text, f"{up}_ORDER")] == order.tolist()
    pad = re.search(rf"#define {up}_PAD_CODE (\d+)u", text)
    pad_code = REFERENCE["quantize_4bit"](torch.ones(1), 32, quant_type, torch.uint8)[0].item() & 0xF
    assert pad and int(pad.group(1)) == pad_code
    assert re.search(rf"#define BNB_FIRST_VALUE_IN_HIGH_NIBBLE {int(_formats.FIRST_VALUE_IN_HIGH_NIBBLE)}\b", text)
    min_scale = torch.tensor(_formats.MIN_SCALE, dtype=torch.float32)
    literal = re.search(r"#define BNB_MIN_SCALE (\S+)\n", text).group(1)
    assert _f32_bits(literal) == min_scale.view(torch.int32).item()
    assert int(re.search(r"#define BNB_MIN_SCALE_BITS (0x[0-9a-f]+)u", text).group(1), 16) == _f32_bits(literal)
    inv = re.search(r"#define BNB_INV_MIN_SCALE (\S+)\n", text).group(1)
    assert _f32_bits(inv) == (1.0 / min_scale).view(torch.int32).item()  # the reference's float32 reciprocal


def test_table_matches_the_kernel_signatures():
    parsed = parse_kernels(source_text(), table.SOURCE)
    assert {k.name: k for k in table.KERNELS} == parsed


def test_geometry_constants_match_the_kernel_source():
    text = source_text()
    for macro, value in (
        ("BNB_QUANT_ITEMS", table.QUANT_ITEMS),
        ("BNB_DEQUANT_ITEMS", table.DEQUANT_ITEMS),
        ("BNB_GEMV_FEATURES", table.GEMV_FEATURES),
        ("BNB_GEMV_ROWS", table.GEMV_ROWS),
    ):
        assert re.search(rf"#define {macro} {value}\n", text), macro
    max_sg = int(re.search(r"#define BNB_GEMV_MAX_SIMDGROUPS (\d+)", text).group(1))
    assert table.GEMV_THREADS % 32 == 0 and table.GEMV_THREADS <= 32 * max_sg


def test_quantize_geometry_meets_the_kernels_requirements():
    for n in (1, 1000, 10**9):
        for blocksize in BLOCKSIZES:
            threads, size = quant.quantize_geometry(n, blocksize)
            group = blocksize // table.QUANT_ITEMS
            assert size % 32 == 0 and size % group == 0 and 256 <= size <= 1024 and threads % size == 0
            assert (threads // size) * (size // group) * blocksize >= n  # every block has its threads


def test_bfloat_instances_are_guarded():
    text = source_text()
    guarded = text[text.index(table.BFLOAT_GUARD) :]
    for k in table.KERNELS:
        if k.name.endswith("_bf16"):
            assert f'"{k.name}"' in guarded and f'"{k.name}"' not in text[: text.index(table.BFLOAT_GUARD)]


# ------------------------------------------------------------------------------------------- 8-bit


@pytest.mark.parametrize(("dtype", "blocksize", "shape"), CASES, ids=CASE_IDS)
def test_blockwise_matches_reference(code, dtype, blocksize, shape):
    check_blockwise(randn(shape, dtype, seed_of("q8", dtype, blocksize, shape)), code, blocksize)


@pytest.mark.parametrize("out_dtype", DTYPES, ids=dtype_id)
def test_blockwise_dequantize_to_other_dtypes_and_out(code, out_dtype):
    A = randn((3, 69), torch.float32, seed_of("q8o", out_dtype))
    q, absmax = quant.quantize_blockwise(A, code, 64)
    ref = REFERENCE["dequantize_blockwise"](q, absmax, code, 64, out_dtype)
    assert_equal(quant.dequantize_blockwise(q, absmax, code, 64, out_dtype), ref, "dequantized")
    out = torch.full(A.shape, float("nan"), dtype=out_dtype)
    assert quant.dequantize_blockwise_out(q, absmax, code, 64, out_dtype, out) is None
    assert_equal(out, ref, "dequantized into out")
    with pytest.raises(ValueError, match="out must be contiguous"):
        quant.dequantize_blockwise_out(q, absmax, code, 64, out_dtype, torch.empty((3, 138), dtype=out_dtype)[:, ::2])


def test_blockwise_ties_go_to_the_lower_neighbour(code):
    """Values exactly on the float32 midpoints (the block's absmax is 1, so they scale to themselves)."""
    by_value = code.sort().values
    mids = (by_value[:-1] + by_value[1:]) / 2
    A = torch.cat([torch.ones(1), mids, -mids, by_value, torch.zeros(1), -torch.zeros(1)])
    A = torch.cat([A, torch.zeros(-A.numel() % 256)])
    A[::256] = 1.0
    check_blockwise(A, code, 256)


def test_blockwise_full_blocks_multiply_the_last_block_divides(code):
    by_value = code.sort().values
    check_blockwise(on_midpoints((by_value[:-1] + by_value[1:]) / 2, 256, 7.0), code, 256)


def test_blockwise_unsorted_map_with_duplicates(code):
    """quant_map_prepare sorts the map stably: any order, equal entries go to the lowest index."""
    g = torch.Generator().manual_seed(7)
    shuffled = code[torch.randperm(256, generator=g)].clone()
    shuffled[10] = shuffled[200]  # a duplicated value
    shuffled[3] = -0.0
    check_blockwise(randn((5 * 128 + 9,), torch.float32, seed_of("unsorted")), shuffled, 128)


def test_blockwise_unsigned_and_linear_maps():
    A = randn((2 * 64 + 3,), torch.float16, seed_of("maps"))
    check_blockwise(A.abs(), functional.create_dynamic_map(signed=False).float(), 64)
    check_blockwise(A, torch.linspace(-1, 1, 256), 64)


@pytest.mark.parametrize("nan_at", [0, 5, 200, 255])
def test_blockwise_map_with_a_nan_entry(code, nan_at):
    """A NaN map entry sorts after every number, and the NaN midpoints next to it are searched as the
    reference's bucketize searches them (it goes right at a NaN boundary): the same codes."""
    with_nan = code.clone()
    with_nan[nan_at] = float("nan")
    A = randn((16 * 256 + 77,), torch.float32, seed_of("nan map", nan_at))
    A[7] = float("nan")
    check_blockwise(A, with_nan, 256)


def test_prepared_map_is_the_reference_sort(code):
    g = torch.Generator().manual_seed(3)
    shuffled = code[torch.randperm(256, generator=g)].contiguous()
    mids, order = quant.sorted_code_map(shuffled)
    idx = torch.argsort(shuffled, stable=True)
    assert_equal(order, idx.to(torch.uint8), "order")
    v = shuffled[idx]
    assert_equal(mids[:255], (v[:-1] + v[1:]) / 2, "midpoints")


@pytest.mark.parametrize("value", NONFINITE, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_blockwise_nonfinite(code, dtype, value):
    A = with_nonfinite(randn((3 * 64 + 5,), dtype, seed_of("nf8", dtype, value)), 64, value)
    A = with_nonfinite(A, 64, value, block=3, offset=2)  # and one in the short last block
    check_blockwise(A, code, 64)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_blockwise_all_zero_block(code, dtype):
    check_blockwise(with_zero_block(randn((3 * 64 + 5,), dtype, seed_of("z8", dtype)), 64), code, 64)


@pytest.mark.parametrize("shape", empty_shapes(), ids=str)
def test_blockwise_empty(code, shape, dispatched):
    check_blockwise(torch.empty(shape), code, 64)
    assert dispatched == []  # Metal cannot bind an empty buffer: nothing is launched


# ------------------------------------------------------------------------------------------- 4-bit


@pytest.mark.parametrize("quant_type", QUANT_TYPES)
@pytest.mark.parametrize(("dtype", "blocksize", "shape"), CASES, ids=CASE_IDS)
def test_4bit_matches_reference(dtype, blocksize, shape, quant_type):
    check_4bit(randn(shape, dtype, seed_of("q4", dtype, blocksize, shape, quant_type)), blocksize, quant_type)


@pytest.mark.parametrize("quant_type", QUANT_TYPES)
@pytest.mark.parametrize("out_dtype", DTYPES, ids=dtype_id)
def test_4bit_dequantize_to_other_dtypes_and_out(out_dtype, quant_type):
    A = randn((4, 51), torch.bfloat16, seed_of("q4o", out_dtype, quant_type))
    packed, absmax = quant.quantize_4bit(A, 32, quant_type, torch.uint8)
    ref = REFERENCE["dequantize_4bit"](packed, absmax, 32, quant_type, [4, 51], out_dtype)
    out = torch.full((4, 51), float("nan"), dtype=out_dtype)
    assert quant.dequantize_4bit_out(packed, absmax, 32, quant_type, [4, 51], out_dtype, out) is None
    assert_equal(out, ref, "dequantized into out")
    with pytest.raises(ValueError, match="out must be contiguous"):
        quant.dequantize_4bit_out(
            packed, absmax, 32, quant_type, [4, 51], out_dtype, torch.empty((51, 4), dtype=out_dtype).T
        )


@pytest.mark.parametrize("quant_type", QUANT_TYPES)
def test_4bit_ties_and_signed_zeros(quant_type):
    """Values on every midpoint of the table, +-0 and the smallest values either side of 0 (FP4 splits
    its two zero codes at 0)."""
    v = _formats.code_table(quant_type).float().sort().values
    mids = (v[:-1] + v[1:]) / 2
    tiny = torch.tensor([0.0, -0.0, 1e-30, -1e-30, 2e-3, -2e-3])
    A = torch.cat([torch.ones(1), mids, v, tiny, torch.nextafter(mids, torch.ones(1)), torch.ones(1) * -1])
    check_4bit(A, 64, quant_type)


@pytest.mark.parametrize(("quant_type", "absmax"), [("nf4", 6.2484564781188965), ("fp4", 3.2500076293945312)])
def test_4bit_full_blocks_multiply_the_last_block_divides(quant_type, absmax):
    v = _formats.code_table(quant_type).float().sort().values
    check_4bit(on_midpoints((v[:-1] + v[1:]) / 2, 32, absmax), 32, quant_type)


@pytest.mark.parametrize("value", NONFINITE, ids=str)
@pytest.mark.parametrize("quant_type", QUANT_TYPES)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_4bit_nonfinite(dtype, quant_type, value):
    # 3 blocks and an odd tail of 5: the padding nibble keeps its code even in a poisoned last block.
    A = with_nonfinite(randn((3 * 64 + 5,), dtype, seed_of("nf4", dtype, value, quant_type)), 64, value)
    A = with_nonfinite(A, 64, value, block=3, offset=4)
    check_4bit(A, 64, quant_type)


@pytest.mark.parametrize("quant_type", QUANT_TYPES)
def test_4bit_all_zero_block(quant_type):
    check_4bit(with_zero_block(randn((3 * 64 + 5,), torch.float16, seed_of("z4", quant_type)), 64), 64, quant_type)


@pytest.mark.parametrize("storage", QUANT_STORAGE_DTYPES, ids=dtype_id)
def test_4bit_quant_storage(storage):
    check_4bit(randn((8, 32), torch.float16, seed_of("st", storage)), 64, "nf4", storage=storage)


def test_blocks_below_min_scale(code):
    """Blocks whose absmax is under MIN_SCALE (subnormal values, signed zeros) in a full and the short
    last block: the kernels' bit-decided tiny-block path gives the reference's codes."""
    tiny = torch.tensor([1e-39, -3e-39, 0.0, -0.0, 5e-40, 1e-45, -1e-45, 2e-39])
    A = torch.cat([tiny.repeat(8), tiny[:5], torch.zeros(64 - 5 - 64 % 64), -tiny[:7]])
    check_blockwise(A, code, 64)
    for quant_type in QUANT_TYPES:
        check_4bit(A, 64, quant_type)


@pytest.mark.parametrize("shape", empty_shapes(), ids=str)
def test_4bit_empty(shape, dispatched):
    check_4bit(torch.empty(shape, dtype=torch.float16), 64, "fp4")
    assert dispatched == []


@pytest.mark.parametrize("blocksize", [32, 4096])
def test_many_threadgroups(code, blocksize):
    """Enough blocks for several threadgroups, and a last threadgroup with idle block slots."""
    A = randn((9 * blocksize + 3,), torch.bfloat16, seed_of("groups", blocksize))
    check_blockwise(A, code, blocksize)
    check_4bit(A, blocksize, "nf4")


# ------------------------------------------------------------------------------------------ matmul


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
    out = quant.gemv_4bit(*args)
    assert dispatched == [f"gemv_4bit_{dtype_id(dtype)}".replace(dtype_id(dtype), quant.suffix(dtype))]
    assert_matmul_close(out, REFERENCE["gemv_4bit"](*args), A, W64)
    assert_matmul_close(out, (A.double() @ W64.T).to(dtype), A, W64)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_gemv_misaligned_weight_view(dtype):
    """A weight whose bytes start at an odd offset cannot be read as words: the byte path (the sums come
    in another order, so the same values up to the matmul bound)."""
    N, K = 6, 128
    packed, absmax, W64 = quantized(N, K, 64, "nf4", seed=1)
    view = torch.cat([packed.new_zeros(1, 1), packed])[1:]  # contiguous, storage offset 1
    assert quant.gemv_reads_words(quant._bytes(packed), K) and not quant.gemv_reads_words(quant._bytes(view), K)
    A = rand((2, K), dtype, seed=2)
    out = quant.gemv_4bit(A, view, [N, K], absmax, code_of("nf4"), 64)
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
    assert_equal(quant.gemv_4bit(*args), REFERENCE["gemv_4bit"](*args), "gemv")


@pytest.mark.parametrize("rows", [1, 7])
@pytest.mark.parametrize("storage", [torch.uint8, torch.float16, torch.float32])
def test_gemv_out_and_quant_storage(rows, storage):
    N, K = 10, 64
    packed, absmax, W64 = quantized(N, K, 32, "fp4", seed=3, storage=storage)
    A = rand((rows, K), torch.bfloat16, seed=4)
    args = (A, packed, [N, K], absmax, code_of("fp4"), 32)
    out = quant.gemv_4bit(*args)
    assert_matmul_close(out, REFERENCE["gemv_4bit"](*args), A, W64)
    buf = torch.full((rows, N), float("nan"), dtype=torch.bfloat16)
    assert quant.gemv_4bit_out(*args, buf) is None
    assert torch.equal(buf, out)
    with pytest.raises(ValueError, match="out must be contiguous"):
        quant.gemv_4bit_out(*args, torch.empty((rows, 2 * N), dtype=torch.bfloat16)[:, ::2])


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
    sfx = quant.suffix(dtype)
    matmul = f"gemv_4bit_{sfx}" if rows <= quant.GEMM_FUSED_MAX_ROWS else f"dequantize_4bit_{quant_type}_{sfx}"
    return [*(["dequantize_blockwise_f32"] if nested else []), matmul]


@pytest.mark.parametrize("rows", [1, 2, quant.GEMM_FUSED_MAX_ROWS, quant.GEMM_FUSED_MAX_ROWS + 1, 11])
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
    out = quant.gemm_4bit(*args, **kwargs)
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
    out = quant.gemm_4bit(*args, **nested_kwargs)
    assert dispatched == gemm_kernels(1, True, dtype, quant_type)
    assert_equal(out, quant.gemv_4bit(A, packed, [N, K], expanded, code_of(quant_type), blocksize), "gemv")
    assert_matmul_close(out, REFERENCE["gemm_4bit"](*args, **nested_kwargs), A, W64)
    bias = rand((N,), dtype, seed=10)
    with_bias = quant.gemm_4bit(*args, bias=bias, **nested_kwargs)
    assert_matmul_close(with_bias, REFERENCE["gemm_4bit"](*args, bias=bias, **nested_kwargs), A, W64)
    if dtype == torch.float32:
        assert_equal(with_bias, out + bias, "gemm + bias")


def test_empty_dimensions(dispatched):
    packed, absmax, _ = quantized(4, 32, 32, "nf4", seed=10)
    code = code_of("nf4")
    assert quant.gemv_4bit(torch.empty(0, 32), packed, [4, 32], absmax, code, 32).shape == (0, 4)
    out = quant.gemm_4bit(torch.empty(2, 0), torch.empty(0, dtype=torch.uint8), [3, 0], torch.empty(0), 32, "nf4")
    assert torch.equal(out, torch.zeros(2, 3))
    bias = torch.randn(3)
    out = quant.gemm_4bit(torch.empty(2, 0), torch.empty(0, dtype=torch.uint8), [3, 0], torch.empty(0), 32, "nf4", bias)
    assert torch.equal(out, bias.expand(2, 3))
    assert dispatched == []


# ------------------------------------------------------------------------------------ errors, fallback


BYTES_4X32 = torch.zeros(64, 1, dtype=torch.uint8)  # a packed [4, 32] weight


@pytest.mark.parametrize(
    ("op", "args"),
    [
        ("quantize_blockwise", lambda c: (torch.zeros(8), c, 0)),  # any positive size is valid
        ("quantize_blockwise", lambda c: (torch.zeros(8, dtype=torch.int32), c, 64)),
        ("quantize_blockwise", lambda c: (torch.zeros(8), c[:100], 64)),
        ("dequantize_blockwise", lambda c: (torch.zeros(8, dtype=torch.uint8), torch.zeros(2), c, 64, torch.float32)),
        ("quantize_4bit", lambda c: (torch.zeros(8), 64, "nf5", torch.uint8)),
        ("dequantize_4bit", lambda c: (torch.zeros(2, dtype=torch.uint8), torch.zeros(1), 64, "fp4", [8], torch.half)),
        (
            "gemv_4bit",
            lambda c: (torch.zeros(1, 32), torch.zeros(8, 1, dtype=torch.uint8), [4, 32], torch.zeros(4), c[:8], 32),
        ),
        (
            "gemm_4bit",
            lambda c: (torch.zeros(1, 31), torch.zeros(64, 1, dtype=torch.uint8), [4, 32], torch.zeros(4), 32, "nf4"),
        ),
    ],
    ids=["blocksize", "A-dtype", "code-numel", "absmax-numel", "quant_type", "A-bytes", "gemv-code", "gemm-K"],
)
def test_errors_are_the_references(code, op, args):
    with pytest.raises((TypeError, ValueError)) as ref:
        REFERENCE[op](*args(code))
    with pytest.raises(type(ref.value), match=re.escape(str(ref.value))):
        quant.OPS[op](*args(code))


def test_missing_bfloat_kernels_fall_back_to_the_reference(monkeypatch, code, dispatched):
    """Where MSL < 3.1 the bf16 instances are absent: those ops run the reference, the others stay native."""
    real = quant.native
    monkeypatch.setattr(quant, "native", lambda name, threads=0: not name.endswith("_bf16") and real(name, threads))
    A = randn((2, 70), torch.bfloat16, seed_of("fallback"))
    check_blockwise(A, code, 64)
    check_4bit(A, 64, "nf4")
    packed, absmax, _ = quantized(3, 70, 64, "nf4", seed=1)
    out = quant.gemv_4bit(A, packed, [3, 70], absmax, code_of("nf4"), 64)
    assert_equal(out, REFERENCE["gemv_4bit"](A, packed, [3, 70], absmax, code_of("nf4"), 64), "gemv")
    assert dispatched == []
    check_blockwise(A.float(), code, 64)
    assert dispatched  # float32 still runs its kernels


def test_ops_table():
    assert set(quant.OPS) == {
        "quantize_blockwise", "dequantize_blockwise", "dequantize_blockwise.out", "quantize_4bit",
        "dequantize_4bit", "dequantize_4bit.out", "gemv_4bit", "gemv_4bit.out", "gemm_4bit",
    }  # fmt: skip
    assert quant.SOURCES == (table.SOURCE,)
