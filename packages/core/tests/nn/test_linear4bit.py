"""Linear4bit / LinearNF4 / LinearFP4: forward and backward against dense math, state_dict round trips,
the upstream defects pinned (forward never changes the weight), and bad input."""

import pickle
import warnings

import pytest
import torch

import bitsandbytes as bnb
import bitsandbytes.functional as F
from bitsandbytes.nn import Linear4bit, LinearFP4, LinearNF4, Params4bit

IN, OUT = 64, 32
SETTINGS = [
    (qt, nested, storage)
    for qt in ("nf4", "fp4")
    for nested in (False, True)
    for storage in (torch.uint8, torch.bfloat16)
]
SETTING_IDS = [f"{qt}-{'nested' if n else 'flat'}-{str(s).removeprefix('torch.')}" for qt, n, s in SETTINGS]


def gen(seed):
    return torch.Generator().manual_seed(seed)


def dense_linear(seed=0, bias=True):
    torch.manual_seed(seed)
    return torch.nn.Linear(IN, OUT, bias=bias)


def quantized(quant_type="nf4", nested=True, storage=torch.uint8, bias=True, seed=0, **kw):
    m = Linear4bit(IN, OUT, bias, None, nested, quant_type, storage, **kw)
    m.load_state_dict(dense_linear(seed, bias).state_dict())
    return m.to("cpu")


def weight_of(m):
    return F.dequantize_4bit(m.weight.data, m.weight.quant_state)


def raw(t):
    return t.contiguous().view(torch.uint8)


def test_constructors_take_upstream_positional_arguments():
    m = Linear4bit(IN, OUT, False, torch.bfloat16, False, "nf4", torch.bfloat16, "meta")
    assert m.bias is None and m.compute_dtype == torch.bfloat16 and m.compute_type_is_set
    assert (m.weight.quant_type, m.weight.compress_statistics, m.weight.quant_storage) == ("nf4", False, torch.bfloat16)
    assert m.weight.device.type == "meta" and m.quant_storage == torch.bfloat16 and m.quant_state is None
    nf4 = LinearNF4(IN, OUT, True, torch.float16, False, torch.bfloat16, "meta")
    fp4 = LinearFP4(IN, OUT, True, torch.float16, False, torch.bfloat16, "meta")
    for mod, qt in ((nf4, "nf4"), (fp4, "fp4")):
        assert mod.weight.quant_type == qt and mod.compute_dtype == torch.float16
        assert mod.weight.quant_storage == torch.bfloat16 and mod.weight.compress_statistics is False
        assert mod.weight.module is mod
    default = Linear4bit(IN, OUT, device="meta")
    assert default.weight.quant_type == "fp4" and default.weight.compress_statistics is True
    assert default.compute_dtype is None and not default.compute_type_is_set


def test_meta_construction_then_rebuilt_weight_then_move():
    # What transformers does: build on meta, replace the weight from its __dict__, move to the device.
    m = LinearNF4(IN, OUT, bias=False, device="meta")
    w = dense_linear().weight.detach()
    m.weight = Params4bit(w, requires_grad=False, **m.weight.__dict__).to("cpu")
    assert m.quant_state is m.weight.quant_state
    x = torch.randn(3, IN, generator=gen(1))
    torch.testing.assert_close(m(x), torch.nn.functional.linear(x, weight_of(m)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("quant_type", "nested", "storage"), SETTINGS, ids=SETTING_IDS)
@pytest.mark.parametrize("shape", [(1, IN), (5, IN), (2, 3, IN)], ids=["1row", "5rows", "3d"])
def test_forward_matches_dequantize_then_linear(quant_type, nested, storage, shape):
    m = quantized(quant_type, nested, storage)
    x = torch.randn(shape, generator=gen(2))
    ref = torch.nn.functional.linear(x, weight_of(m), m.bias)
    y = m(x)
    assert y.shape == (*shape[:-1], OUT) and y.dtype == torch.float32
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)
    # The quantization error itself stays small against the dense layer (catches a wrong weight).
    dense = torch.nn.functional.linear(x, dense_linear().weight, m.bias)
    assert (y - dense).abs().max() < 0.25 * dense.abs().max()


def test_quantized_weight_equals_functional_quantization():
    m = quantized("fp4", True, torch.uint8)
    packed, qs = F.quantize_4bit(dense_linear().weight.detach(), quant_type="fp4", compress_statistics=True)
    assert torch.equal(m.weight.data, packed) and m.weight.quant_state == qs


@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16])
def test_compute_dtype_follows_fp32_and_bf16_inputs(x_dtype):
    m = quantized()
    x = torch.randn(4, IN, generator=gen(3)).to(x_dtype)
    y = m(x)
    assert m.compute_dtype == x_dtype and y.dtype == x_dtype
    ref = torch.nn.functional.linear(x.float(), weight_of(m), m.bias).to(x_dtype)
    tol = 1e-5 if x_dtype == torch.float32 else 3e-2
    torch.testing.assert_close(y, ref, rtol=tol, atol=tol)


def with_compute_dtype(compute_dtype, seed=0):
    m = Linear4bit(IN, OUT, True, compute_dtype, quant_type="nf4")
    m.load_state_dict(dense_linear(seed).state_dict())
    return m.to("cpu")


def slow_path_records(caplog):
    return [r for r in caplog.records if r.name == "bitsandbytes.nn.modules" and "slow" in r.getMessage()]


# (compute_dtype, input dtype): float32 is transformers' default bnb_4bit_compute_dtype; float16 with no
# compute_dtype is the case upstream warns about.
SLOW_PATHS = [(torch.float32, torch.float16), (torch.float32, torch.bfloat16), (None, torch.float16)]


@pytest.mark.parametrize(("compute_dtype", "x_dtype"), SLOW_PATHS, ids=["fp32-fp16", "fp32-bf16", "none-fp16"])
@pytest.mark.parametrize("rows", [1, 3])
def test_half_input_on_the_fp32_path_logs_once_per_module(caplog, compute_dtype, x_dtype, rows):
    a, b = with_compute_dtype(compute_dtype), with_compute_dtype(compute_dtype, seed=1)
    x = torch.randn(rows, IN, generator=gen(4)).to(x_dtype)
    with warnings.catch_warnings(), caplog.at_level("WARNING", logger="bitsandbytes.nn.modules"):
        warnings.simplefilter("error")  # a logger message, not a warnings.warn
        y = a(x)
        a(x)
        b(x)
        a(x[:0] if rows > 1 else x)
    assert y.dtype == x_dtype
    records = slow_path_records(caplog)
    assert len(records) == 2, [r.getMessage() for r in records]  # one per module, not one per process or call
    text = records[0].getMessage()
    assert str(x_dtype) in text and "bnb_4bit_compute_dtype=torch.float32" in text
    if rows == 1:
        assert text.endswith("slow inference.")
    else:
        assert text.endswith("slow inference or training speed.")


@pytest.mark.parametrize(
    ("compute_dtype", "x_dtype"),
    [(None, torch.bfloat16), (None, torch.float32), (torch.float32, torch.float32), (torch.float16, torch.float16),
     (torch.bfloat16, torch.float16)],
)  # fmt: skip
def test_no_slow_path_message_when_the_input_is_computed_in_16_bits_or_is_fp32(caplog, compute_dtype, x_dtype):
    m = with_compute_dtype(compute_dtype)
    with caplog.at_level("WARNING", logger="bitsandbytes.nn.modules"):
        m(torch.randn(2, IN, generator=gen(4)).to(x_dtype))
    assert slow_path_records(caplog) == []


def test_explicit_compute_dtype_casts_input_and_output_back():
    m = Linear4bit(IN, OUT, True, torch.bfloat16, quant_type="nf4")
    m.load_state_dict(dense_linear().state_dict())
    m = m.to("cpu")
    x = torch.randn(3, IN, generator=gen(5))
    y = m(x)
    assert y.dtype == torch.float32 and m.compute_dtype == torch.bfloat16
    ref = torch.nn.functional.linear(x.bfloat16(), weight_of(m).bfloat16(), m.bias.bfloat16()).float()
    torch.testing.assert_close(y, ref, rtol=2e-2, atol=2e-2)
    assert m.bias.dtype == torch.float32  # upstream casts bias.data in place; we cast a copy


@pytest.mark.parametrize("shape", [(4, IN), (2, 3, IN)], ids=["2d", "3d"])
def test_backward_input_and_bias_gradients_match_dense(shape):
    m = quantized("nf4", True)
    m.bias.requires_grad_(True)
    x = torch.randn(shape, generator=gen(6), requires_grad=True)
    g = torch.randn((*shape[:-1], OUT), generator=gen(7))
    m(x).backward(g)
    W = weight_of(m)
    torch.testing.assert_close(x.grad, g @ W, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(m.bias.grad, g.reshape(-1, OUT).sum(0), rtol=1e-5, atol=1e-5)
    assert m.weight.grad is None


def test_no_bias():
    m = quantized(bias=False)
    x = torch.randn(3, IN, generator=gen(8))
    torch.testing.assert_close(m(x), torch.nn.functional.linear(x, weight_of(m)), rtol=1e-5, atol=1e-5)
    assert set(m.state_dict()) == {
        "weight",
        "weight.absmax",
        "weight.quant_map",
        "weight.nested_absmax",
        "weight.nested_quant_map",
        "weight.quant_state.bitsandbytes__nf4",
    }


# --- upstream defects, pinned -------------------------------------------------------------------


@pytest.mark.parametrize("rows", [1, 4])
@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16])
def test_train_and_eval_give_the_same_result_in_any_order(rows, x_dtype):
    # Upstream's CPU path repacks the weight in place on the first eval forward (no-grad bf16/fp32
    # input on AVX512-BF16 machines); outputs, state_dict and dequantize_4bit then change.
    m = quantized("nf4", True)
    data, qs_dict = raw(m.weight.data).clone(), m.weight.quant_state.as_dict()
    W = weight_of(m)
    x = torch.randn(rows, IN, generator=gen(9)).to(x_dtype)
    with torch.no_grad():
        y_train = m.train()(x)
        y_eval = m.eval()(x)
        y_train2 = m.train()(x)
        y_eval2 = m.eval()(x)
    for y in (y_eval, y_train2, y_eval2):
        assert torch.equal(y, y_train)
    assert torch.equal(raw(m.weight.data), data)
    assert m.weight.quant_state.as_dict().keys() == qs_dict.keys()
    assert torch.equal(weight_of(m), W)


def test_state_dict_after_any_forward_reloads_to_identical_outputs():
    m = quantized("fp4", True, torch.bfloat16)
    x = torch.randn(2, IN, generator=gen(10))
    with torch.no_grad():
        m.eval()(x)
        m.train()(x[:1])
        y = m.eval()(x)
    fresh = Linear4bit(IN, OUT)
    fresh.load_state_dict(m.state_dict())
    assert torch.equal(fresh(x), y)


def test_dequantize_is_right_at_any_moment():
    m = quantized("nf4", False)
    W0 = weight_of(m)
    x = torch.randn(1, IN, generator=gen(11))
    for mode in (m.eval, m.train, m.eval):
        mode()
        with torch.no_grad():
            m(x)
        m.state_dict()
        assert torch.equal(weight_of(m), W0)


# --- state_dict -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("quant_type", "nested", "storage"), SETTINGS, ids=SETTING_IDS)
def test_state_dict_round_trip_into_a_fresh_module(quant_type, nested, storage):
    m = quantized(quant_type, nested, storage)
    sd = m.state_dict()
    expected = {"weight", "bias", "weight.absmax", "weight.quant_map", f"weight.quant_state.bitsandbytes__{quant_type}"}
    if nested:
        expected |= {"weight.nested_absmax", "weight.nested_quant_map"}
    assert set(sd) == expected
    assert sd["weight"].dtype == storage and type(sd["weight"]) is torch.Tensor
    # A module built with other (default) settings takes the checkpoint's settings.
    fresh = Linear4bit(IN, OUT)
    result = fresh.load_state_dict(sd)
    assert not result.missing_keys and not result.unexpected_keys
    assert type(fresh.weight) is Params4bit and fresh.weight.module is fresh
    assert (fresh.weight.quant_type, fresh.weight.quant_storage) == (quant_type, storage)
    assert fresh.weight.compress_statistics is nested and fresh.quant_state is fresh.weight.quant_state
    x = torch.randn(3, IN, generator=gen(12))
    assert torch.equal(fresh(x), m(x))
    sd2 = fresh.state_dict()
    assert set(sd2) == set(sd) and all(torch.equal(raw(sd2[k]), raw(sd[k])) for k in sd)


def test_state_dict_into_a_meta_module_with_assign():
    m = quantized("nf4", True)
    fresh = LinearNF4(IN, OUT, device="meta")
    fresh.load_state_dict(m.state_dict(), assign=True)
    x = torch.randn(2, IN, generator=gen(13))
    assert fresh.weight.device.type == "cpu" and torch.equal(fresh(x), m(x))


def test_state_dict_through_a_parent_module_and_torch_save(tmp_path):
    model = torch.nn.Sequential(quantized("nf4", True), torch.nn.ReLU(), quantized("fp4", False, seed=1))
    torch.save(model.state_dict(), tmp_path / "sd.pt")
    fresh = torch.nn.Sequential(Linear4bit(IN, OUT), torch.nn.ReLU(), Linear4bit(IN, OUT))
    fresh.load_state_dict(torch.load(tmp_path / "sd.pt", weights_only=True))
    x = torch.randn(2, IN, generator=gen(14))
    assert "2.weight.quant_state.bitsandbytes__fp4" in fresh.state_dict()
    assert torch.equal(fresh[0](x), model[0](x)) and torch.equal(fresh[2](x), model[2](x))


def test_state_dict_keep_vars_and_values():
    m = quantized("nf4", True)
    sd = m.state_dict(keep_vars=True)
    assert sd["weight"] is m.weight and sd["weight.absmax"] is m.weight.quant_state.absmax
    qs = F.QuantState.from_dict({k: v for k, v in sd.items() if k.startswith("weight.")}, device="cpu")
    assert qs == m.weight.quant_state


def test_dense_state_dict_then_move_equals_quantizing_directly():
    lin = dense_linear(3)
    m = Linear4bit(IN, OUT, quant_type="nf4")
    m.load_state_dict(lin.state_dict())
    m = m.to("cpu")
    packed, _ = F.quantize_4bit(lin.weight.detach(), quant_type="nf4", compress_statistics=True)
    assert torch.equal(m.weight.data, packed)


def test_dense_state_dict_into_a_quantized_module_is_quantized():
    m = quantized("fp4", False)
    lin = dense_linear(4)
    m.load_state_dict(lin.state_dict())
    packed, qs = F.quantize_4bit(lin.weight.detach(), quant_type="fp4")
    assert torch.equal(m.weight.data, packed) and m.weight.quant_state == qs and m.quant_state is m.weight.quant_state
    assert torch.equal(m.bias, lin.bias)


# --- bad input ------------------------------------------------------------------------------------


def _sd(**changes):
    sd = dict(quantized("nf4", True).state_dict())
    for k, v in changes.items():
        k = k.replace("__", ".").replace(".bitsandbytes.", ".bitsandbytes__")
        if v is None:
            sd.pop(k)
        else:
            sd[k] = v
    return sd


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"weight__quant_state__bitsandbytes__nf4": None}, "quant_type"),
        ({"weight__absmax": None}, "absmax"),
        ({"weight__nested_absmax": None}, "nested_absmax"),
        ({"weight__quant_state__bitsandbytes__nf4": torch.tensor(list(b"{not json"), dtype=torch.uint8)}, "JSON"),
        ({"weight__quant_map": torch.zeros(8)}, "quant_map"),
        ({"weight__absmax": torch.zeros(3, dtype=torch.uint8)}, "absmax"),
        ({"weight": torch.zeros(7, 1, dtype=torch.uint8)}, "bytes"),
    ],
    ids=["no-blob", "no-absmax", "no-nested-absmax", "garbled-blob", "short-quant-map", "absmax-count", "short-data"],
)
def test_garbled_quantization_keys_are_named(changes, match):
    with pytest.raises(RuntimeError, match=match) as info:
        Linear4bit(IN, OUT).load_state_dict(_sd(**changes))
    assert "weight" in str(info.value)


def test_packed_weight_without_its_quantization_keys():
    sd = {"weight": quantized().state_dict()["weight"], "bias": torch.zeros(OUT)}
    with pytest.raises(RuntimeError, match=r"weight\.absmax"):
        Linear4bit(IN, OUT).load_state_dict(sd)


def test_checkpoint_of_another_shape():
    sd = quantized().state_dict()
    sd["bias"] = torch.zeros(OUT // 2)
    with pytest.raises(RuntimeError, match=r"\[32, 64\].*\[16, 64\]"):
        Linear4bit(IN, OUT // 2).load_state_dict(sd)


def test_bad_constructor_arguments():
    with pytest.raises(ValueError, match="quant_type"):
        Linear4bit(IN, OUT, quant_type="int4")
    with pytest.raises(TypeError, match="quant_storage"):
        Linear4bit(IN, OUT, quant_storage=torch.int64)
    with pytest.raises(TypeError, match="compute_dtype"):
        Linear4bit(IN, OUT, compute_dtype=torch.int8)


def test_bad_forward_input():
    m = quantized()
    with pytest.raises(TypeError, match="floating point"):
        m(torch.ones(2, IN, dtype=torch.long))
    with pytest.raises(TypeError, match=r"x must be a torch\.Tensor"):
        m([[0.0] * IN])
    with pytest.raises(ValueError, match="meta"):
        m(torch.empty(2, IN, device="meta"))
    with pytest.raises(ValueError, match="K=64"):
        m(torch.ones(2, IN + 1))


def test_forward_before_quantization_says_what_to_do():
    with pytest.raises(RuntimeError, match=r"not quantized yet.*to\(device\)"):
        Linear4bit(IN, OUT)(torch.ones(1, IN))


def test_exported_at_the_upstream_paths():
    assert bnb.nn.Linear4bit is bnb.nn.modules.Linear4bit is Linear4bit
    assert bnb.nn.LinearNF4 is LinearNF4 and bnb.nn.LinearFP4 is LinearFP4
    assert Linear4bit.__name__ == "Linear4bit"


def test_whole_module_pickle_under_upstream_class_paths():
    m = torch.nn.Sequential(quantized("nf4", True, torch.bfloat16))
    blob = pickle.dumps(m)
    assert b"bitsandbytes.nn.modules" in blob and b"Linear4bit" in blob
    m2 = pickle.loads(blob)
    assert type(m2[0]) is Linear4bit and type(m2[0].weight) is Params4bit and m2[0].weight.module is m2[0]
    x = torch.randn(2, IN, generator=gen(15))
    assert torch.equal(m2(x), m(x))


def test_dense_state_dict_assigned_into_a_meta_module_still_quantizes_on_move():
    lin = dense_linear(5)
    m = LinearNF4(IN, OUT, device="meta")
    m.load_state_dict(lin.state_dict(), assign=True)
    assert type(m.weight) is Params4bit and not m.weight.bnb_quantized and m.weight.module is m
    m = m.to("cpu")
    packed, _ = F.quantize_4bit(lin.weight.detach(), quant_type="nf4", compress_statistics=True)
    assert torch.equal(m.weight.data, packed) and m.quant_state is m.weight.quant_state
    assert torch.equal(m.bias, lin.bias)
