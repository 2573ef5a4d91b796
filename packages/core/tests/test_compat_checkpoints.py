"""Checkpoints written by upstream bitsandbytes 0.50.2 load into this package and give upstream's results.

Fixtures: ``modules.pt`` and ``optimizers.pt`` from ``ci/make_compat_fixtures.py`` (``nox -s
compat-fixtures``, cases in ``ci/compat/checkpoints.py``, listed in metadata.json). The opposite
direction (upstream loading ours) is ``ci/compat/roundtrip.py``, run by ``nox -s tests``.

What must be identical: the stored bytes after loading (packed weights, absmax, int8 rows, SCB, the
optimizer's codes), the dequantized weights, and the state dict written back. Outputs go through a
matmul whose float accumulation order is the kernel's business, so they are compared to
``out_tolerance``: a few units of the output dtype's precision times sum(|x| * |w|) + |bias|, the
scale every rounding in a dot product is proportional to. An optimizer step is compared the same way
(a few float32 units of the parameter and of upstream's update), its requantized state to one code.
"""

from __future__ import annotations

import copy
import json
from functools import cache
from pathlib import Path

import pytest
import torch

import bitsandbytes as bnb
import bitsandbytes.functional as F

FIXTURES = Path(__file__).parent / "fixtures" / "upstream"
META = json.loads((FIXTURES / "metadata.json").read_text())
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
WRAPPED = "__bnb_optimizer_quant_state__"
# PagedAdamW8bit on CPU says once that it falls back to ordinary memory (as upstream does).
pytestmark = pytest.mark.filterwarnings("ignore:.*paged:UserWarning")
# Units of precision allowed in out_tolerance: each side rounds the weight to the compute dtype and the
# result to the output dtype once, and accumulates in at least that precision.
ULPS = 2
# For an optimizer step, in float32 units of the magnitudes involved: a handful of roundings in a
# different order (measured: up to 1.2).
STEP_ULPS = 4


@cache
def fixture(name: str) -> dict:
    return torch.load(FIXTURES / name, weights_only=True)


def module_cases(kind: str) -> list[str]:
    return sorted(n for n, p in META["files"]["modules.pt"].items() if p["module"] == kind)


def case(name: str) -> tuple[dict, dict]:
    """(parameters from metadata.json, a private copy of the recorded tensors)."""
    return META["files"]["modules.pt"][name], copy.deepcopy(fixture("modules.pt")[name])


def out_tolerance(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    scale = x.double().abs().reshape(-1, x.shape[-1]) @ w.double().abs().t()
    if bias is not None:
        scale = scale + bias.double().abs()
    return (ULPS * torch.finfo(dtype).eps * scale + torch.finfo(dtype).tiny).reshape(*x.shape[:-1], -1)


def assert_close_outputs(ours: torch.Tensor, theirs: torch.Tensor, tol: torch.Tensor) -> None:
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
    err = (ours.double() - theirs.double()).abs()
    assert torch.isfinite(ours).all()
    assert (err <= tol).all(), f"max error {err.max().item():.3g}, at most {(err / tol).max().item():.2f} x tolerance"


def identical(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype, shape and bytes (packed 4-bit codes stored as bfloat16 may read as NaN)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))


def coarser(*dtypes: torch.dtype) -> torch.dtype:
    return max(dtypes, key=lambda d: torch.finfo(d).eps)


# ---------------------------------------------------------------- Linear4bit


def fresh_linear4bit(p: dict) -> bnb.nn.Linear4bit:
    """Built as the saved one was, in its dtype (so the bias loads unconverted), and not quantized."""
    m = bnb.nn.Linear4bit(
        p["in_features"],
        p["out_features"],
        bias=p["bias"],
        compute_dtype=DTYPES[p["compute_dtype"]] if p["compute_dtype"] else None,
        compress_statistics=p["compress_statistics"],
        quant_type=p["quant_type"],
        quant_storage=getattr(torch, p["quant_storage"]),
    )
    return m.to(DTYPES[p["weight_dtype"]])


def check_linear4bit(m, p: dict, data: dict) -> None:
    sd = data["state_dict"]
    assert identical(m.weight.data, sd["weight"])
    state = m.weight.quant_state
    assert state.quant_type == p["quant_type"] and state.nested == p["compress_statistics"]
    assert tuple(state.shape) == (p["out_features"], p["in_features"]) and state.dtype == DTYPES[p["weight_dtype"]]
    w = F.dequantize_4bit(m.weight.data, state)
    assert identical(w, data["weight_dequant"])
    x, theirs = data["x"], data["y_train"]
    compute = DTYPES[p["compute_dtype"]] if p["compute_dtype"] else x.dtype
    tol = out_tolerance(x, w.to(compute), sd.get("bias"), coarser(compute, x.dtype))
    # Upstream's figure comes from training mode; ours must match it in both modes (upstream's own
    # AVX512-BF16 inference route rounds to bfloat16 and is deliberately not reproduced).
    for mode in ("train", "eval"):
        getattr(m, mode)()
        with torch.no_grad():
            assert_close_outputs(m(x.clone()), theirs, tol)


@pytest.mark.parametrize("name", module_cases("Linear4bit"))
def test_linear4bit_load_state_dict_into_fresh_module(name):
    p, data = case(name)
    m = fresh_linear4bit(p)
    result = m.load_state_dict(data["state_dict"])
    assert not result.missing_keys and not result.unexpected_keys
    check_linear4bit(m, p, data)


@pytest.mark.parametrize("name", module_cases("Linear4bit"))
def test_linear4bit_writes_back_upstream_state_dict(name):
    p, data = case(name)
    m = fresh_linear4bit(p)
    m.load_state_dict(data["state_dict"])
    ours, theirs = m.state_dict(), data["state_dict"]
    assert list(ours) == list(theirs)
    for key, value in theirs.items():
        assert identical(ours[key], value), key
    # Also after a forward pass in each mode (upstream rewrites its state on an AVX512-BF16 CPU here).
    for mode in ("train", "eval"):
        getattr(m, mode)()
        with torch.no_grad():
            m(data["x"].clone())
        ours = m.state_dict()
        assert list(ours) == list(theirs)
        assert all(identical(ours[k], v) for k, v in theirs.items()), mode


@pytest.mark.parametrize("name", module_cases("Linear4bit"))
def test_linear4bit_from_prequantized_like_transformers(name):
    """The path transformers takes: Params4bit.from_prequantized with the 'weight.*' entries."""
    p, data = case(name)
    sd = data["state_dict"]
    m = fresh_linear4bit(p)
    stats = {k.removeprefix("weight."): v for k, v in sd.items() if k.startswith("weight.")}
    m.weight = bnb.nn.Params4bit.from_prequantized(
        data=sd["weight"], quantized_stats=stats, requires_grad=False, device="cpu", module=m
    )
    if p["bias"]:
        m.bias = torch.nn.Parameter(sd["bias"], requires_grad=False)
    assert m.weight.quant_storage == getattr(torch, p["quant_storage"])
    assert m.weight.blocksize == 64 and m.weight.bnb_quantized
    check_linear4bit(m, p, data)


def test_linear4bit_garbled_blob_names_the_key():
    p, data = case("nf4-dq1-uint8")
    sd = data["state_dict"]
    sd["weight.quant_state.bitsandbytes__nf4"] = torch.tensor(list(b"{not json"), dtype=torch.uint8)
    with pytest.raises((ValueError, RuntimeError), match="bitsandbytes__nf4"):
        fresh_linear4bit(p).load_state_dict(sd)


def test_linear4bit_missing_absmax_names_the_key():
    p, data = case("nf4-dq0-uint8")
    sd = data["state_dict"]
    del sd["weight.absmax"]
    with pytest.raises((KeyError, ValueError, RuntimeError), match="absmax"):
        fresh_linear4bit(p).load_state_dict(sd)


# ---------------------------------------------------------------- Linear8bitLt


def fresh_linear8bit(p: dict) -> bnb.nn.Linear8bitLt:
    m = bnb.nn.Linear8bitLt(
        p["in_features"], p["out_features"], bias=True, has_fp16_weights=False, threshold=p["threshold"]
    )
    return m.to(DTYPES[p["dtype"]])


def dequantized_int8(sd: dict) -> torch.Tensor:
    return sd["weight"].double() * sd["SCB"].double().unsqueeze(1) / 127


def linear8bit_state(m) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 rows, row scales) wherever the module keeps them (upstream moves them to .state on use)."""
    scb = m.weight.SCB if getattr(m.weight, "SCB", None) is not None else m.state.SCB
    return m.weight.data, scb


@pytest.mark.parametrize("name", module_cases("Linear8bitLt"))
@pytest.mark.parametrize("quantize_first", [False, True], ids=["fresh", "quantized"])
def test_linear8bit_load_state_dict(name, quantize_first):
    """Into a freshly built module, and (upstream's only way) into one already moved to the device."""
    p, data = case(name)
    sd = data["state_dict"]
    m = fresh_linear8bit(p)
    if quantize_first:
        m = m.to("cpu")
    result = m.load_state_dict(sd)
    assert not result.missing_keys and not result.unexpected_keys
    cb, scb = linear8bit_state(m)
    assert cb.dtype == torch.int8 and torch.equal(cb, sd["weight"])
    assert scb.dtype == torch.float32 and torch.equal(scb, sd["SCB"])
    assert m.bias.dtype == sd["bias"].dtype and torch.equal(m.bias, sd["bias"])
    x = data["x"]
    tol = out_tolerance(x, dequantized_int8(sd), sd["bias"], x.dtype)
    # Each mode against upstream's output in that mode: on CPU training mode is the float route
    # (MatMul8bitFp), evaluation mode LLM.int8(), in both packages.
    for mode in ("train", "eval"):
        getattr(m, mode)()
        with torch.no_grad():
            assert_close_outputs(m(x.clone()), data[f"y_{mode}"], tol)
    ours = m.state_dict()
    assert list(ours) == list(sd)
    assert all(identical(ours[k], v) for k, v in sd.items())


@pytest.mark.parametrize("name", module_cases("Linear8bitLt"))
def test_upstream_cpu_training_route_is_a_float_matmul(name):
    """The fact our routing follows, read off upstream's own outputs: in training mode on CPU upstream
    multiplies the unquantized activations by the dequantized weight (MatMul8bitFp), and its
    evaluation-mode output (LLM.int8()) differs from that."""
    _, data = case(name)
    sd, x = data["state_dict"], data["x"]
    w = dequantized_int8(sd)
    dense = (x.double() @ w.t() + sd["bias"].double()).to(x.dtype)
    tol = out_tolerance(x, w, sd["bias"], x.dtype)
    assert_close_outputs(data["y_train"], dense, tol)
    assert not torch.equal(data["y_train"], data["y_eval"])


@pytest.mark.parametrize(
    "weight_format", [None, 0, "row", torch.tensor(0)], ids=["absent", "int", "str", "int64-tensor"]
)
def test_linear8bit_other_spellings_of_row_format(weight_format):
    """Older checkpoints lack the entry or spell it otherwise; upstream reads all of these as 'row'."""
    p, data = case("int8-t0-fp16")
    sd = data["state_dict"]
    if weight_format is None:
        del sd["weight_format"]
    else:
        sd["weight_format"] = weight_format
    m = fresh_linear8bit(p)
    m.load_state_dict(sd)
    m.eval()
    tol = out_tolerance(data["x"], dequantized_int8(sd), sd["bias"], torch.float16)
    with torch.no_grad():
        assert_close_outputs(m(data["x"].clone()), data["y_eval"], tol)


def test_linear8bit_rejects_unknown_weight_format():
    p, data = case("int8-t0-fp16")
    sd = data["state_dict"]
    sd["weight_format"] = torch.tensor(3, dtype=torch.uint8)
    with pytest.raises((ValueError, RuntimeError), match="weight_format"):
        fresh_linear8bit(p).load_state_dict(sd)


# ---------------------------------------------------------------- 8-bit optimizers


def optimizer_cases() -> list[str]:
    return sorted(META["files"]["optimizers.pt"])


def optimizer_case(name: str):
    p = META["files"]["optimizers.pt"][name]
    data = copy.deepcopy(fixture("optimizers.pt")[name])
    params = [torch.nn.Parameter(t.clone()) for t in data["params"]]
    kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in p["kwargs"].items()}
    return getattr(bnb.optim, p["optimizer"]), kwargs, params, data


def take_step(opt, params, grads) -> None:
    for param, g in zip(params, grads, strict=True):
        param.grad = g.clone()
    opt.step()


def layout(sd: dict) -> dict:
    """What a state dict holds, without the values: keys, and dtype and shape of every tensor."""

    def describe(v):
        if isinstance(v, torch.Tensor):
            return (v.dtype, tuple(v.shape))
        if isinstance(v, dict):
            return {k: describe(x) for k, x in v.items()}
        return type(v).__name__

    return {"state": describe(sd["state"]), "groups": [sorted(g) for g in sd["param_groups"]]}


@pytest.mark.parametrize("name", optimizer_cases())
def test_optimizer_continues_upstream_state(name):
    cls, kwargs, params, data = optimizer_case(name)
    opt = cls(params, **kwargs)
    opt.load_state_dict(data["state_dict"])
    take_step(opt, params, data["grads"])
    eps32 = torch.finfo(torch.float32).eps
    for ours, before, theirs in zip(params, data["params"], data["params_next"], strict=True):
        tol = STEP_ULPS * eps32 * (before.abs() + (theirs - before).abs()) + torch.finfo(torch.float32).tiny
        err = (ours.detach() - theirs).abs()
        assert (err <= tol).all(), f"max error {err.max().item():.3g}"
        assert not torch.equal(theirs, before)  # the step moved every parameter tensor
    sd, expected = opt.state_dict(), data["state_dict_next"]
    assert layout(sd) == layout(expected)
    for i, state in expected["state"].items():
        assert sd["state"][i]["step"] == state["step"]
        ours_q, theirs_q, before_q = sd["state"][i][WRAPPED], state[WRAPPED], data["state_dict"]["state"][i][WRAPPED]
        for key, value in theirs_q.items():
            if value.dtype == torch.uint8:
                # Requantized codes: the nearest code of a float32 value both sides compute in their own
                # order, so a value near a midpoint may land on either side.
                diff = (ours_q[key].long() - value.long()).abs()
                assert diff.max() <= 1 and (diff > 0).float().mean() < 0.02, key
            elif key.startswith("qmap"):
                assert torch.equal(ours_q[key], value), key
            else:
                # absmax, or a 32-bit state: an EMA of g (state1) or g * g (state2), whose terms may cancel.
                terms = value.abs()
                if not key.startswith("absmax"):
                    g = data["grads"][i].abs()
                    terms = terms + before_q[key].abs() + (g * g if key == "state2" else g)
                err = (ours_q[key] - value).abs()
                assert (err <= STEP_ULPS * eps32 * terms).all(), f"{key}: max error {err.max().item():.3g}"


@pytest.mark.parametrize("name", optimizer_cases())
def test_optimizer_loads_upstream_state_exactly(name):
    cls, kwargs, params, data = optimizer_case(name)
    opt = cls(params, **kwargs)
    opt.load_state_dict(data["state_dict"])
    sd, expected = opt.state_dict(), data["state_dict"]
    assert layout(sd) == layout(expected)
    assert [{k: v for k, v in g.items() if k != "params"} for g in sd["param_groups"]] == [
        {k: v for k, v in g.items() if k != "params"} for g in expected["param_groups"]
    ]
    for i, state in expected["state"].items():
        assert sd["state"][i]["step"] == state["step"]
        for key, value in state[WRAPPED].items():
            assert torch.equal(sd["state"][i][WRAPPED][key], value), key


@pytest.mark.parametrize("name", optimizer_cases())
def test_optimizer_writes_upstream_layout(name):
    """A fresh optimizer of ours, one step: the same keys, dtypes, shapes and groups as upstream's."""
    cls, kwargs, params, data = optimizer_case(name)
    opt = cls(params, **kwargs)
    take_step(opt, params, data["grads"])
    expected = copy.deepcopy(data["state_dict_next"])
    for state in expected["state"].values():
        state["step"] = 1
    assert layout(opt.state_dict()) == layout(expected)
    groups = [{k: v for k, v in g.items() if k != "params"} for g in opt.state_dict()["param_groups"]]
    assert groups == [{k: v for k, v in g.items() if k != "params"} for g in expected["param_groups"]]


def test_optimizer_loads_unwrapped_layout():
    """The quantization state directly in each parameter's state (no wrapping key), as older releases
    wrote it; upstream's load_state_dict accepts it too."""
    cls, kwargs, params, data = optimizer_case("Adam8bit")
    sd = data["state_dict"]
    for state in sd["state"].values():
        state.update(state.pop(WRAPPED))
    opt = cls(params, **kwargs)
    opt.load_state_dict(sd)
    assert sorted(opt.state_dict()["state"][0]) == ["__bnb_optimizer_quant_state__", "step"]
    take_step(opt, params, data["grads"])
    eps32 = torch.finfo(torch.float32).eps
    for ours, before, theirs in zip(params, data["params"], data["params_next"], strict=True):
        assert ((ours.detach() - theirs).abs() <= STEP_ULPS * eps32 * (before.abs() + (theirs - before).abs())).all()


def test_optimizer_state_of_wrong_shape_names_the_key():
    cls, kwargs, params, data = optimizer_case("Adam8bit")
    opt = cls(params, **kwargs)
    sd = data["state_dict"]
    sd["state"][0][WRAPPED]["state1"] = sd["state"][0][WRAPPED]["state1"].reshape(-1)[:100]
    with pytest.raises((ValueError, RuntimeError), match="state1"):
        opt.load_state_dict(sd)
        take_step(opt, params, data["grads"])
