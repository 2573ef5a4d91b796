"""QuantState: upstream's serialized format, round trips, and refusal of malformed dicts."""

import json
import pickle

import pytest
import torch

import bitsandbytes.functional as F
from bitsandbytes.functional import QuantState

PLAIN_KEYS = ["quant_type", "absmax", "blocksize", "quant_map", "dtype", "shape"]
NESTED_KEYS = [*PLAIN_KEYS, "nested_absmax", "nested_blocksize", "nested_quant_map", "nested_dtype", "nested_offset"]


def make_state(nested: bool, quant_type: str = "nf4", dtype=torch.float16):
    torch.manual_seed(0)
    return F.quantize_4bit(torch.randn(4, 96, dtype=dtype), quant_type=quant_type, compress_statistics=nested)


def test_as_dict_keys_and_values():
    _, state = make_state(nested=False)
    d = state.as_dict()
    assert list(d) == PLAIN_KEYS
    assert d["quant_type"] == "nf4" and d["blocksize"] == 64 and d["dtype"] == "float16" and d["shape"] == (4, 96)
    assert d["absmax"] is state.absmax and d["quant_map"] is state.code
    _, nested = make_state(nested=True, dtype=torch.bfloat16)
    d = nested.as_dict()
    assert list(d) == NESTED_KEYS
    assert d["dtype"] == "bfloat16" and d["nested_blocksize"] == 256 and d["nested_dtype"] == "float32"
    assert isinstance(d["nested_offset"], float) and d["nested_offset"] == nested.offset.item()
    assert torch.equal(d["nested_quant_map"], nested.state2.code)
    assert d["nested_quant_map"].data_ptr() != nested.state2.code.data_ptr()  # not shared (safetensors)


def test_packed_blob_is_upstream_json():
    _, state = make_state(nested=False)
    packed = state.as_dict(packed=True)
    assert list(packed) == ["absmax", "quant_map", "quant_state.bitsandbytes__nf4"]
    blob = packed["quant_state.bitsandbytes__nf4"]
    assert blob.dtype == torch.uint8 and blob.dim() == 1
    text = bytes(blob.tolist()).decode()
    assert text == '{"quant_type": "nf4", "blocksize": 64, "dtype": "float16", "shape": [4, 96]}'
    _, nested = make_state(nested=True, quant_type="fp4", dtype=torch.float32)
    packed = nested.as_dict(packed=True)
    assert list(packed) == [
        "absmax",
        "quant_map",
        "nested_absmax",
        "nested_quant_map",
        "quant_state.bitsandbytes__fp4",
    ]
    text = bytes(packed["quant_state.bitsandbytes__fp4"].tolist()).decode()
    offset = json.dumps(nested.offset.item())
    assert text == (
        '{"quant_type": "fp4", "blocksize": 64, "dtype": "float32", "shape": [4, 96], '
        f'"nested_blocksize": 256, "nested_dtype": "float32", "nested_offset": {offset}}}'
    )


def test_state_without_quant_type_is_not_packed():
    _, state = F.quantize_blockwise(torch.randn(100), blocksize=64)
    assert list(state.as_dict(packed=True)) == PLAIN_KEYS


@pytest.mark.parametrize("nested", [False, True])
@pytest.mark.parametrize("packed", [False, True])
def test_from_dict_round_trip(nested, packed):
    q, state = make_state(nested)
    d = state.as_dict(packed=packed)
    snapshot = dict(d)
    restored = QuantState.from_dict(d, device="cpu")
    assert d.keys() == snapshot.keys()  # the caller's dict is left alone
    assert restored == state
    assert restored.nested == nested and restored.shape == torch.Size([4, 96]) and restored.dtype == torch.float16
    assert torch.equal(F.dequantize_4bit(q, restored), F.dequantize_4bit(q, state))


def test_from_dict_accepts_prefixed_keys_and_moves_to_device():
    _, state = make_state(nested=True)
    d = {f"model.layer.weight.{k}": v for k, v in state.as_dict(packed=True).items()}
    restored = QuantState.from_dict(d, device=torch.device("meta"))
    assert restored.absmax.device.type == "meta" and restored.state2.absmax.device.type == "meta"
    assert restored.offset.device.type == "meta" and restored.code.device.type == "meta"


def test_to_moves_every_tensor():
    _, state = make_state(nested=True)
    assert state.to("meta") is state
    tensors = [state.absmax, state.code, state.offset, state.state2.absmax, state.state2.code]
    assert all(t.device.type == "meta" for t in tensors)


def test_equality():
    _, a = make_state(nested=True)
    _, b = make_state(nested=True)
    assert a == b
    b.absmax = b.absmax.clone()
    b.absmax[0] += 1
    assert a != b
    _, c = make_state(nested=False)
    assert a != c and c != a
    assert a != "not a state"


def test_legacy_list_indexing():
    _, plain = make_state(nested=False)
    assert plain[0] is plain.absmax and plain[1] == plain.shape and plain[2] == plain.dtype
    assert plain[3] == 64 and plain[4] is None and plain[5] == "nf4"
    _, nested = make_state(nested=True)
    assert nested[4][0] is nested.offset and nested[4][1] is nested.state2
    assert nested[-1] == "nf4"


def test_pickle_names_upstream_module():
    _, state = make_state(nested=True)
    assert QuantState.__module__ == "bitsandbytes.functional"
    data = pickle.dumps(state)
    assert b"bitsandbytes.functional" in data
    assert pickle.loads(data) == state


def test_packed_key_attribute_for_fsdp():
    _, state = make_state(nested=False)
    assert torch.equal(state.bitsandbytes__nf4, state.as_dict(packed=True)["quant_state.bitsandbytes__nf4"])
    with pytest.raises(AttributeError):
        _ = state.bitsandbytes__fp4
    with pytest.raises(AttributeError):
        _ = state.no_such_thing


# ------------------------------------------------------------------------------------------------
# malformed dicts


def unpacked(nested=True):
    _, state = make_state(nested)
    return state.as_dict()


def without(d, key):
    return {k: v for k, v in d.items() if k != key}


def blob(obj) -> torch.Tensor:
    return torch.tensor(list(json.dumps(obj).encode()), dtype=torch.uint8)


@pytest.mark.parametrize("key", NESTED_KEYS[1:])
def test_missing_key_is_named(key):
    with pytest.raises(ValueError, match=key):
        QuantState.from_dict(without(unpacked(), key), "cpu")


def test_missing_quant_type_and_packed_item():
    with pytest.raises(ValueError, match="quant_type"):
        QuantState.from_dict(without(unpacked(), "quant_type"), "cpu")


def test_extra_key_is_named():
    d = unpacked()
    d["bias"] = torch.zeros(3)
    with pytest.raises(ValueError, match="bias"):
        QuantState.from_dict(d, "cpu")


@pytest.mark.parametrize(
    ("key", "value", "exc"),
    [
        ("blocksize", "64", TypeError),
        ("blocksize", 100, ValueError),
        ("blocksize", True, TypeError),
        ("dtype", torch.float16, TypeError),
        ("dtype", "int8", ValueError),
        ("shape", "4x96", TypeError),
        ("shape", [4, -96], ValueError),
        ("shape", [4, 200], ValueError),  # absmax no longer has one entry per block
        ("quant_type", 4, TypeError),
        ("quant_type", "int4", ValueError),
        ("absmax", [1.0, 2.0], TypeError),
        ("quant_map", torch.arange(16), TypeError),
        ("quant_map", torch.zeros(15), ValueError),
        ("nested_absmax", torch.ones(5), ValueError),
        ("nested_blocksize", 255, ValueError),
        ("nested_dtype", None, TypeError),
        ("nested_offset", "0.1", TypeError),
        ("nested_quant_map", torch.zeros(16), ValueError),
    ],
)
def test_wrong_typed_value_is_named(key, value, exc):
    d = unpacked()
    d[key] = value
    with pytest.raises(exc, match=key):
        QuantState.from_dict(d, "cpu")


def test_plain_absmax_must_be_float():
    d = unpacked(nested=False)
    d["absmax"] = d["absmax"].to(torch.uint8)
    with pytest.raises(TypeError, match="absmax"):
        QuantState.from_dict(d, "cpu")


def test_partial_nested_items():
    with pytest.raises(ValueError, match="nested_offset"):
        QuantState.from_dict(without(unpacked(), "nested_offset"), "cpu")


def test_malformed_packed_items():
    _, state = make_state(nested=False)
    packed = state.as_dict(packed=True)
    key = "quant_state.bitsandbytes__nf4"
    tensors = without(packed, key)
    with pytest.raises(ValueError, match="bitsandbytes__int4"):
        QuantState.from_dict({**tensors, "quant_state.bitsandbytes__int4": packed[key]}, "cpu")
    with pytest.raises(ValueError, match="at most one"):
        QuantState.from_dict({**packed, "other.quant_state.bitsandbytes__fp4": packed[key]}, "cpu")
    with pytest.raises(TypeError, match=key):
        QuantState.from_dict({**tensors, key: packed[key].to(torch.int32)}, "cpu")
    with pytest.raises(ValueError, match=key):
        QuantState.from_dict({**tensors, key: torch.tensor([0xFF, 0x7B], dtype=torch.uint8)}, "cpu")
    with pytest.raises(ValueError, match=key):
        QuantState.from_dict({**tensors, key: blob([1, 2])}, "cpu")
    meta = {"quant_type": "fp4", "blocksize": 64, "dtype": "float16", "shape": [4, 96]}
    with pytest.raises(ValueError, match="quant_type"):
        QuantState.from_dict({**tensors, key: blob(meta)}, "cpu")
    with pytest.raises(ValueError, match="blocksize"):
        QuantState.from_dict({**tensors, "blocksize": 64, key: blob({**meta, "quant_type": "nf4"})}, "cpu")
    with pytest.raises(ValueError, match="neither"):
        QuantState.from_dict(tensors, "cpu")


def test_from_dict_argument_types():
    with pytest.raises(TypeError, match="qs_dict"):
        QuantState.from_dict([("absmax", torch.ones(1))], "cpu")
    with pytest.raises(TypeError, match="device"):
        QuantState.from_dict(unpacked(), device=3.5)
