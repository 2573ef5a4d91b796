"""Linear8bitLt and OutlierAwareLinear: forward in each mode, checkpoints, bad input.

The references for outputs, bit-exact: on CPU in evaluation mode the functional LLM.int8() pipeline;
in training mode, as upstream 0.50, the float route (the input times the dequantized int8 weight in
the input's dtype). And the dense layer, with a stated tolerance. The checkpoint layout is upstream
0.50's: ``weight`` int8, ``SCB`` float32 per row, ``weight_format`` uint8 scalar 0, plus ``bias``.
"""

import copy
import io
import pickle

import pytest
import torch

import bitsandbytes as bnb
import bitsandbytes.functional as F
from bitsandbytes.nn import Int8Params, Linear8bitLt, OutlierAwareLinear
from bitsandbytes.utils import OutlierTracer

ops = torch.ops.bitsandbytes
IN, OUT = 32, 16


def dense(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Linear(IN, OUT)


def inputs(*shape, seed=1, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def quantized(threshold=0.0, seed=0):
    m = Linear8bitLt(IN, OUT, has_fp16_weights=False, threshold=threshold)
    m.load_state_dict(dense(seed).state_dict())
    return m.to("cpu")


def expected(lin, x):
    """LLM.int8() (evaluation mode on CPU), without outlier columns."""
    CA, SCA, _ = F.int8_vectorwise_quant(x.reshape(-1, IN).half())
    CB, SCB, _ = F.int8_vectorwise_quant(lin.weight.detach().half())
    out = ops.int8_scaled_mm(CA, CB, SCA, SCB, bias=lin.bias.detach().to(x.dtype), dtype=x.dtype)
    return out.reshape(*x.shape[:-1], OUT)


def expected_float(lin, x):
    """The float route (training mode on CPU): x times the dequantized int8 weight, in x's dtype."""
    CB, SCB, _ = F.int8_vectorwise_quant(lin.weight.detach().half())
    w = (CB.float() * (SCB.unsqueeze(1) * (1 / 127))).to(x.dtype)
    return torch.nn.functional.linear(x, w, lin.bias.detach().to(x.dtype))


def assert_each_mode(m, lin, x):
    """Training mode gives the float route's result, evaluation mode LLM.int8()'s; the mode is kept."""
    was_training = m.training
    with torch.no_grad():
        m.train()
        assert torch.equal(m(x), expected_float(lin, x))
        m.eval()
        assert torch.equal(m(x), expected(lin, x))
    m.train(was_training)


def test_positional_constructor_like_upstream():
    m = Linear8bitLt(IN, OUT, False, False, 6.0, None, "cpu")
    assert m.bias is None and m.state.threshold == 6.0 and m.state.has_fp16_weights is False
    assert m.state.use_pool is True and m.index is None
    assert isinstance(m.weight, Int8Params) and not m.weight.requires_grad and m.weight.dtype == torch.float32
    assert Linear8bitLt(IN, OUT).weight.requires_grad  # has_fp16_weights=True by default


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_forward_matches_functional_and_dense(dtype, mode):
    lin = dense()
    m = quantized()
    assert m.weight.dtype == torch.int8
    getattr(m, mode)()
    x = inputs(2, 3, IN, dtype=dtype)
    y = m(x)
    assert y.dtype == dtype and torch.equal(y, (expected_float if mode == "train" else expected)(lin, x))
    ref = lin(x.float())
    assert ((y.float() - ref).norm() / ref.norm()) < 0.02


def test_threshold_outliers_in_floating_point_in_eval_mode():
    lin = dense()
    x = inputs(4, IN)
    x[:, 7] = 25.0
    with_outliers, without = quantized(threshold=6.0).eval(), quantized().eval()
    ref = lin(x)
    err_with = ((with_outliers(x) - ref).norm() / ref.norm()).item()
    err_without = ((without(x) - ref).norm() / ref.norm()).item()
    assert with_outliers.state.idx.tolist() == [7]
    assert err_with < 0.01 < err_without


def test_threshold_plays_no_part_in_training_mode_on_cpu():
    # Upstream's MatMul8bitFp quantizes no activation, so nothing is an outlier and state.idx stays unset.
    lin = dense()
    x = inputs(4, IN)
    x[:, 7] = 25.0
    with_threshold, without = quantized(threshold=6.0), quantized()
    y = with_threshold(x)
    assert torch.equal(y, without(x)) and torch.equal(y, expected_float(lin, x))
    assert with_threshold.state.idx is None
    ref = lin(x)
    assert ((y - ref).norm() / ref.norm()).item() < 0.01


@pytest.mark.parametrize("has_fp16_weights", [False, True])
@pytest.mark.parametrize("threshold", [0.0, 6.0])
def test_each_mode_keeps_its_route_across_switches(has_fp16_weights, threshold):
    # Training mode on CPU is the float route, evaluation mode LLM.int8() (upstream 0.50's routing):
    # switching back and forth, with or without autograd recording, gives each mode its own result.
    lin = dense()
    m = Linear8bitLt(IN, OUT, has_fp16_weights=has_fp16_weights, threshold=threshold)
    m.load_state_dict(lin.state_dict())
    m = m.to("cpu")
    x = inputs(5, IN)
    x[:, 2] = 9.0  # an outlier column for threshold 6
    results = {"train": [], "eval": []}
    for mode in ("train", "eval", "train", "eval"):
        getattr(m, mode)()
        with torch.no_grad():
            results[mode].append(m(x))
        results[mode].append(m(x).detach())
    for r in results["train"]:
        assert torch.equal(r, expected_float(lin, x))
    for r in results["eval"]:
        assert torch.equal(r, results["eval"][0])
    if threshold == 0.0:
        assert torch.equal(results["eval"][0], expected(lin, x))
    assert not torch.equal(results["train"][0], results["eval"][0])


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("threshold", [0.0, 6.0])
def test_state_dict_after_forward_reloads_identically(mode, threshold):
    m = quantized(threshold)
    getattr(m, mode)()
    x = inputs(3, IN, dtype=torch.float16)  # an fp16 input must not change the saved bias dtype
    y = m(x)
    sd = m.state_dict()
    assert set(sd) == {"weight", "bias", "SCB", "weight_format"}
    assert sd["weight"].dtype == torch.int8 and sd["weight"].shape == (OUT, IN)
    assert sd["SCB"].dtype == torch.float32 and sd["SCB"].shape == (OUT,)
    assert sd["weight_format"].dtype == torch.uint8 and sd["weight_format"].shape == () and sd["weight_format"] == 0
    assert sd["bias"].dtype == torch.float32
    assert torch.equal(sd["SCB"], F.int8_vectorwise_quant(dense().weight.detach().half())[1])
    fresh = Linear8bitLt(IN, OUT, has_fp16_weights=False, threshold=threshold)  # built, never moved
    fresh.load_state_dict(sd)
    getattr(fresh, mode)()
    assert fresh.weight.dtype == torch.int8 and torch.equal(fresh(x), y)
    # Loading did not alias the source tensors.
    assert fresh.weight.data_ptr() != sd["weight"].data_ptr()


def test_state_dict_is_a_pure_read():
    m = quantized()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    m(inputs(2, IN, dtype=torch.bfloat16))
    m.eval()
    m(inputs(2, IN))
    after = m.state_dict()
    assert all(torch.equal(before[k], after[k]) and before[k].dtype == after[k].dtype for k in before)


def test_load_into_quantized_and_meta_modules():
    src = quantized(seed=3)
    x = inputs(2, IN)
    target = quantized(seed=0)  # already quantized with other weights: overwritten
    target.load_state_dict(src.state_dict())
    assert torch.equal(target(x), src(x))
    with torch.device("meta"):
        meta = Linear8bitLt(IN, OUT, has_fp16_weights=False)
    meta.load_state_dict(src.state_dict(), assign=True)
    assert isinstance(meta.weight, Int8Params) and meta.weight.device.type == "cpu"
    assert torch.equal(meta(x), src(x))
    with torch.device("meta"):
        empty = Linear8bitLt(IN, OUT, has_fp16_weights=False)
    empty.to_empty(device="cpu")
    assert isinstance(empty.weight, Int8Params)
    empty.load_state_dict(src.state_dict())
    assert torch.equal(empty(x), src(x))


def test_partial_checkpoint_without_weight_leaves_it_alone():
    m = quantized()
    codes, scales = m.weight.data.clone(), m.weight.SCB.clone()
    result = m.load_state_dict({"bias": torch.zeros(OUT)}, strict=False)
    assert result.missing_keys == ["weight"] and not result.unexpected_keys
    assert torch.equal(m.weight.data, codes) and torch.equal(m.weight.SCB, scales)
    assert torch.equal(m.bias, torch.zeros(OUT))


def test_float_checkpoint_into_quantized_module_requantizes():
    m = quantized(seed=0)
    lin = dense(seed=5)
    m.load_state_dict(lin.state_dict())
    assert m.weight.dtype == torch.int8
    assert_each_mode(m, lin, inputs(3, IN))


def test_meta_build_then_client_rebuild_and_to():
    # What transformers does: build on meta, rebuild the weight from its __dict__, move it.
    lin = dense()
    with torch.device("meta"):
        m = Linear8bitLt(IN, OUT, has_fp16_weights=False, threshold=6.0)
    old = m.weight
    kwargs = dict(old.__dict__)
    kwargs.pop("SCB", None)
    m.weight = Int8Params(lin.weight.detach().clone(), requires_grad=False, **kwargs).to("cpu")
    m.bias = torch.nn.Parameter(lin.bias.detach().clone())
    assert_each_mode(m, lin, inputs(3, IN))


def test_forward_before_any_move_quantizes_in_place():
    lin = dense()
    m = Linear8bitLt(IN, OUT, has_fp16_weights=False)
    m.load_state_dict(lin.state_dict())
    x = inputs(2, IN)
    assert torch.equal(m(x), expected_float(lin, x))  # training mode, the module's default
    assert m.weight.dtype == torch.int8 and "SCB" in m.state_dict()
    assert_each_mode(m, lin, x)


def test_has_fp16_weights_trains_and_sees_updates():
    lin = dense()
    m = Linear8bitLt(IN, OUT, has_fp16_weights=True)
    m.load_state_dict(lin.state_dict())
    assert set(m.state_dict()) == {"weight", "bias"} and m.weight.dtype == torch.float32
    x = inputs(4, IN)
    m(x).pow(2).sum().backward()
    lin(x).pow(2).sum().backward()
    assert ((m.weight.grad - lin.weight.grad).norm() / lin.weight.grad.norm()) < 0.03
    assert ((m.bias.grad - lin.bias.grad).norm() / lin.bias.grad.norm()) < 0.03
    torch.optim.SGD(m.parameters(), lr=0.1).step()  # grads still set: must re-quantize anyway
    m.eval()
    with torch.no_grad():
        assert torch.equal(m(x), expected(m, x))


@pytest.mark.parametrize("how", ["deepcopy", "pickle", "torch.save"])
def test_module_copies(how):
    m = quantized(threshold=6.0)
    x = inputs(2, IN)
    y = m(x)
    if how == "deepcopy":
        c = copy.deepcopy(m)
    elif how == "pickle":
        c = pickle.loads(pickle.dumps(m))
    else:
        buf = io.BytesIO()
        torch.save(m, buf)
        buf.seek(0)
        c = torch.load(buf, weights_only=False)
    assert isinstance(c.weight, Int8Params) and torch.equal(c(x), y)
    assert c.weight.data_ptr() != m.weight.data_ptr()


def test_module_to_keeps_scales_and_dtype_casts_skip_codes():
    m = quantized()
    x = inputs(2, IN, dtype=torch.float16)
    y = m(x)
    m.half()
    assert m.weight.dtype == torch.int8 and m.weight.SCB.dtype == torch.float32 and m.bias.dtype == torch.float16
    assert torch.equal(m(x), y)


# --- bad input -----------------------------------------------------------------------------------


def checkpoint():
    return quantized().state_dict()


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda sd: sd.pop("SCB"), "'SCB'"),
        (lambda sd: sd.update(SCB=sd["SCB"][:-1]), "'SCB'.*one scale per row"),
        (lambda sd: sd.update(SCB=sd["SCB"].half()), "'SCB'.*float32"),
        (lambda sd: sd.update(SCB=[1.0] * OUT), "'SCB'"),
        (lambda sd: sd.update(weight_format=torch.tensor(1, dtype=torch.uint8)), "'weight_format'.*col32"),
        (
            lambda sd: sd.update(weight_format=torch.tensor(9, dtype=torch.uint8)),
            "'weight_format'.*unknown",
        ),
        (lambda sd: sd.update(weight_format="col_ampere"), "'weight_format'.*only the row-major"),
        (lambda sd: sd.update(weight_format=torch.zeros(2)), "'weight_format'"),
        (lambda sd: sd.update(weight=sd["weight"].to(torch.int32)), "'weight'.*int32"),
        (lambda sd: sd.pop("weight"), "'SCB'.*no 'weight'"),
    ],
)
def test_garbled_checkpoints_name_the_key(edit, match):
    sd = checkpoint()
    edit(sd)
    # A RuntimeError, as torch raises for its own load_state_dict problems (clients catch that).
    with pytest.raises(RuntimeError, match=match):
        Linear8bitLt(IN, OUT, has_fp16_weights=False).load_state_dict(sd)


def test_keys_are_named_with_their_prefix():
    sd = {f"layer.{k}": v for k, v in checkpoint().items()}
    del sd["layer.SCB"]
    model = torch.nn.Module()
    model.layer = Linear8bitLt(IN, OUT, has_fp16_weights=False)
    with pytest.raises(RuntimeError, match=r"'layer\.SCB'"):
        model.load_state_dict(sd)


def test_weight_format_row_by_name_and_missing_is_accepted():
    sd = checkpoint()
    x = inputs(2, IN)
    ref = quantized()(x)
    for fmt in ("row", 0, None):
        d = dict(sd)
        if fmt is None:
            del d["weight_format"]
        else:
            d["weight_format"] = fmt
        m = Linear8bitLt(IN, OUT, has_fp16_weights=False)
        m.load_state_dict(d)
        assert torch.equal(m(x), ref)


def test_int8_checkpoint_into_fp16_weights_module():
    with pytest.raises(RuntimeError, match="has_fp16_weights=True"):
        Linear8bitLt(IN, OUT, has_fp16_weights=True).load_state_dict(checkpoint())


def test_size_mismatch_is_reported_by_torch():
    with pytest.raises(RuntimeError, match="size mismatch for weight"):
        Linear8bitLt(IN + 1, OUT, has_fp16_weights=False).load_state_dict(checkpoint())


def test_bad_forward_input():
    m = quantized()
    with pytest.raises(TypeError, match="x must be a floating-point"):
        m(torch.ones(2, IN, dtype=torch.int64))
    with pytest.raises(ValueError, match="weight's device"):
        m(torch.empty(2, IN, device="meta"))
    with pytest.raises(ValueError, match=r"B.shape\[1\]"):
        m(inputs(2, IN + 1))
    with torch.device("meta"):
        meta = Linear8bitLt(IN, OUT, has_fp16_weights=False)
    with pytest.raises(RuntimeError, match="meta device"):
        meta(torch.empty(2, IN, device="meta"))


# --- OutlierAwareLinear --------------------------------------------------------------------------


class ZeroOutlierColumns(OutlierAwareLinear):
    """Test subclass: the weight's outlier input columns are zeroed, and forward is a plain linear."""

    def quantize_weight(self, w, outlier_idx):
        w = w.detach().clone()
        w[:, outlier_idx] = 0
        return w

    def forward_with_outliers(self, x, outlier_idx):
        return torch.nn.functional.linear(x, self.weight, self.bias)


def test_outlier_aware_linear_uses_traced_outliers():
    torch.manual_seed(0)
    model = torch.nn.Sequential(ZeroOutlierColumns(IN, OUT))
    x = inputs(64, IN)
    x[:, 11] *= 40  # a standout input dimension, found by the tracer on the first layer
    tracer = OutlierTracer.get_instance()
    tracer.initialize(model)
    model[0].weight.data.normal_()
    y = model(x)
    layer = model[0]
    assert 11 in layer.outlier_dim.tolist() and layer.is_quantized
    assert torch.all(layer.weight[:, 11] == 0)
    assert torch.equal(y, torch.nn.functional.linear(x, layer.weight, layer.bias))
    assert torch.equal(model(x), y)  # quantized once only


def test_outlier_aware_linear_requires_overrides():
    layer = OutlierAwareLinear(4, 2)
    layer.outlier_dim = torch.tensor([], dtype=torch.int64)
    with pytest.raises(NotImplementedError, match="quantize_weight"):
        layer(torch.ones(1, 4))


def test_top_level_names():
    assert bnb.nn.modules.Linear8bitLt is Linear8bitLt and bnb.MatmulLtState is bnb.autograd.MatmulLtState
