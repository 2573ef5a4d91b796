"""bitsandbytes.matmul (LLM.int8() with autograd), MatmulLtState and GlobalOutlierPooler.

Forward results are rebuilt bit-exactly from the functional API (row-wise int8 quantization of the fp16
activations and weight, int8 GEMM, dequantization); gradients are compared with dense float64
autograd with stated relative tolerances (int8 keeps about 2-3 significant digits).
"""

import warnings

import pytest
import torch

import bitsandbytes as bnb
import bitsandbytes.functional as F
from bitsandbytes.autograd import GlobalOutlierPooler, MatMul8bitFp, MatmulLtState

ops = torch.ops.bitsandbytes


def randn(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def rel_err(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def expected_forward(A, W, bias=None):
    """The int8 pipeline written out from the functional API (threshold 0)."""
    CA, SCA, _ = F.int8_vectorwise_quant(A.reshape(-1, A.shape[-1]).to(torch.float16))
    CB, SCB, _ = F.int8_vectorwise_quant(W.to(torch.float16))
    out = ops.int8_scaled_mm(CA, CB, SCA, SCB, bias=bias, dtype=A.dtype)
    return out.reshape(*A.shape[:-1], W.shape[0])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(5, 24), (2, 3, 24)])
def test_forward_matches_functional_pipeline(dtype, shape):
    A, W, bias = randn(*shape, dtype=dtype), randn(12, 24, seed=1, dtype=dtype), randn(12, seed=2, dtype=dtype)
    out = bnb.matmul(A, W, bias=bias)
    assert out.dtype == dtype and out.shape == (*shape[:-1], 12)
    assert torch.equal(out, expected_forward(A, W, bias))
    # ...and it is a good approximation of the dense product.
    assert rel_err(out, A.double() @ W.double().T + bias.double()) < 0.02


def test_bias_of_another_dtype_is_added_before_rounding():
    A, W, bias = randn(4, 16, dtype=torch.float16), randn(8, 16, seed=1), randn(8, seed=2) * 1000
    out = bnb.matmul(A, W, bias=bias)
    assert out.dtype == torch.float16 and torch.equal(out, expected_forward(A, W, bias))
    assert not torch.equal(out, expected_forward(A, W, bias.half()))


def test_int8_weight_from_state():
    A, W = randn(4, 16), randn(8, 16, seed=1)
    CB, SCB, _ = F.int8_vectorwise_quant(W.half())
    state = MatmulLtState(has_fp16_weights=False, CB=CB, SCB=SCB)
    assert torch.equal(bnb.matmul(A, CB, state=state), expected_forward(A, W))
    with pytest.raises(ValueError, match=r"state\.SCB"):
        bnb.matmul(A, CB, state=MatmulLtState(has_fp16_weights=False))


def test_threshold_decomposes_outlier_columns():
    A, W = randn(6, 32), randn(16, 32, seed=1)
    A[:, [3, 17]] = 40.0 * torch.sign(A[:, [3, 17]])  # two outlier feature columns
    dense = A.double() @ W.double().T
    state = MatmulLtState()
    out = bnb.matmul(A, W, state=state, threshold=6.0)
    assert state.threshold == 6.0 and state.idx.tolist() == [3, 17]
    # Expected: inlier columns through int8, outlier columns in floating point with the dequantized weight.
    CA, SCA, cols = F.int8_vectorwise_quant(A.half(), threshold=6.0)
    CB, SCB, _ = F.int8_vectorwise_quant(W.half())
    expected, subA = ops.int8_mixed_scaled_mm(A, CA, CB, SCA, SCB, cols)
    assert torch.equal(out, expected) and torch.equal(subA, A[:, [3, 17]])
    # The decomposition is what keeps the error small: without it the outliers crush every row scale.
    assert rel_err(out, dense) < 0.01 < rel_err(bnb.matmul(A, W), dense)


@pytest.mark.parametrize("threshold", [0.0, 6.0])
@pytest.mark.parametrize("shape", [(6, 32), (2, 3, 32)])
def test_backward_matches_dense(threshold, shape):
    A0, W0, b0 = randn(*shape), randn(16, 32, seed=1), randn(16, seed=2)
    if threshold:
        A0[..., 5] = 30.0
    A, W, b = (t.clone().requires_grad_() for t in (A0, W0, b0))
    G = randn(*shape[:-1], 16, seed=3)
    bnb.matmul(A, W, bias=b, threshold=threshold).backward(G)
    Ad, Wd, bd = (t.double().requires_grad_() for t in (A0, W0, b0))
    torch.nn.functional.linear(Ad, Wd, bd).backward(G.double())
    assert A.grad.dtype == A.dtype and W.grad.dtype == W.dtype and b.grad.shape == (16,)
    assert rel_err(A.grad, Ad.grad) < 0.02
    assert rel_err(W.grad, Wd.grad) < 0.03
    assert torch.allclose(b.grad.double(), bd.grad, rtol=1e-5, atol=1e-5)


def test_input_grad_uses_dequantized_weight_exactly():
    A, W = randn(4, 16).requires_grad_(), randn(8, 16, seed=1)
    G = randn(4, 8, seed=2)
    bnb.matmul(A, W).backward(G)
    CB, SCB, _ = F.int8_vectorwise_quant(W.half())
    W_dq = CB.float() * (SCB.unsqueeze(1) * (1 / 127))
    torch.testing.assert_close(A.grad, G @ W_dq, rtol=1e-6, atol=1e-6)


def test_empty_input():
    A, W = torch.empty(0, 16, requires_grad=True), randn(8, 16).requires_grad_()
    out = bnb.matmul(A, W)
    assert out.shape == (0, 8)
    out.sum().backward()
    assert A.grad.shape == (0, 16) and torch.equal(W.grad, torch.zeros_like(W))


def test_out_argument():
    A, W = randn(4, 16), randn(8, 16, seed=1)
    out = torch.empty(4, 8)
    assert bnb.matmul(A, W, out=out) is out and torch.equal(out, expected_forward(A, W))


def test_fp16_weight_is_requantized_only_when_it_changes():
    A, W = randn(4, 16), randn(8, 16, seed=1)
    state = MatmulLtState()
    first = bnb.matmul(A, W, state=state)
    codes = state.CB
    bnb.matmul(A, W, state=state)
    assert state.CB is codes  # unchanged weight: cached codes
    with torch.no_grad():
        W.mul_(2)
    state.is_training = False  # eval mode must see the update too
    assert torch.equal(bnb.matmul(A, W, state=state), expected_forward(A, W))
    assert not torch.equal(first, expected_forward(A, W))


def test_matmul8bitfp_dequantizes_the_weight():
    A, W = randn(4, 16).requires_grad_(), randn(8, 16, seed=1).requires_grad_()
    out = MatMul8bitFp.apply(A, W, None, None, MatmulLtState())
    CB, SCB, _ = F.int8_vectorwise_quant(W.detach().half())
    W_dq = CB.float() * (SCB.unsqueeze(1) * (1 / 127))
    torch.testing.assert_close(out, A.detach() @ W_dq.T, rtol=1e-6, atol=1e-6)
    G = randn(4, 8, seed=2)
    out.backward(G)
    torch.testing.assert_close(A.grad, G @ W_dq, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(W.grad, G.T @ A.detach(), rtol=1e-6, atol=1e-6)


def test_bad_input():
    W = randn(8, 16)
    with pytest.raises(TypeError, match="A must be a floating-point"):
        bnb.matmul(torch.ones(4, 16, dtype=torch.int32), W)
    with pytest.raises(ValueError, match=r"B.shape\[1\]"):
        bnb.matmul(randn(4, 15), W)
    with pytest.raises(ValueError, match="B must be a 2-D"):
        bnb.matmul(randn(4, 16), randn(16))
    with pytest.raises(ValueError, match="bias must have shape"):
        bnb.matmul(randn(4, 16), W, bias=randn(7))
    with pytest.raises(ValueError, match="same device"):
        bnb.matmul(torch.empty(4, 16, device="meta"), W)


def test_state_fields_and_deprecated_attributes():
    state = MatmulLtState()
    for name, value in [("threshold", 0.0), ("has_fp16_weights", True), ("is_training", True), ("use_pool", False)]:
        assert getattr(state, name) == value
    assert state.CB is None and state.SCB is None and state.idx is None
    with pytest.warns(FutureWarning, match="CxB"):
        assert state.CxB is None
    with pytest.raises(AttributeError, match="nonexistent"):
        state.nonexistent  # noqa: B018
    state.CB = torch.ones(1)
    state.reset_grads()
    assert state.CB is None


def test_global_outlier_pooler():
    with pytest.raises(RuntimeError, match="get_instance"):
        GlobalOutlierPooler()
    pool = GlobalOutlierPooler.get_instance()
    pool.initialize()
    assert GlobalOutlierPooler.get_instance() is pool
    pool.add_outliers(torch.tensor([5, 1]), 64)
    pool.add_outliers(torch.tensor([9]), 256)  # another width: ignored
    pool.add_outliers(torch.tensor([1, 7]), 64)
    assert pool.get_current_outlier_idx().tolist() == [1, 5, 7]
    pool.initialize()


def test_no_warning_for_non_fp16_inputs():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        bnb.matmul(randn(2, 16, dtype=torch.bfloat16), randn(4, 16, dtype=torch.bfloat16))
