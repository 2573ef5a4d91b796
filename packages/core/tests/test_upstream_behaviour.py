"""Calls upstream bitsandbytes 0.50 accepts, with the results it gives (issue 15, parts 3 and 4).

Each test names the upstream test or source the behaviour comes from; the expected values are
computed here from first principles or from another route through our own API, never hard-coded.
"""

import math

import pytest
import torch

import bitsandbytes as bnb
import bitsandbytes.functional as F
from bitsandbytes.autograd import MatmulLtState


def randn(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


# --- bnb.matmul with a frozen int8 weight in the state (upstream tests/test_autograd.py test_matmullt)
# Both of upstream's CPU routes: a training state (the default) takes MatMul8bitFp, an evaluation one LLM.int8().
TRAINING = pytest.mark.parametrize("training", [True, False], ids=["float-route", "int8-route"])


def frozen_state(W, threshold, training=True):
    CB, SCB, _ = F.int8_vectorwise_quant(W.half())
    return MatmulLtState(has_fp16_weights=False, CB=CB, SCB=SCB, threshold=threshold, is_training=training)


@TRAINING
@pytest.mark.parametrize("threshold", [0.0, 6.0])
@pytest.mark.parametrize("has_bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("rows", [0, 40], ids=["empty", "rows"])
def test_matmul_takes_the_weight_from_state_cb(threshold, has_bias, rows, training):
    K, N = 32, 48
    A, W = randn(rows, K, dtype=torch.float16), randn(N, K, seed=1)
    if rows:
        A[:, [3, 9]] = 7.0  # outlier columns for threshold 6
    bias = randn(N, seed=2, dtype=torch.float16) if has_bias else None
    state = frozen_state(W, threshold, training)
    as_rows = bnb.matmul(A, state.CB, state=frozen_state(W, threshold, training), bias=bias)
    # Upstream's test passes the [K, N] view CB.t() here; the weight still comes from state.CB.
    as_view = bnb.matmul(A, state.CB.t(), state=state, bias=bias)
    assert as_view.shape == (rows, N) and as_view.dtype == A.dtype
    assert torch.equal(as_view, as_rows)
    if rows:
        dense = A.double() @ W.double().T + (0 if bias is None else bias.double())
        assert ((as_view.double() - dense).norm() / dense.norm()).item() < 0.02


@TRAINING
def test_matmul_state_cb_view_gives_the_input_gradient(training):
    A, W = randn(6, 32, dtype=torch.float16).requires_grad_(), randn(48, 32, seed=1)
    state = frozen_state(W, 0.0, training)
    bnb.matmul(A, state.CB.t(), state=state).float().sum().backward()
    weight = state.CB.to(torch.float16) * (state.SCB.unsqueeze(1) / 127).to(torch.float16)
    torch.testing.assert_close(A.grad, torch.ones(6, 48, dtype=torch.float16) @ weight, rtol=2e-3, atol=2e-3)


@TRAINING
def test_matmul_state_cb_refuses_a_b_of_another_shape(training):
    state = frozen_state(randn(48, 32), 0.0, training)
    with pytest.raises(ValueError, match=r"B must be state\.CB's shape \(48, 32\) or its transpose"):
        bnb.matmul(randn(4, 32), torch.zeros(32, 47, dtype=torch.int8), state=state)
    with pytest.raises(ValueError, match=r"A's last dimension must equal state\.CB\.shape\[1\] \(32\)"):
        bnb.matmul(randn(4, 48), state.CB.t(), state=state)


# --- 8-bit blockwise with any positive block size (upstream backends/cpu/ops.py, test_blockwise_cpu_large)


@pytest.mark.parametrize("blocksize", [16384, 65536, 8192, 100, 48])
def test_blockwise_takes_any_positive_blocksize(blocksize):
    A = randn(4, 8192 + 5)  # a partial last block for every size
    C, S = F.quantize_blockwise(A, blocksize=blocksize)
    n_blocks = -(A.numel() // -blocksize)
    assert S.blocksize == blocksize and S.absmax.shape == (n_blocks,)
    flat = A.reshape(-1)
    expected_absmax = torch.stack([flat[i : i + blocksize].abs().max() for i in range(0, flat.numel(), blocksize)])
    assert torch.equal(S.absmax, expected_absmax)
    A2 = F.dequantize_blockwise(C, S)
    assert torch.equal(A2, F.dequantize_blockwise(C, absmax=S.absmax, blocksize=blocksize))
    # Upstream's bound for the dynamic map (test_blockwise_cpu_large).
    assert (A - A2).abs().mean().item() < 0.011


@pytest.mark.parametrize("blocksize", [0, -64, 64.0, True])
def test_blockwise_refuses_a_blocksize_that_is_not_a_positive_int(blocksize):
    with pytest.raises(ValueError, match="blocksize must be a positive int"):
        F.quantize_blockwise(randn(64), blocksize=blocksize)


# --- the "few bit" maps (upstream tests/test_functional.py test_few_bit_quant)


def few_bit_map(method, bits):
    if method == "linear":
        return F.create_linear_map(True, total_bits=bits)
    if method == "fp8":
        ebits = math.ceil(bits / 2)
        return F.create_fp8_map(True, ebits, bits - ebits - 1, bits)
    return F.create_dynamic_map(True, bits, bits)


@pytest.mark.parametrize("bits", range(2, 9))
@pytest.mark.parametrize("method", ["linear", "fp8", "dynamic"])
def test_few_bit_maps(method, bits):
    code = few_bit_map(method, bits)
    assert code.numel() == 256 and code.dtype == torch.float32
    assert torch.unique(code).numel() in (2**bits, 2**bits - 1)
    assert code.abs().max() == 1.0
    # Blockwise quantization with the map picks a nearest entry for every value.
    values = randn(1, 32, seed=bits)
    values = values / values.abs().max()
    C, S = F.quantize_blockwise(values, code=code, blocksize=32)
    dist = (values.reshape(-1, 1).double() - code.double()).abs()
    chosen = dist.gather(1, C.reshape(-1, 1).long())
    assert torch.all(chosen <= dist.min(dim=1, keepdim=True).values + 1e-7)
    assert torch.equal(F.dequantize_blockwise(C, S), code[C.long()] * S.absmax)


def test_dynamic_map_with_as_many_exponent_bits_as_bits():
    """max_exponent_bits=8: exponent 1e-7 gets no fraction step, 1e-6 one, ..., 1e0 sixty-four."""
    code = F.create_dynamic_map(max_exponent_bits=8)
    positive = code[code > 0]
    assert code.numel() == 256 and positive.numel() == 128 and (code < 0).sum() == 127
    assert positive.min().item() == pytest.approx(0.55e-6, rel=1e-6)  # the single step of 1e-6
    for exponent, steps in zip(range(-6, 1), (1, 2, 4, 8, 16, 32, 64), strict=True):
        level = positive[(positive >= 0.1 * 10.0**exponent) & (positive < 10.0**exponent)]
        assert level.numel() == steps, exponent


# --- gemm_4bit with a half-precision absmax_offset (upstream casts it to float32)


@pytest.mark.parametrize("offset_dtype", [torch.float16, torch.bfloat16])
def test_gemm_4bit_takes_a_half_precision_offset(offset_dtype):
    q, qs = F.quantize_4bit(randn(16, 64), compress_statistics=True)
    A = randn(3, 64)
    offset = qs.offset.reshape(1).to(offset_dtype)

    def gemm(absmax_offset):
        return torch.ops.bitsandbytes.gemm_4bit(
            A, q, list(qs.shape), qs.state2.absmax, qs.blocksize, qs.quant_type,
            absmax_8bit=qs.absmax, absmax_code=qs.state2.code, absmax_offset=absmax_offset,
        )  # fmt: skip

    assert torch.equal(gemm(offset), gemm(offset.float()))
    with pytest.raises(TypeError, match="absmax_offset"):
        gemm(offset.to(torch.int32))


# --- top-level names (upstream's __init__ imports nn.modules and optim.adam)


def test_top_level_modules_and_adam():
    assert bnb.modules is bnb.nn.modules and bnb.modules.Linear8bitLt is bnb.nn.Linear8bitLt
    assert bnb.adam is bnb.optim.adam and bnb.adam.Adam8bit is bnb.optim.Adam8bit


# --- bad input found on the way (issue 15 part 4)


def test_dequantize_4bit_refuses_more_bytes_than_the_shape_needs():
    W = randn(16, 64)
    q, qs = F.quantize_4bit(W)
    assert torch.equal(F.dequantize_4bit(q, qs), F.dequantize_4bit(q.clone(), qs))  # the exact count loads
    # The float values themselves where the packed codes belong: 4096 bytes for 1024 values.
    with pytest.raises(
        ValueError, match=r"\bA holds 4096 bytes of packed 4-bit codes; shape \[16, 64\] needs exactly 512"
    ):
        F.dequantize_4bit(W, qs)
    with pytest.raises(ValueError, match="needs exactly 512"):
        F.dequantize_4bit(torch.cat([q, q[:1]]), qs)


@pytest.mark.parametrize("op", ["gemv_4bit", "gemm_4bit"])
def test_4bit_matmuls_refuse_more_bytes_than_shape_b_needs(op):
    # Upstream's default kernels dequantize every byte and keep the first N * K values, so a larger B
    # (the float weight itself, another layer's codes) multiplies as garbage; ours refuses, as dequantize_4bit.
    W = randn(16, 64)
    q, qs = F.quantize_4bit(W, blocksize=64)

    def run(B):
        if op == "gemv_4bit":
            return torch.ops.bitsandbytes.gemv_4bit(randn(1, 64, seed=3), B, [16, 64], qs.absmax, qs.code, 64)
        return torch.ops.bitsandbytes.gemm_4bit(randn(2, 64, seed=3), B, [16, 64], qs.absmax, 64, qs.quant_type)

    assert torch.equal(run(q), run(q.t()))  # the packed weight and its [1, bytes] view: 512 bytes each
    with pytest.raises(
        ValueError, match=r"\bB holds 4096 bytes of packed 4-bit codes; shapeB \[16, 64\] needs exactly 512"
    ):
        run(W)
    with pytest.raises(ValueError, match=r"\bB holds 513 bytes .* needs exactly 512"):
        run(torch.cat([q, q[:1]]))
    with pytest.raises(ValueError, match=r"\bB holds 511 bytes .* needs exactly 512"):
        run(q[:-1])
