"""Regression tests for what the atheris fuzzers (ci/fuzz/, `nox -s fuzz`) found in the Python entry points:
each input that once escaped as an unclear error now gets a clear one naming the key. The inputs themselves
are also kept in ci/fuzz/corpus/<target>/regression-* and replayed by every fuzz run."""

from __future__ import annotations

import pytest
import torch

import bitsandbytes as bnb
import bitsandbytes.functional as F
from bitsandbytes.utils import unpack_tensor_to_dict


def _blob(text: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(text), dtype=torch.uint8)


# json.loads raises RecursionError for deep nesting and a ValueError that names nothing for integers longer
# than Python's int_max_str_digits (4300 by default).
UNCLEAR_JSON = {
    "deep nesting": b"[" * 5000,
    "deep objects": b'{"a":' * 5000,
    "4400-digit int": b'{"a": 1' + b"0" * 4400 + b"}",
}


@pytest.mark.parametrize("text", UNCLEAR_JSON.values(), ids=UNCLEAR_JSON.keys())
def test_unpack_tensor_to_dict_refuses_unparsable_json_naming_the_argument(text):
    with pytest.raises(ValueError, match="tensor_data does not hold valid UTF-8 JSON"):
        unpack_tensor_to_dict(_blob(text))


@pytest.mark.parametrize("text", UNCLEAR_JSON.values(), ids=UNCLEAR_JSON.keys())
def test_quant_state_from_dict_refuses_unparsable_blob_naming_the_key(text):
    _, qs = F.quantize_4bit(torch.randn(4, 64), quant_type="nf4")
    items = {"weight." + k: v for k, v in qs.as_dict(packed=True).items()}
    items["weight.quant_state.bitsandbytes__nf4"] = _blob(text)
    with pytest.raises(ValueError, match=r"weight\.quant_state\.bitsandbytes__nf4 does not hold valid UTF-8 JSON"):
        F.QuantState.from_dict(items, "cpu")


def _adam8bit_state_dict():
    p = torch.nn.Parameter(torch.randn(300))
    opt = bnb.optim.Adam8bit([p], min_8bit_size=0)
    p.grad = torch.ones_like(p)
    opt.step()
    return opt.state_dict()


# int(step) of NaN / Inf raised ValueError / OverflowError naming nothing; a step past int64 loaded and then
# failed inside the op's schema check at the next step().
BAD_STEPS = {
    "nan": float("nan"),
    "inf": float("inf"),
    "nan tensor": torch.tensor(float("nan")),
    "past int64": 2**70,
    "int64 max": 2**63 - 1,
    "huge float": 1e300,
}


@pytest.mark.parametrize("step", BAD_STEPS.values(), ids=BAD_STEPS.keys())
def test_optimizer_refuses_a_step_that_is_not_an_int64_count(step):
    sd = _adam8bit_state_dict()
    sd["state"][0]["step"] = step
    p = torch.nn.Parameter(torch.randn(300))
    fresh = bnb.optim.Adam8bit([p], min_8bit_size=0)
    with pytest.raises(ValueError, match=r"state_dict\['state'\]\[0\]\['step'\] must be an int >= 0 and < 2\*\*63 - 1"):
        fresh.load_state_dict(sd)
    assert len(fresh.state) == 0


def test_optimizer_still_loads_a_large_valid_step():
    sd = _adam8bit_state_dict()
    sd["state"][0]["step"] = 2**40
    p = torch.nn.Parameter(torch.randn(300))
    fresh = bnb.optim.Adam8bit([p], min_8bit_size=0)
    fresh.load_state_dict(sd)
    p.grad = torch.ones_like(p)
    fresh.step()
    assert fresh.state[p]["step"] == 2**40 + 1


@pytest.mark.parametrize("rows", [(1,), (3,), (2, 2)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_bias", [False, True])
def test_matmul_4bit_with_zero_in_features_is_bias_or_zeros(rows, dtype, with_bias):
    """K == 0: torch's linear gives the bias (or zeros); this returned uninitialized memory, as upstream does."""
    q, qs = F.quantize_4bit(torch.empty(3, 0, dtype=dtype), quant_type="nf4")
    A = torch.empty(*rows, 0, dtype=dtype)
    bias = torch.tensor([1.0, -2.0, 3.0], dtype=dtype) if with_bias else None
    want = torch.nn.functional.linear(A, torch.empty(3, 0, dtype=dtype), bias)
    assert torch.equal(bnb.matmul_4bit(A, q.t(), quant_state=qs, bias=bias), want)
    A.requires_grad_(True)  # the autograd path
    assert torch.equal(bnb.matmul_4bit(A, q.t(), quant_state=qs, bias=bias).detach(), want)


def _nf4_items():
    _, qs = F.quantize_4bit(torch.randn(8, 64), quant_type="nf4", compress_statistics=True)
    return qs.as_dict(packed=True)


def test_quant_state_refuses_a_foreign_4bit_table():
    """dequantize_4bit decodes with quant_type's table and gemv_4bit with quant_map: a checkpoint whose quant_map is
    anything else gave a batch-size-dependent result (zeros from one row, the NF4 weight from two)."""
    items = _nf4_items()
    items["quant_map"] = torch.zeros(16)
    with pytest.raises(ValueError, match="quant_map must be the nf4 code table"):
        F.QuantState.from_dict(items, "cpu")
    items["quant_map"] = F.get_4bit_type("fp4", device="cpu")  # the other type's table
    with pytest.raises(ValueError, match="quant_map must be the nf4 code table"):
        F.QuantState.from_dict(items, "cpu")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_quant_state_accepts_the_table_in_any_float_dtype(dtype):
    items = _nf4_items()
    items["quant_map"] = items["quant_map"].to(dtype)
    assert F.QuantState.from_dict(items, "cpu").quant_type == "nf4"
    # ...and replaced by the exact table, so gemv_4bit (which reads it) and dequantize_4bit decode alike.
    assert torch.equal(F.QuantState.from_dict(items, "cpu").code, F.get_4bit_type("nf4", device="cpu"))
