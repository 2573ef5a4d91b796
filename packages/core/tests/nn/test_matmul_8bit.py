"""bitsandbytes.matmul (LLM.int8() and the float route, with autograd), MatmulLtState, GlobalOutlierPooler.

As upstream 0.50, ``matmul`` takes the float route (MatMul8bitFp: activations times the dequantized
int8 weight) when ``state.is_training`` and the device type is cpu or xpu, and LLM.int8() otherwise. A
fresh state is in training mode, so the LLM.int8() tests here pass ``int8_state()`` (evaluation mode).
Forward results are rebuilt bit-exactly from the functional API (LLM.int8(): row-wise int8 quantization
of the fp16 activations and weight, int8 GEMM, dequantization; float route: the dequantized weight in
A's dtype); gradients are compared with dense float64 autograd with stated relative tolerances (int8
keeps about 2-3 significant digits).
"""

import collections
import warnings

import pytest
import torch

import bitsandbytes as bnb
import bitsandbytes.functional as F
from bitsandbytes.autograd import GlobalOutlierPooler, MatMul8bitFp, MatmulLtState
from bitsandbytes.autograd._matmul_8bit import _uses_float_route

ops = torch.ops.bitsandbytes
ROUTES = ["int8", "float"]


def int8_state(**fields) -> MatmulLtState:
    """A state in evaluation mode: LLM.int8() on every device type."""
    return MatmulLtState(is_training=False, **fields)


def state_for(route: str, **fields) -> MatmulLtState:
    return MatmulLtState(is_training=route == "float", **fields)


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


def dequantized(W, dtype=torch.float32):
    CB, SCB, _ = F.int8_vectorwise_quant(W.to(torch.float16))
    return (CB.float() * (SCB.unsqueeze(1) * (1 / 127))).to(dtype)


def expected_float(A, W, bias=None):
    """The float route: A times the dequantized weight, bias included, in A's dtype."""
    return torch.nn.functional.linear(A, dequantized(W, A.dtype), None if bias is None else bias.to(A.dtype))


def expected_for(route, A, W, bias=None):
    return (expected_float if route == "float" else expected_forward)(A, W, bias)


def test_routing_follows_upstream():
    # upstream 0.50 matmul(): `if state.is_training and A.device.type in ("cpu", "xpu")` -> MatMul8bitFp.
    training, evaluating = MatmulLtState(), int8_state()
    assert training.is_training  # a fresh state, as upstream's
    for device_type in ("cpu", "xpu"):
        assert _uses_float_route(training, device_type) and not _uses_float_route(evaluating, device_type)
    for device_type in ("cuda", "mps", "hpu", "npu", "meta"):
        assert not _uses_float_route(training, device_type) and not _uses_float_route(evaluating, device_type)


class RecordedOps(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls[func.name()] += 1
        return func(*args, **(kwargs or {}))


INT8_PRODUCTS = {
    "bitsandbytes::int8_scaled_mm",
    "bitsandbytes::int8_mixed_scaled_mm",
    "bitsandbytes::int8_linear_matmul",
}


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_training_mode_takes_int8_kernels_off_cpu(device):
    # The same training-mode call: on CPU only the weight is quantized and no int8 product runs; on
    # another device type (meta: real dispatch, through the ops' shape functions) the activations are
    # quantized too and multiplied in int8 (LLM.int8()).
    A, W = randn(4, 16).to(device), randn(8, 16, seed=1).to(device)
    with RecordedOps() as rec:
        out = bnb.matmul(A, W, state=MatmulLtState())
    assert out.shape == (4, 8) and out.device.type == device
    products = INT8_PRODUCTS & set(rec.calls)
    if device == "cpu":
        assert rec.calls["bitsandbytes::int8_vectorwise_quant"] == 1 and not products
        assert torch.equal(out, expected_float(A, W))
    else:
        assert rec.calls["bitsandbytes::int8_vectorwise_quant"] == 2 and products == {"bitsandbytes::int8_scaled_mm"}


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(5, 24), (2, 3, 24)])
def test_forward_matches_functional_pipeline(dtype, shape, route):
    A, W, bias = randn(*shape, dtype=dtype), randn(12, 24, seed=1, dtype=dtype), randn(12, seed=2, dtype=dtype)
    out = bnb.matmul(A, W, bias=bias, state=state_for(route))
    assert out.dtype == dtype and out.shape == (*shape[:-1], 12)
    assert torch.equal(out, expected_for(route, A, W, bias))
    # ...and it is a good approximation of the dense product.
    assert rel_err(out, A.double() @ W.double().T + bias.double()) < 0.02


def test_bias_of_another_dtype_is_added_before_rounding():
    A, W, bias = randn(4, 16, dtype=torch.float16), randn(8, 16, seed=1), randn(8, seed=2) * 1000
    out = bnb.matmul(A, W, bias=bias, state=int8_state())
    assert out.dtype == torch.float16 and torch.equal(out, expected_forward(A, W, bias))
    assert not torch.equal(out, expected_forward(A, W, bias.half()))


def test_float_route_adds_the_bias_in_the_inputs_dtype():
    # As upstream, where Linear8bitLt casts the bias to x's dtype before F.linear.
    A, W, bias = randn(4, 16, dtype=torch.float16), randn(8, 16, seed=1), randn(8, seed=2) * 1000
    out = bnb.matmul(A, W, bias=bias)
    assert out.dtype == torch.float16 and torch.equal(out, expected_float(A, W, bias.half()))


@pytest.mark.parametrize("route", ROUTES)
def test_int8_weight_from_state(route):
    A, W = randn(4, 16), randn(8, 16, seed=1)
    CB, SCB, _ = F.int8_vectorwise_quant(W.half())
    state = state_for(route, has_fp16_weights=False, CB=CB, SCB=SCB)
    assert torch.equal(bnb.matmul(A, CB, state=state), expected_for(route, A, W))
    assert torch.equal(bnb.matmul(A, CB.t(), state=state), expected_for(route, A, W))  # B as [K, N]
    with pytest.raises(ValueError, match=r"state\.SCB"):
        bnb.matmul(A, CB, state=state_for(route, has_fp16_weights=False))


def test_threshold_decomposes_outlier_columns():
    A, W = randn(6, 32), randn(16, 32, seed=1)
    A[:, [3, 17]] = 40.0 * torch.sign(A[:, [3, 17]])  # two outlier feature columns
    dense = A.double() @ W.double().T
    state = int8_state()
    out = bnb.matmul(A, W, state=state, threshold=6.0)
    assert state.threshold == 6.0 and state.idx.tolist() == [3, 17]
    # Expected: inlier columns through int8, outlier columns in floating point with the dequantized weight.
    CA, SCA, cols = F.int8_vectorwise_quant(A.half(), threshold=6.0)
    CB, SCB, _ = F.int8_vectorwise_quant(W.half())
    expected, subA = ops.int8_mixed_scaled_mm(A, CA, CB, SCA, SCB, cols)
    assert torch.equal(out, expected) and torch.equal(subA, A[:, [3, 17]])
    # The decomposition is what keeps the error small: without it the outliers crush every row scale.
    assert rel_err(out, dense) < 0.01 < rel_err(bnb.matmul(A, W, state=int8_state()), dense)


def test_float_route_has_no_outlier_columns():
    A, W = randn(6, 32), randn(16, 32, seed=1)
    A[:, [3, 17]] = 40.0
    state = MatmulLtState()
    out = bnb.matmul(A, W, state=state, threshold=6.0)
    assert state.threshold == 6.0 and state.idx is None
    assert torch.equal(out, expected_float(A, W))
    assert rel_err(out, A.double() @ W.double().T) < 0.01


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("threshold", [0.0, 6.0])
@pytest.mark.parametrize("shape", [(6, 32), (2, 3, 32)])
def test_backward_matches_dense(threshold, shape, route):
    A0, W0, b0 = randn(*shape), randn(16, 32, seed=1), randn(16, seed=2)
    if threshold:
        A0[..., 5] = 30.0
    A, W, b = (t.clone().requires_grad_() for t in (A0, W0, b0))
    G = randn(*shape[:-1], 16, seed=3)
    bnb.matmul(A, W, bias=b, threshold=threshold, state=state_for(route)).backward(G)
    Ad, Wd, bd = (t.double().requires_grad_() for t in (A0, W0, b0))
    torch.nn.functional.linear(Ad, Wd, bd).backward(G.double())
    assert A.grad.dtype == A.dtype and W.grad.dtype == W.dtype and b.grad.shape == (16,)
    assert rel_err(A.grad, Ad.grad) < 0.02
    assert rel_err(W.grad, Wd.grad) < 0.03
    assert torch.allclose(b.grad.double(), bd.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("route", ROUTES)
def test_input_grad_uses_dequantized_weight_exactly(route):
    A, W = randn(4, 16).requires_grad_(), randn(8, 16, seed=1)
    G = randn(4, 8, seed=2)
    bnb.matmul(A, W, state=state_for(route)).backward(G)
    CB, SCB, _ = F.int8_vectorwise_quant(W.half())
    W_dq = CB.float() * (SCB.unsqueeze(1) * (1 / 127))
    torch.testing.assert_close(A.grad, G @ W_dq, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("route", ROUTES)
def test_empty_input(route):
    A, W = torch.empty(0, 16, requires_grad=True), randn(8, 16).requires_grad_()
    out = bnb.matmul(A, W, state=state_for(route))
    assert out.shape == (0, 8)
    out.sum().backward()
    assert A.grad.shape == (0, 16) and torch.equal(W.grad, torch.zeros_like(W))


@pytest.mark.parametrize("route", ROUTES)
def test_out_argument(route):
    A, W = randn(4, 16), randn(8, 16, seed=1)
    out = torch.empty(4, 8)
    assert bnb.matmul(A, W, out=out, state=state_for(route)) is out
    assert torch.equal(out, expected_for(route, A, W))


def test_fp16_weight_is_requantized_only_when_it_changes():
    A, W = randn(4, 16), randn(8, 16, seed=1)
    state = MatmulLtState()
    first = bnb.matmul(A, W, state=state)
    codes = state.CB
    bnb.matmul(A, W, state=state)
    assert state.CB is codes  # unchanged weight: cached codes
    with torch.no_grad():
        W.mul_(2)
    assert torch.equal(bnb.matmul(A, W, state=state), expected_float(A, W))  # training mode sees the update
    assert not torch.equal(first, expected_float(A, W))
    codes = state.CB
    with torch.no_grad():
        W.mul_(2)
    state.is_training = False  # eval mode must see the update too
    assert torch.equal(bnb.matmul(A, W, state=state), expected_forward(A, W))
    assert state.CB is not codes


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


def test_float_route_keeps_the_codes_not_a_float_weight_for_backward():
    # Upstream rebuilds the dequantized weight in backward from the state; saving it instead would keep
    # a float copy of every frozen int8 weight alive per step.
    W = randn(64, 32, seed=1)
    CB, SCB, _ = F.int8_vectorwise_quant(W.half())
    A = randn(4, 32).requires_grad_()
    out = bnb.matmul(A, CB, state=MatmulLtState(has_fp16_weights=False, CB=CB, SCB=SCB))
    assert type(out.grad_fn).__name__ == "MatMul8bitFpBackward"
    saved = out.grad_fn.saved_tensors
    assert not any(t is not None and t.is_floating_point() and t.shape == CB.shape for t in saved)
    out.backward(randn(4, 64, seed=2))
    torch.testing.assert_close(A.grad, randn(4, 64, seed=2) @ dequantized(W), rtol=1e-6, atol=1e-6)


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
        for route in ROUTES:
            bnb.matmul(randn(2, 16, dtype=torch.bfloat16), randn(4, 16, dtype=torch.bfloat16), state=state_for(route))
