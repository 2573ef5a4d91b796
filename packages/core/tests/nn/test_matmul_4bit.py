"""matmul_4bit / MatMul4Bit: products and gradients against dense math on the dequantized weight."""

import pytest
import torch

import bitsandbytes as bnb
import bitsandbytes.functional as F
from bitsandbytes.autograd._functions import MatMul4Bit, matmul_4bit
from bitsandbytes.autograd._matmul_4bit import linear_4bit
from bitsandbytes.diagnostics.op_trace import trace_ops

N, K = 24, 64
TOL = {torch.float32: 1e-5, torch.bfloat16: 3e-2, torch.float16: 5e-3}


def gen(seed):
    return torch.Generator().manual_seed(seed)


def weight(quant_type="nf4", nested=False, storage=torch.uint8, dtype=torch.float32, shape=(N, K)):
    w = torch.randn(shape, generator=gen(0)).to(dtype)
    packed, qs = F.quantize_4bit(w, quant_type=quant_type, compress_statistics=nested, quant_storage=storage)
    return packed, qs, F.dequantize_4bit(packed, qs)


@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
@pytest.mark.parametrize("nested", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(1, K), (1, 1, K), (6, K), (2, 3, K)], ids=["row", "row3d", "rows", "3d"])
def test_product_matches_dequantize_then_linear(quant_type, nested, dtype, shape):
    packed, qs, W = weight(quant_type, nested, dtype=dtype)
    A = torch.randn(shape, generator=gen(1)).to(dtype)
    bias = torch.randn(N, generator=gen(2)).to(dtype)
    ref = torch.nn.functional.linear(A.float(), W.float(), bias.float())
    out = matmul_4bit(A, packed, qs, bias=bias)
    assert out.dtype == dtype and out.shape == (*shape[:-1], N)
    torch.testing.assert_close(out.float(), ref, rtol=TOL[dtype], atol=TOL[dtype])
    torch.testing.assert_close(matmul_4bit(A, packed, qs).float(), ref - bias.float(), rtol=TOL[dtype], atol=TOL[dtype])


def test_weight_view_and_storage_do_not_matter():
    packed, qs, _ = weight("fp4", True)
    bf, _, _ = weight("fp4", True, storage=torch.bfloat16)
    A = torch.randn(3, K, generator=gen(3))
    out = matmul_4bit(A, packed, qs)
    assert torch.equal(matmul_4bit(A, packed.t(), qs), out)
    assert torch.equal(matmul_4bit(A, bf, qs), out)
    assert torch.equal(bnb.matmul_4bit(A, packed, quant_state=qs), out)


def test_single_row_without_grad_takes_the_gemv_path(monkeypatch):
    packed, qs, _ = weight()
    calls = []
    real = F.gemv_4bit
    monkeypatch.setattr(F, "gemv_4bit", lambda *a, **k: calls.append(1) or real(*a, **k))
    matmul_4bit(torch.randn(1, 1, K), packed, qs)
    assert calls == [1]
    matmul_4bit(torch.randn(2, K), packed, qs)
    matmul_4bit(torch.randn(1, K, requires_grad=True), packed, qs)
    assert calls == [1]


def test_out_argument():
    packed, qs, W = weight()
    A = torch.randn(4, K, generator=gen(4))
    for grad in (False, True):
        out = torch.empty(4, N)
        res = matmul_4bit(A.clone().requires_grad_(grad), packed, qs, out=out)
        assert res is out
        torch.testing.assert_close(out, A @ W.t(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(5, K), (2, 3, K)], ids=["2d", "3d"])
@pytest.mark.parametrize("nested", [False, True])
def test_gradients_match_dense(shape, nested):
    packed, qs, W = weight("nf4", nested)
    A = torch.randn(shape, generator=gen(5), requires_grad=True)
    bias = torch.randn(N, generator=gen(6), requires_grad=True)
    g = torch.randn((*shape[:-1], N), generator=gen(7))
    out = matmul_4bit(A, packed, qs, bias=bias)
    assert out.grad_fn is not None and "MatMul4Bit" in type(out.grad_fn).__name__
    out.backward(g)
    torch.testing.assert_close(A.grad, g @ W, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(bias.grad, g.reshape(-1, N).sum(0), rtol=1e-5, atol=1e-5)


def test_only_bias_requires_grad():
    packed, qs, _ = weight()
    A = torch.randn(3, K, generator=gen(8))
    bias = torch.zeros(N, requires_grad=True)
    matmul_4bit(A, packed, qs, bias=bias).sum().backward()
    assert torch.equal(bias.grad, torch.full((N,), 3.0))


def test_bf16_gradient():
    packed, qs, W = weight(dtype=torch.bfloat16)
    A = torch.randn(4, K, generator=gen(9)).bfloat16().requires_grad_()
    matmul_4bit(A, packed, qs).float().sum().backward()
    assert A.grad.dtype == torch.bfloat16
    torch.testing.assert_close(A.grad.float(), W.float().sum(0).expand(4, K), rtol=2e-2, atol=2e-2)


def test_no_grad_mode_builds_no_graph():
    packed, qs, _ = weight()
    A = torch.randn(3, K, requires_grad=True)
    with torch.no_grad():
        assert matmul_4bit(A, packed, qs).grad_fn is None


def test_empty_input():
    packed, qs, _ = weight()
    assert matmul_4bit(torch.empty(0, K), packed, qs).shape == (0, N)
    A = torch.empty(0, K, requires_grad=True)
    out = MatMul4Bit.apply(A, packed, None, None, qs)
    assert out.shape == (0, N)
    out.sum().backward()
    assert A.grad.shape == (0, K)


def test_weight_quantized_in_k_n_orientation_warns_and_works():
    packed, qs, W = weight(shape=(K, N))  # [in, out] instead of [out, in]
    A = torch.randn(2, K, generator=gen(10))
    with pytest.warns(DeprecationWarning, match=r"\[K, N\]"):
        out = matmul_4bit(A, packed, qs)
    torch.testing.assert_close(out, A @ W, rtol=1e-5, atol=1e-5)


def test_bad_input():
    packed, qs, _ = weight()
    A = torch.randn(2, K)
    with pytest.raises(ValueError, match="quant_state is required"):
        matmul_4bit(A, packed, None)
    with pytest.raises(TypeError, match="quant_state must be a QuantState"):
        matmul_4bit(A, packed, {"shape": (N, K)})
    with pytest.raises(TypeError, match="bias"):
        matmul_4bit(A, packed, qs, bias=torch.zeros(N, dtype=torch.float16))
    with pytest.raises(TypeError, match="bias"):
        matmul_4bit(A[:1], packed, qs, bias=torch.zeros(N, dtype=torch.float16))
    with pytest.raises(ValueError, match="K=64"):
        matmul_4bit(torch.randn(2, K + 1), packed, qs)
    with pytest.raises(TypeError, match="A must have dtype"):
        matmul_4bit(torch.ones(2, K, dtype=torch.long), packed, qs)
    flat = F.QuantState(absmax=qs.absmax, shape=torch.Size([N * K]), code=qs.code, blocksize=64, quant_type="nf4")
    with pytest.raises(ValueError, match="2-D"):
        matmul_4bit(A, packed, flat)


# -------------------------------------------------------------------------- one row, nested scales


def nested_linear(quant_type, dtype, bias):
    torch.manual_seed(3)
    m = bnb.nn.Linear4bit(K, N, bias=bias, compute_dtype=dtype, compress_statistics=True, quant_type=quant_type)
    if bias:
        with torch.no_grad():
            m.bias.normal_()  # as large as the products, so that the bias's rounding shows
    return m.to("cpu").eval()


@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
def test_nested_single_row_is_one_gemm_4bit(bias):
    """The decoding step with double-quantized scales: gemm_4bit decodes them where it loads them; no
    dequantize_blockwise launch to expand them first, no gemv_4bit."""
    packed, qs, _ = weight("nf4", nested=True)
    b = torch.randn(N, generator=gen(11)) if bias else None
    with trace_ops() as trace:
        matmul_4bit(torch.randn(1, 1, K, generator=gen(12)), packed, qs, bias=b)
    assert dict(trace.counts) == {("gemm_4bit", "cpu"): 1}
    m = nested_linear("fp4", torch.bfloat16, bias)
    with trace_ops() as trace, torch.no_grad():
        m(torch.randn(1, K, generator=gen(13)))
    assert dict(trace.counts) == {("gemm_4bit", "cpu"): 1}
    # A plain state keeps upstream's op for one row.
    plain, pqs, _ = weight("nf4")
    with trace_ops() as trace:
        matmul_4bit(torch.randn(1, K), plain, pqs)
    assert dict(trace.counts) == {("gemv_4bit", "cpu"): 1}


def previous_one_row_path(A, packed, qs, bias):
    """What the one-row path computed before gemm_4bit took nested states: scales expanded by F.gemv_4bit,
    the bias added to its output in the bias's own dtype."""
    out = F.gemv_4bit(A, packed, state=qs)
    return out if bias is None else out.add_(bias)


@pytest.mark.parametrize("bias_dtype", [None, "A", torch.float32], ids=["nobias", "bias-A-dtype", "bias-fp32"])
@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_nested_single_row_same_bits_as_gemv_on_expanded_scales(dtype, quant_type, bias_dtype):
    packed, qs, _ = weight(quant_type, nested=True, dtype=dtype)
    A = torch.randn(1, K, generator=gen(14)).to(dtype)
    bias = None
    if bias_dtype is not None:
        bias = torch.randn(N, generator=gen(15)).to(dtype if bias_dtype == "A" else bias_dtype)
    expected = previous_one_row_path(A, packed, qs, bias)
    if bias is None or bias.dtype == dtype:
        assert torch.equal(matmul_4bit(A, packed, qs, bias=bias), expected)
    m = nested_linear(quant_type, dtype, bias is not None)
    mbias = None if m.bias is None else m.bias.detach()
    with torch.no_grad():
        got = m(A)
    assert got.dtype == dtype
    assert torch.equal(got, previous_one_row_path(A, m.weight, m.weight.quant_state, mbias))
    if bias is not None:  # linear_4bit: the module's bias in any float dtype, added to the kernel's output
        assert torch.equal(linear_4bit(A, packed, qs, bias), expected)


def requantized_scales(qs, nested_blocksize):
    """``qs`` with its block scales double-quantized in blocks of ``nested_blocksize`` through from_dict, as
    a checkpoint may hold them (upstream reads any nested_blocksize)."""
    d = qs.as_dict()
    q, s2 = F.quantize_blockwise(F.dequantize_blockwise(qs.absmax, qs.state2), blocksize=nested_blocksize)
    d |= {"absmax": q, "nested_absmax": s2.absmax, "nested_blocksize": nested_blocksize}
    return F.QuantState.from_dict(d, torch.device("cpu"))


def half_nested_dtype(qs):
    """``qs`` read from a checkpoint whose nested_dtype is float16: upstream decodes the scales in float16."""
    return F.QuantState.from_dict(qs.as_dict() | {"nested_dtype": "float16"}, torch.device("cpu"))


def float_offset(qs):
    """``qs`` built by hand with a Python float offset (dequantize_4bit adds it as a number)."""
    return F.QuantState(
        absmax=qs.absmax, shape=qs.shape, code=qs.code, blocksize=qs.blocksize, quant_type=qs.quant_type,
        dtype=qs.dtype, offset=qs.offset.item(), state2=qs.state2,
    )  # fmt: skip


@pytest.mark.parametrize(
    "restate",
    [lambda qs: requantized_scales(qs, 64), half_nested_dtype, float_offset],
    ids=["nested_blocksize-64", "nested_dtype-float16", "float-offset"],
)
@pytest.mark.parametrize("shape", [(1, K), (5, K)], ids=["row", "rows"])
def test_nested_states_gemm_4bit_cannot_take_are_expanded_first(restate, shape):
    """gemm_4bit's nested arguments fix the 8-bit codes' block size (256), their float32 decoding and a
    tensor offset: a state that says otherwise has its scales expanded as dequantize_4bit expands them."""
    packed, qs, _ = weight("nf4", nested=True, shape=(N, 4 * K))
    qs = restate(qs)
    A = torch.randn(shape[0], 4 * K, generator=gen(16))
    W = F.dequantize_4bit(packed, qs)
    torch.testing.assert_close(matmul_4bit(A, packed, qs), A @ W.t(), rtol=1e-5, atol=1e-5)
