"""Linear8bitLt behaviours upstream 0.50 has (issue 15 part 3): load errors are RuntimeErrors, and
``.to(device)`` moves the int8 state at once."""

import pytest
import torch

import bitsandbytes as bnb
from bitsandbytes.nn import Linear8bitLt


def shares(a, b):
    return a is not None and a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.dtype == b.dtype


def quantized(seed=0):
    torch.manual_seed(seed)
    m = Linear8bitLt(32, 16, has_fp16_weights=False, threshold=6.0)
    return m.to("cpu")


def test_tied_float_weight_refuses_an_int8_checkpoint_with_a_runtime_error():
    sd = quantized().state_dict()
    m = Linear8bitLt(32, 16, has_fp16_weights=False)
    emb = torch.nn.Embedding(16, 32)
    m.weight = emb.weight  # tied weights: a plain float Parameter shared with another module
    before = emb.weight.detach().clone()
    with pytest.raises(RuntimeError, match=r"weight is a plain Parameter \(torch\.float32\), not an Int8Params"):
        m.load_state_dict(sd)
    # Nothing was written into the tied tensor (upstream's copy would put int8 codes there).
    assert m.weight is emb.weight and torch.equal(emb.weight, before)


def test_load_errors_are_runtime_errors_that_name_the_key():
    sd = quantized().state_dict()
    del sd["SCB"]
    model = torch.nn.Sequential(Linear8bitLt(32, 16, has_fp16_weights=False))
    with pytest.raises(RuntimeError, match=r"(?s)Error\(s\) in loading state_dict.*'0\.SCB'") as info:
        model.load_state_dict({f"0.{k}": v for k, v in sd.items()})
    assert not isinstance(info.value, (ValueError, TypeError))


def test_module_to_moves_the_int8_state_at_once():
    m = quantized()
    x = torch.randn(3, 32, dtype=torch.float16)
    y = m(x)  # the forward hands CB/SCB to the state
    m.to(torch.device("cpu"))
    # Upstream's Linear8bitLt.to moves state.CB/state.SCB along with the weight; they are not left
    # empty (or behind, on the old device) until the next forward.
    assert shares(m.state.CB, m.weight) and m.state.SCB is m.weight.SCB
    assert m.state.SCB.dtype == torch.float32 and m.state.CB.dtype == torch.int8
    m.half()  # a dtype change keeps the codes and float32 scales
    assert shares(m.state.CB, m.weight) and m.state.SCB is m.weight.SCB and m.state.SCB.dtype == torch.float32
    assert torch.equal(m(x), y)


def test_module_to_keeps_a_state_that_was_handed_the_codes():
    m = quantized()
    m.init_8bit_state()
    m.to("cpu")
    assert shares(m.state.CB, m.weight) and m.state.SCB is m.weight.SCB
    assert isinstance(m.weight, bnb.nn.Int8Params)


ACCURACY_SEEDS = range(16)


def upstream_accuracy_setup(seed):
    """Upstream's test_linear_no_igemmlt (seeded): fp16 nn.Linear 1024 -> 3072 and Linear8bitLt with its
    weights (threshold 6, has_fp16_weights=False), on CPU, and a batch of 3 fp16 inputs."""
    torch.manual_seed(seed)
    linear = torch.nn.Linear(1024, 3072)
    x = torch.randn(3, 1024, dtype=torch.half)
    m = Linear8bitLt(1024, 3072, True, has_fp16_weights=False, threshold=6.0)
    m.weight = bnb.nn.Int8Params(linear.weight.data.clone(), requires_grad=False, has_fp16_weights=False)
    m.bias = linear.bias
    return linear.half(), m.to("cpu"), x


def outputs_off(ref, ours):
    return (~torch.isclose(ref, ours, atol=0.02, rtol=1e-5)).sum().item()


@pytest.mark.parametrize("seed", ACCURACY_SEEDS)
def test_accuracy_against_fp16_linear_in_training_mode(seed):
    """Upstream's bound: fewer than 2.5e-4 of the outputs off by more than 0.02, and its closeness of
    outputs and input gradients. The module is in training mode (the default, as in upstream's test),
    which on CPU is the float route; LLM.int8() exceeds the bound at some of these seeds (below)."""
    linear, m, x = upstream_accuracy_setup(seed)
    assert m.training
    x_ref, x_ours = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    fx_ref = linear(x_ref).float()
    grad_proj = torch.randn_like(fx_ref)
    (fx_ref * grad_proj).mean().backward()
    fx_ours = m(x_ours).float()
    (fx_ours * grad_proj).mean().backward()
    assert m.state.CB is not None and not m.state.has_fp16_weights
    assert outputs_off(fx_ref, fx_ours) < fx_ref.numel() * 2.5e-4
    torch.testing.assert_close(fx_ref, fx_ours, atol=0.03, rtol=1e-5)
    torch.testing.assert_close(x_ref.grad, x_ours.grad, atol=0.01, rtol=1e-5)


def test_evaluation_mode_at_upstreams_setup_is_llm_int8():
    """Evaluation mode on CPU stays LLM.int8(): the int8 ops' product with the outlier columns in fp16,
    whose quantization noise puts more than the bound's share of outputs off at some seeds."""
    ops = torch.ops.bitsandbytes
    off = []
    for seed in ACCURACY_SEEDS:
        linear, m, x = upstream_accuracy_setup(seed)
        m.eval()
        with torch.no_grad():
            y = m(x)
        CA, SCA, outliers = bnb.functional.int8_vectorwise_quant(x, threshold=6.0)
        expected, _ = ops.int8_mixed_scaled_mm(x, CA, m.weight.data, SCA, m.weight.SCB, outliers, m.bias.half())
        assert torch.equal(y, expected), seed
        off.append(outputs_off(linear(x).float(), y.float()))
    assert max(off) >= linear.out_features * 3 * 2.5e-4, off
