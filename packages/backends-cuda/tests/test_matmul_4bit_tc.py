"""The tensor-core route of gemm_4bit / gemv_4bit (``gemm_4bit_tc``, 9..64 rows of fp16/bf16 A) in the
emulator (its <mma.h> runs the WMMA calls as warp collectives) against the reference, and the routing.

The bound, and why it is tight: the kernel multiplies by exactly the reference's weight rounded to A's
dtype (the reference's ``_linear``), the products of two 16-bit values are exact in fp32, and both sum
them in fp32, so the two fp32 results differ only by summation order: each is within
``K * 2^-24 * sum|a * w|`` of the exact sum (+ the bias, one more rounding). Both then round once to the
dtype: at most one unit in the last place apart beyond that. A kernel that used another weight (the fp32
one, or a wrong scale or nibble) or dropped a row, chunk or split breaks it at once.
"""

from __future__ import annotations

import pytest
import torch
from test_matmul_4bit import assert_matmul_close, code_of, nested_state, quantized, rand

from bitsandbytes._reference import REFERENCE
from bitsandbytes_cuda.ops import matmul_4bit as ops
from bitsandbytes_cuda.ops._common import suffix
from bitsandbytes_cuda.tables import matmul_4bit as table

HALF_TYPES = [torch.float16, torch.bfloat16]
EPS = {torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}  # one unit in the last place, relative


@pytest.fixture(autouse=True)
def launches(emulated, monkeypatch):
    names: list[str] = []
    real = ops.launch

    def recording(name, *args):
        names.append(name)
        return real(name, *args)

    monkeypatch.setattr(ops, "launch", recording)
    ops._DEVICES.clear()
    yield names
    ops._DEVICES.clear()


def assert_close_to_reference(out, ref, A, Wt, bias):
    """``Wt``: the weight rounded to A's dtype, as float64 (what both multiply by)."""
    assert out.dtype == ref.dtype == A.dtype and out.shape == ref.shape
    A2 = A.reshape(-1, A.shape[-1]).double()
    mag = A2.abs() @ Wt.abs().T + (bias.double().abs() if bias is not None else 0.0)
    K = A.shape[-1]
    bound = 2 * (K + 1) * 2.0**-24 * mag + EPS[A.dtype] * ref.reshape(mag.shape).double().abs()
    diff = (out.double() - ref.double()).reshape(mag.shape).abs()
    bad = diff > bound
    assert not bad.any(), f"{int(bad.sum())} of {bad.numel()} off; worst {diff.max().item()}"


def tc_name(dtype, M):
    return f"gemm_4bit_tc_{suffix(dtype)}_m{next(r for r in table.TC_ROWS if M <= r)}"


def run_gemm(dtype, quant_type, M, N, K, blocksize, *, nested, bias, seed, tight=True):
    """The op vs the reference: the bound above (``tight``, the tensor-core kernel) or the conformance
    suite's (the SIMT kernel multiplies by the fp32 weight; the dense path is torch's product)."""
    packed, absmax, W64 = quantized(N, K, blocksize, quant_type, seed=seed)
    A = rand((M, K), dtype, seed=seed + 1)
    kwargs = {"bias": rand((N,), dtype, seed=seed + 2)} if bias else {}
    if nested:
        absmax_8bit, absmax2, code8, offset, effective = nested_state(absmax, seed=seed + 3)
        kwargs |= {"absmax_8bit": absmax_8bit, "absmax_code": code8, "absmax_offset": offset}
        W64 = REFERENCE["dequantize_4bit"](packed, effective, blocksize, quant_type, [N, K], torch.float32).double()
        absmax = absmax2
    args = (A, packed, [N, K], absmax, blocksize, quant_type)
    out = ops.gemm_4bit(*args, **kwargs)
    ref = REFERENCE["gemm_4bit"](*args, **kwargs)
    if tight:
        assert_close_to_reference(out, ref, A, W64.to(dtype).double(), kwargs.get("bias"))
    else:
        assert_matmul_close(out, ref, A, W64)
    return out


# Rows across every tile and both edges of the route: 8 (SIMT), 9, 16/17, 32/33, 64 (tensor cores), 65 (dense).
@pytest.mark.parametrize("M", [8, 9, 16, 17, 32, 33, 64, 65])
@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
@pytest.mark.parametrize("dtype", HALF_TYPES, ids=str)
def test_rows_take_the_tensor_core_kernel_between_9_and_64(launches, dtype, quant_type, M):
    # N = 70: a second block of features with 6 live ones; K = 96: one and a half chunks of 64.
    tc = 9 <= M <= 64
    run_gemm(dtype, quant_type, M, 70, 96, 64, nested=M % 2 == 1, bias=M % 4 < 2, seed=M, tight=tc)
    if M <= 8:
        assert launches == [f"gemv_4bit_{suffix(dtype)}_v16_m8"]
    elif M <= 64:
        assert launches == [tc_name(dtype, M)]
    else:
        assert launches == [f"dequantize_4bit_weight_{suffix(dtype)}"]


@pytest.mark.parametrize(
    ("N", "K", "blocksize"),
    [(13, 32, 32), (64, 64, 64), (130, 224, 128), (20, 320, 4096)],  # N < / = / > one block; K: half to 5 chunks
    ids=str,
)
@pytest.mark.parametrize("nested", [False, True], ids=["plain", "nested"])
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("dtype", HALF_TYPES, ids=str)
def test_shapes_scales_and_bias(launches, dtype, bias, nested, N, K, blocksize):
    run_gemm(dtype, "nf4", 24, N, K, blocksize, nested=nested, bias=bias, seed=N + K)
    assert launches == [tc_name(dtype, 24)]


@pytest.mark.parametrize("splits", [2, 3])
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("dtype", HALF_TYPES, ids=str)
def test_split_k_adds_fp32_partials_in_order(launches, monkeypatch, dtype, bias, splits):
    chunks_per_split = -(-5 // splits)  # K = 320: 5 chunks
    monkeypatch.setattr(ops, "tc_splits", lambda *a: (-(-5 // chunks_per_split), chunks_per_split))
    out = run_gemm(dtype, "fp4", 40, 70, 320, 64, nested=True, bias=bias, seed=3)
    assert launches == [tc_name(dtype, 40), f"gemm_4bit_tc_reduce_{suffix(dtype)}"]
    launches.clear()
    again = run_gemm(dtype, "fp4", 40, 70, 320, 64, nested=True, bias=bias, seed=3)
    assert torch.equal(out, again)  # a fixed order: the same bits every run


def test_tc_splits_fill_the_device_within_the_workspace_bound():
    # 4096 x 4096, 64 rows, 132 SMs: 64 blocks of features, 64 chunks; partials capped by K / (16 M) = 4.
    assert ops.tc_splits(64, 64, 64, 4096, 132) == (4, 16)
    # 16 rows: the cap is 16; 4 blocks per SM want ceil(528 / 64) = 9 splits of 64 chunks: 8 per split.
    assert ops.tc_splits(64, 64, 16, 4096, 132) == (8, 8)
    # Enough blocks of features already (14336 / 64 = 224 on 56 SMs): no split.
    assert ops.tc_splits(224, 64, 16, 4096, 56) == (1, 64)
    # Never more splits than chunks, never an empty split.
    for groups, chunks, M, K, sms in [(1, 3, 9, 4096, 132), (2, 7, 9, 448, 200), (1, 1, 64, 64, 1)]:
        splits, per = ops.tc_splits(groups, chunks, M, K, sms)
        assert 1 <= splits <= chunks and (splits - 1) * per < chunks <= splits * per


# Which kernel a device runs for 12 and 40 rows of each dtype, by compute capability, for a weight of one
# block of features on one SM (the emulator's EMULATED_SMS): one wave, TC_MAX_ROWS's third column; past
# it, the SIMT kernel up to FUSED_MAX_ROWS, then dense.
ROUTES = {
    (7, 5): {torch.float16: ("tc", "tc"), torch.bfloat16: ("gemv", "dense"), torch.float32: ("gemv", "dense")},
    (8, 0): {torch.float16: ("tc", "dense"), torch.bfloat16: ("tc", "dense"), torch.float32: ("gemv", "dense")},
    (9, 0): {torch.float16: ("tc", "dense"), torch.bfloat16: ("tc", "dense"), torch.float32: ("gemv", "dense")},
    (10, 0): {torch.float16: ("gemv", "dense"), torch.bfloat16: ("gemv", "dense"), torch.float32: ("gemv", "dense")},
    (12, 0): {torch.float16: ("tc", "tc"), torch.bfloat16: ("tc", "tc"), torch.float32: ("gemv", "gemv")},
    (6, 1): {torch.float16: ("gemv", "dense"), torch.bfloat16: ("gemv", "dense"), torch.float32: ("gemv", "dense")},
}


@pytest.mark.parametrize("cap", list(ROUTES), ids=str)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_the_route_follows_the_devices_tensor_cores(launches, monkeypatch, cap, dtype):
    monkeypatch.setattr(ops, "EMULATED_CAPABILITY", cap)
    N, K = 8, 64
    packed, absmax, _ = quantized(N, K, 64, "nf4", seed=1)
    for M, want in zip((12, 40), ROUTES[cap][dtype], strict=True):
        launches.clear()
        A = rand((M, K), dtype, seed=M)
        out = ops.gemm_4bit(A, packed, [N, K], absmax, 64, "nf4")
        assert ops.matmul_route(A, packed, M, N, K) == want
        kernel = {
            "tc": tc_name(dtype, M) if dtype != torch.float32 else None,
            "gemv": f"gemv_4bit_{suffix(dtype)}_v16_m8",
            "dense": f"dequantize_4bit_weight_{suffix(dtype)}",
        }[want]
        assert launches == [kernel], (cap, dtype, M)
        ref = REFERENCE["gemm_4bit"](A, packed, [N, K], absmax, 64, "nf4")
        assert (out.double() - ref.double()).abs().max() <= 0.05 * ref.double().abs().max()


@pytest.mark.parametrize("dtype", HALF_TYPES, ids=str)
def test_what_the_tensor_core_kernel_cannot_load_stays_on_the_simt_kernel(launches, dtype):
    N = 6
    # K % 32 != 0: the 4-byte SIMT path.
    packed, absmax, _ = quantized(N, 72, 32, "nf4", seed=2)
    ops.gemv_4bit(rand((12, 72), dtype, seed=3), packed, [N, 72], absmax, code_of("nf4"), 32)
    assert launches == [f"gemv_4bit_{suffix(dtype)}_v4_m8"]
    # A one element past 16-byte alignment: the any-alignment SIMT path.
    launches.clear()
    packed, absmax, _ = quantized(N, 64, 64, "nf4", seed=4)
    A = rand((12 * 64 + 1,), dtype, seed=5)[1:].view(12, 64)
    ops.gemv_4bit(A, packed, [N, 64], absmax, code_of("nf4"), 64)
    assert launches == [f"gemv_4bit_{suffix(dtype)}_any_m8"]


def test_gemv_4bit_op_uses_it_too(launches):
    N, K = 70, 128
    packed, absmax, W64 = quantized(N, K, 64, "fp4", seed=6)
    A = rand((3, 7, K), torch.bfloat16, seed=7)  # 21 rows over two batch dimensions
    args = (A, packed, [N, K], absmax, code_of("fp4"), 64)
    out = ops.gemv_4bit(*args)
    assert launches == ["gemm_4bit_tc_bf16_m32"]
    assert_close_to_reference(out, REFERENCE["gemv_4bit"](*args), A, W64.to(torch.bfloat16).double(), None)
    buf = torch.empty_like(out)
    ops.gemv_4bit_out(*args, buf)
    assert torch.equal(buf, out)


def test_geometry_constants_match_the_kernel_source():
    from bitsandbytes_cuda import launch

    src = (launch.kernel_dir() / "kernels" / table.SOURCE).read_text()
    for const, value in [
        ("kTcWarps", table.TC_WARPS),
        ("kTcChunk", table.TC_CHUNK),
        ("kTcReduceThreads", table.TC_REDUCE_THREADS),
    ]:
        assert f"constexpr int {const} = {value};" in src
    assert "constexpr int kTcFeatures = 16 * kTcWarps;" in src and table.TC_FEATURES == 16 * table.TC_WARPS


def test_tensor_core_rows_follow_the_blocks_per_sm(monkeypatch):
    monkeypatch.setattr(ops, "EMULATED_CAPABILITY", (9, 0))
    cpu = torch.device("cpu")
    for sms, N, rows in [
        (132, 4096, 0),  # 64 blocks on 132 SMs: < 1/2 wave
        (132, 8192, 16),  # 128 blocks: >= 1/2
        (132, 14336, 32),  # 224: >= 1
        (132, 19200, 48),  # 300: >= 2, not 3
        (132, 25344, 64),  # 396: 3 waves
        (132, 25280, 48),  # 395: just under
    ]:
        ops._DEVICES.clear()
        monkeypatch.setattr(ops, "EMULATED_SMS", sms)
        assert ops.tc_max_rows(cpu, torch.bfloat16, N) == rows, (sms, N)
    ops._DEVICES.clear()
    monkeypatch.setattr(ops, "EMULATED_CAPABILITY", (7, 5))
    assert ops.tc_max_rows(cpu, torch.bfloat16, 1 << 20) == 0  # no bf16 WMMA on sm_75
    assert ops.tc_max_rows(cpu, torch.float32, 1 << 20) == 0  # fp32 never
    assert ops.tc_max_rows(cpu, torch.float16, 64) == 32  # one block on 132 SMs: sm_75's last column
    monkeypatch.setattr(ops, "EMULATED_CAPABILITY", None)
    ops._DEVICES.clear()
    assert ops.tc_max_rows(cpu, torch.float16, 64) == 64  # the emulator: everything the kernel serves
    assert all(len(v) == len(ops.TC_WAVES) and max(v) <= 64 for v in ops.TC_MAX_ROWS.values())
