"""matmul_4bit / MatMul4Bit: products and gradients against dense math on the dequantized weight."""

import pytest
import torch

import bitsandbytes as bnb
import bitsandbytes.functional as F
from bitsandbytes.autograd._functions import MatMul4Bit, matmul_4bit

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
