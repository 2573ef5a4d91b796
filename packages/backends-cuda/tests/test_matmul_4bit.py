"""The matmul_4bit family (gemv_4bit, gemv_4bit.out, gemm_4bit) run in the CUDA emulator vs the reference.

Bit-exact where the bytes are defined: the dequantized weight of the many-rows path (one fp32 product
``table[code] * absmax`` rounded once to the dtype) and the double-quantized block scales. The products
themselves within the conformance suite's stated tolerance (``bitsandbytes.testing.conformance.
test_fourbit``): fp32 accumulation in another order, and the fused kernel multiplies by the fp32 weight
rather than the weight rounded to A's dtype. Shapes are chosen to reach every kernel path: the 16-byte
path (K % 32 == 0) with one and two steps per lane, the 4-byte path (K % 8 == 0), the any-alignment
path (odd K, rows starting mid-byte, K % 8 != 0, a misaligned A or B), every tile of rows (1, 2, 4, 8,
and several tiles of 8 with a partial last one), scale blocks spanning rows or ending mid-row, N not a
multiple of the features per warp or block, and the dequantize + GEMM path above fused_max_rows.
fp16/bf16 A of 9..64 rows with K % 32 == 0 takes the tensor-core kernel instead (test_matmul_4bit_tc.py).
Double-quantized scales are decoded inside both kernels: bit for bit the scales the reference expands.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from bitsandbytes import _formats
from bitsandbytes._reference import REFERENCE
from bitsandbytes.testing.compare import matmul_tolerance
from bitsandbytes_cuda import launch
from bitsandbytes_cuda.ops import matmul_4bit as ops
from bitsandbytes_cuda.ops._common import suffix
from bitsandbytes_cuda.tables import matmul_4bit as table

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
QUANT_TYPES = ["nf4", "fp4"]


@pytest.fixture(autouse=True)
def launches(emulated, monkeypatch):
    """Every test runs in the emulator; this lists the kernels the op launched, in order."""
    names: list[str] = []
    real = ops.launch

    def recording(name, *args):
        names.append(name)
        return real(name, *args)

    monkeypatch.setattr(ops, "launch", recording)
    return names


def assert_matmul_close(out, ref, A, W):
    """Within the conformance suite's bound (see its module docstring), element by element."""
    assert out.dtype == ref.dtype == A.dtype and out.shape == ref.shape
    diff = (out.cpu().double() - ref.cpu().double()).abs()
    bound = matmul_tolerance(A.cpu(), W, ref.cpu())
    bad = diff > bound
    assert not bad.any(), f"{int(bad.sum())} elements off; worst {diff.max().item()} (bound there {bound[bad][0]})"


def quantized(N, K, blocksize, quant_type, seed, storage=torch.uint8):
    """(packed, absmax, the dequantized [N, K] weight in float64)."""
    g = torch.Generator().manual_seed(seed)
    W = torch.randn((N, K), generator=g)
    packed, absmax = REFERENCE["quantize_4bit"](W, blocksize, quant_type, storage)
    W64 = REFERENCE["dequantize_4bit"](packed, absmax, blocksize, quant_type, [N, K], torch.float32).double()
    return packed, absmax, W64


def code_of(quant_type):
    return _formats.code_table(quant_type, "cpu").float()


def rand(shape, dtype, seed):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


MAX_FUSED = ops.FUSED_MAX_ROWS_DEFAULT  # the emulator's tensors are on the CPU: the default applies


def tc_kernel(dtype, M, K):
    """The tensor-core kernel the op launches for these rows in emulation (tensor cores for fp16/bf16), else None."""
    if dtype == torch.float32 or not ops.TC_MIN_ROWS <= M <= max(ops.TC_MAX_ROWS_EMULATED) or K % 32:
        return None
    return f"gemm_4bit_tc_{suffix(dtype)}_m{next(r for r in table.TC_ROWS if M <= r)}"


# (A's shape, N, blocksize, the kernel expected: gemv_4bit_<dtype>_<path> / gemm)
GEMV_CASES = [
    ((1, 64), 7, 64, "v16_m1"),  # N % 8 != 0: a block with fewer warps, a warp with one feature
    ((1, 1088), 5, 64, "v16_m1"),  # 34 chunks of 32: lanes 0-1 take two steps
    ((1, 200), 9, 64, "v4_m1"),  # K % 32 != 0: 4-byte chunks, blocks of scales end mid-row
    ((1, 96), 3, 32, "v16_m1"),
    ((2, 40), 5, 64, "v4_m2"),
    ((3, 96), 9, 32, "v16_m4"),
    ((8, 160), 6, 4096, "v16_m8"),  # one block of scales spans every row
    ((5, 200), 3, 128, "v4_m8"),
    ((2, 1, 33), 5, 64, "any_m8"),  # odd K: every other row starts on a low nibble
    ((37,), 3, 32, "any_m1"),
    ((4, 204), 6, 128, "any_m8"),  # even K, K % 8 != 0
    ((12, 64), 4, 64, "v16_m8"),  # two tiles of 8 rows, the second partial
    ((3, 5, 72), 11, 32, "v4_m8"),  # 15 rows
    ((MAX_FUSED, 96), 9, 32, "v16_m8"),
    ((MAX_FUSED + 1, 64), 4, 64, "gemm"),
    ((3, 6, 72), 5, 32, "gemm"),
]


@pytest.mark.parametrize(("a_shape", "N", "blocksize", "path"), GEMV_CASES, ids=str)
@pytest.mark.parametrize("quant_type", QUANT_TYPES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gemv_4bit(launches, dtype, quant_type, a_shape, N, blocksize, path):
    K = a_shape[-1]
    packed, absmax, W64 = quantized(N, K, blocksize, quant_type, seed=N * K + blocksize)
    A = rand(a_shape, dtype, seed=K)
    args = (A, packed, [N, K], absmax, code_of(quant_type), blocksize)
    out = ops.gemv_4bit(*args)
    kernel = f"dequantize_4bit_weight_{suffix(dtype)}" if path == "gemm" else f"gemv_4bit_{suffix(dtype)}_{path}"
    assert launches == [tc_kernel(dtype, A.numel() // K, K) or kernel]
    assert_matmul_close(out, REFERENCE["gemv_4bit"](*args), A, W64)
    assert_matmul_close(out, (A.double() @ W64.T).to(dtype), A, W64)


@pytest.mark.parametrize(("which", "shift", "path"), [("A", 1, "any"), ("B", 1, "any"), ("B", 4, "v4")])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gemv_misaligned_view_takes_a_narrower_path(launches, dtype, which, shift, path):
    N, K = 6, 128
    packed, absmax, W64 = quantized(N, K, 64, "nf4", seed=1)
    A = rand((1, K), dtype, seed=2)
    if which == "A":
        A = torch.cat([A.new_zeros(shift), A.reshape(-1)])[shift:].view(1, K)  # contiguous, not 16-byte aligned
    else:
        packed = torch.cat([packed.new_zeros(shift, 1), packed])[shift:]  # contiguous, `shift` bytes past 16
    out = ops.gemv_4bit(A, packed, [N, K], absmax, code_of("nf4"), 64)
    assert launches == [f"gemv_4bit_{suffix(dtype)}_{path}_m1"]
    assert_matmul_close(out, (A.double() @ W64.T).to(dtype), A, W64)


def test_fused_rows_table():
    assert ops.fused_max_rows(torch.device("cpu")) == ops.FUSED_MAX_ROWS_DEFAULT
    assert all(8 <= rows <= 64 and rows % 8 == 0 for rows in ops.FUSED_MAX_ROWS.values())
    assert [ops.gemv_tile(m) for m in range(1, 11)] == [1, 2, 4, 4, 8, 8, 8, 8, 8, 8]


@pytest.mark.parametrize("rows", [1, 12])  # the one-row kernel and a tile of 16
@pytest.mark.parametrize("storage", [torch.float16, torch.float32])
def test_gemv_reads_any_quant_storage_as_its_bytes(rows, storage):
    """A weight stored as fp16/fp32 words is the same bytes as uint8: the same result, bit for bit, through
    the functional op and through .out."""
    N, K = 10, 64
    packed, absmax, W64 = quantized(N, K, 32, "fp4", seed=3, storage=storage)
    A = rand((rows, K), torch.bfloat16, seed=4)
    as_bytes = (A, packed.view(torch.uint8), [N, K], absmax, code_of("fp4"), 32)
    want = ops.gemv_4bit(*as_bytes)
    assert_matmul_close(want, REFERENCE["gemv_4bit"](*as_bytes), A, W64)
    args = (A, packed, [N, K], absmax, code_of("fp4"), 32)
    assert torch.equal(ops.gemv_4bit(*args), want)
    buf = torch.full((rows, N), float("nan"), dtype=torch.bfloat16)
    assert ops.gemv_4bit_out(*args, buf) is None
    assert torch.equal(buf, want)


def nested_state(absmax, seed):
    """(absmax_8bit, absmax2, code8, offset, the fp32 scales the reference expands them to)."""
    g = torch.Generator().manual_seed(seed)
    code8 = torch.sort(torch.rand(256, generator=g) * 2 - 1).values ** 3  # not a linspace: every bit counts
    offset = absmax.mean() + torch.rand((), generator=g) / 7
    absmax_8bit, absmax2 = REFERENCE["quantize_blockwise"](absmax - offset, code8, 256)
    effective = REFERENCE["dequantize_blockwise"](absmax_8bit, absmax2, code8, 256, torch.float32) + offset
    return absmax_8bit, absmax2, code8, offset.reshape(1), effective


# Each scale layout with and without a bias, on both sides of the fused kernel's row limit.
SCALES_AND_BIAS = [(nested, bias) for bias in (False, True) for nested in (False, True)]


@pytest.mark.parametrize("rows", [1, 2, 11, MAX_FUSED + 4])
@pytest.mark.parametrize(
    ("nested", "bias"),
    SCALES_AND_BIAS,
    ids=[f"{'nested' if n else 'plain'}-{'bias' if b else 'nobias'}" for n, b in SCALES_AND_BIAS],
)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gemm_4bit(launches, dtype, bias, nested, rows):
    N, K, blocksize = 13, 96, 32
    A = rand((rows, K), dtype, seed=6)
    packed, absmax, W64 = quantized(N, K, blocksize, "nf4", seed=5)
    kwargs = {"bias": rand((N,), dtype, seed=7)} if bias else {}
    if nested:
        absmax_8bit, absmax2, code8, offset, effective = nested_state(absmax, seed=rows)
        kwargs |= {"absmax_8bit": absmax_8bit, "absmax_code": code8, "absmax_offset": offset}
        W64 = REFERENCE["dequantize_4bit"](packed, effective, blocksize, "nf4", [N, K], torch.float32).double()
        absmax = absmax2
    args = (A, packed, [N, K], absmax, blocksize, "nf4")
    out = ops.gemm_4bit(*args, **kwargs)
    # One kernel whatever the scales: the nested ones are decoded inside it.
    first = tc_kernel(dtype, rows, K) or ("gemv_4bit" if rows <= MAX_FUSED else "dequantize")
    assert len(launches) == 1 and launches[0].startswith(first)
    assert_matmul_close(out, REFERENCE["gemm_4bit"](*args, **kwargs), A, W64)
    truth = A.double() @ W64.T + (kwargs["bias"].double() if bias else 0)
    assert_matmul_close(out, truth.to(dtype), A, W64)


@pytest.mark.parametrize("rows", [1, 3, 8, MAX_FUSED + 1])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_nested_scales_are_the_references_bit_for_bit(dtype, rows):
    """The fused decode of nested scales gives exactly the product of the plain kernel given the scales the
    reference expands (same kernel, same order: any other rounding of a scale shows), and the dequantized
    weight is the reference's bit for bit. 1200 scales: five blocks of 256, the last partial."""
    N, K, blocksize = 25, 1536, 32
    packed, absmax, _ = quantized(N, K, blocksize, "fp4", seed=12)
    absmax_8bit, absmax2, code8, offset, effective = nested_state(absmax, seed=13)
    A = rand((rows, K), dtype, seed=14)
    nested = {"absmax_8bit": absmax_8bit, "absmax_code": code8, "absmax_offset": offset}
    got = ops.gemm_4bit(A, packed, [N, K], absmax2, blocksize, "fp4", **nested)
    assert torch.equal(got, ops.gemm_4bit(A, packed, [N, K], effective, blocksize, "fp4"))
    scales = ops._scales(absmax2, absmax_8bit, code8, offset)
    W = ops.dequantize_weight(ops._bytes(packed), N, K, scales, code_of("fp4"), blocksize, dtype)
    assert torch.equal(W, REFERENCE["dequantize_4bit"](packed, effective, blocksize, "fp4", [N, K], dtype))


@pytest.mark.parametrize(("N", "K", "blocksize"), [(3, 37, 32), (16, 64, 64), (5, 300, 1024)], ids=str)
@pytest.mark.parametrize("quant_type", QUANT_TYPES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dequantized_weight_bit_exact(dtype, quant_type, N, K, blocksize):
    packed, absmax, _ = quantized(N, K, blocksize, quant_type, seed=9)
    W = ops.dequantize_weight(ops._bytes(packed), N, K, ops._scales(absmax), code_of(quant_type), blocksize, dtype)
    assert torch.equal(W, REFERENCE["dequantize_4bit"](packed, absmax, blocksize, quant_type, [N, K], dtype))


@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
def test_empty_dimensions_launch_nothing(launches, bias):
    """No rows: an empty result. K = 0: every entry an empty sum, so the bias or zero. Neither launches."""
    packed, absmax, _ = quantized(4, 32, 32, "nf4", seed=10)
    assert ops.gemv_4bit(torch.empty(0, 32), packed, [4, 32], absmax, code_of("nf4"), 32).shape == (0, 4)
    b = torch.randn(3) if bias else None
    no_k = (torch.empty(2, 0), torch.empty(0, dtype=torch.uint8), [3, 0], torch.empty(0), 32, "nf4", b)
    assert torch.equal(ops.gemm_4bit(*no_k), b.expand(2, 3) if bias else torch.zeros(2, 3))
    assert launches == []


def test_errors_are_the_references():
    packed, absmax, _ = quantized(4, 32, 32, "nf4", seed=11)
    A = torch.randn(1, 32)
    with pytest.raises(ValueError, match="code must have 16 elements"):
        ops.gemv_4bit(A, packed, [4, 32], absmax, torch.zeros(8), 32)
    with pytest.raises(ValueError, match="A's last dimension"):
        ops.gemm_4bit(torch.randn(1, 31), packed, [4, 32], absmax, 32, "nf4")
    with pytest.raises(TypeError, match="bias"):
        ops.gemm_4bit(A, packed, [4, 32], absmax, 32, "nf4", bias=torch.zeros(4, dtype=torch.float16))


def test_geometry_constants_match_the_kernel_source():
    src = (launch.kernel_dir() / "kernels" / table.SOURCE).read_text()
    assert re.search(rf"kGemvWarps = {table.GEMV_WARPS};", src)
    limit, at_many, at_few = map(int, re.search(r"kGemvWarpFeatures = MR >= (\d+) \? (\d+) : (\d+);", src).groups())
    assert table.GEMV_WARP_FEATURES == {mr: at_many if mr >= limit else at_few for mr in (1, 2, 4, 8)}
    assert re.search(rf"kDequantPerThread = {table.DEQUANT_PER_THREAD};", src)


def test_nvcc_compiles_every_table_entry(tmp_path):
    """Every kernel of the table instantiates under nvcc for sm_80, without register spills."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("needs the CUDA compiler nvcc")
    import bitsandbytes

    csrc = launch.kernel_dir()
    refs = ",\n".join(f"    reinterpret_cast<const void*>(&{k.expr})" for k in table.KERNELS)
    unit = tmp_path / "instantiate.cu"
    unit.write_text(
        f'#include "kernels/{table.SOURCE}"\n\nconst void* const bnb_kernels[] = {{\n{refs}\n}};\n', encoding="utf-8"
    )
    cmd = [nvcc, "-arch=sm_80", "-std=c++17", "-Xptxas", "-v", "-I", str(csrc), "-I", bitsandbytes.get_include()]
    res = subprocess.run([*cmd, "-c", str(unit), "-o", str(tmp_path / "k.o")], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    spills = [int(s) for s in re.findall(r"(\d+) bytes spill stores", res.stderr)]
    assert len(spills) == len(table.KERNELS) and not any(spills), res.stderr
    assert Path(tmp_path / "k.o").stat().st_size > 0


def test_k_beyond_the_fused_kernels_offsets_is_refused(monkeypatch):
    packed, absmax, _ = quantized(4, 64, 32, "nf4", seed=15)
    monkeypatch.setattr(ops, "MAX_FUSED_K", 32)  # a 2**31-element row is beyond the emulator's memory
    with pytest.raises(ValueError, match="K=64 exceeds 32"):
        ops.gemv_4bit(torch.randn(1, 64), packed, [4, 64], absmax, code_of("nf4"), 32)
