"""Params4bit: quantize on first move, never again; the client rebuild patterns; copy, pickle, chunk."""

import copy
import io
import pickle

import pytest
import torch

import bitsandbytes as bnb
import bitsandbytes.functional as F
from bitsandbytes.nn import Linear4bit, Params4bit
from bitsandbytes.nn.params4bit import fix_4bit_weight_quant_state_from_module

# The attributes upstream 0.50 keeps in __dict__, which clients pass back as keywords.
UPSTREAM_KEYS = {
    "blocksize",
    "compress_statistics",
    "quant_type",
    "quant_state",
    "quant_storage",
    "bnb_quantized",
    "module",
}


def dense(shape=(16, 64), seed=0, dtype=torch.float32):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def raw(t: torch.Tensor) -> torch.Tensor:
    """The bytes of a tensor (bf16-viewed packed codes may hold NaN patterns, so compare bytes)."""
    return t.contiguous().view(torch.uint8)


def test_defaults_and_dict_match_upstream():
    p = Params4bit(dense())
    assert set(p.__dict__) == UPSTREAM_KEYS
    assert (p.blocksize, p.compress_statistics, p.quant_type, p.quant_storage) == (64, True, "fp4", torch.uint8)
    assert p.quant_state is None and p.module is None and p.bnb_quantized is False
    assert p.requires_grad is False
    assert Params4bit().shape == (0,)


def test_positional_arguments_in_upstream_order():
    p = Params4bit(dense(), False, None, 128, False, "nf4", torch.bfloat16, None, False)
    assert (p.blocksize, p.compress_statistics, p.quant_type, p.quant_storage) == (128, False, "nf4", torch.bfloat16)


@pytest.mark.parametrize("move", ["to", "cpu", "to_device_obj", "to_kw"])
def test_first_move_quantizes_even_cpu_to_cpu(move):
    w = dense()
    p = Params4bit(w.clone(), quant_type="nf4", compress_statistics=False)
    q = {
        "to": lambda: p.to("cpu"),
        "cpu": lambda: p.cpu(),
        "to_device_obj": lambda: p.to(torch.device("cpu")),
        "to_kw": lambda: p.to(device="cpu"),
    }[move]()
    assert isinstance(q, Params4bit) and q.bnb_quantized
    packed, qs = F.quantize_4bit(w, blocksize=64, quant_type="nf4")
    assert torch.equal(q.data, packed)
    assert q.quant_state == qs
    assert q.dtype == torch.uint8 and q.shape == (16 * 64 // 2, 1)


def test_never_requantizes():
    p = Params4bit(dense(), quant_type="nf4").to("cpu")
    data, qs = p.data.clone(), p.quant_state
    again = p.to("cpu").to(torch.device("cpu")).cpu()
    assert again.bnb_quantized and again.quant_state is qs
    assert torch.equal(again.data, data)


def test_dtype_moves_keep_packed_codes():
    # Upstream casts the packed codes to the new dtype (model.half() destroys a bf16-stored weight).
    p = Params4bit(dense(), quant_storage=torch.bfloat16).to("cpu")
    before = raw(p.data).clone()
    for dt in (torch.float16, torch.float32):
        q = p.to(dt)
        assert q.dtype == torch.bfloat16 and torch.equal(raw(q.data), before)
    m = Linear4bit(64, 16, quant_storage=torch.bfloat16).to("cpu")
    before = raw(m.weight.data).clone()
    m.half().float().double()
    assert m.weight.dtype == torch.bfloat16 and torch.equal(raw(m.weight.data), before)


def test_dtype_move_before_quantization_converts_values():
    p = Params4bit(dense()).to(torch.float16)
    assert isinstance(p, Params4bit) and not p.bnb_quantized and p.dtype == torch.float16
    q = p.to("cpu")
    assert q.quant_state.dtype == torch.float16


def test_meta_stays_unquantized_and_cannot_be_quantized():
    p = Params4bit(torch.empty(16, 64, device="meta"), quant_type="nf4")
    q = p.to("meta")
    assert isinstance(q, Params4bit) and not q.bnb_quantized and q.quant_type == "nf4"
    with pytest.raises(ValueError, match="meta"):
        p.to("cpu")


def test_client_rebuild_pattern_from_meta_module():
    # transformers: Params4bit(value, requires_grad=False, **old_value.__dict__).to(value.device)
    m = Linear4bit(64, 16, compress_statistics=False, quant_type="nf4", quant_storage=torch.bfloat16, device="meta")
    old = m.weight
    old._is_hf_initialized = True  # attributes other libraries add must be tolerated
    w = dense()
    new = Params4bit(w, requires_grad=False, **old.__dict__).to(w.device)
    assert new.bnb_quantized and new.quant_type == "nf4" and new.quant_storage == torch.bfloat16
    assert new.module is m and m.quant_state is new.quant_state
    assert "data" not in new.__dict__ and "requires_grad" not in new.__dict__
    expect = F.dequantize_4bit(*F.quantize_4bit(w, quant_type="nf4"))
    assert torch.equal(F.dequantize_4bit(new.data, new.quant_state), expect)


def test_peft_requantize_pattern():
    # PEFT merge: kwargs = weight.__dict__ with bnb_quantized=False, then Params4bit(w, **kwargs).to(device).
    p = Params4bit(dense(seed=1), quant_type="nf4").to("cpu")
    kwargs = dict(p.__dict__, bnb_quantized=False, requires_grad=False)
    w2 = dense(seed=2)
    q = Params4bit(w2, **kwargs).to("cpu")
    assert q.bnb_quantized and q.quant_state is not p.quant_state
    expect = F.dequantize_4bit(*F.quantize_4bit(w2, quant_type="nf4", compress_statistics=True))
    assert torch.equal(F.dequantize_4bit(q.data, q.quant_state), expect)


@pytest.mark.parametrize("storage", [torch.uint8, torch.bfloat16, torch.float32])
def test_quant_storage_views_the_packed_bytes(storage):
    w = dense()
    p = Params4bit(w, quant_type="nf4", quant_storage=storage).to("cpu")
    ref, _ = F.quantize_4bit(w, quant_type="nf4", compress_statistics=True)
    assert p.dtype == storage
    assert torch.equal(raw(p.data).reshape(-1), ref.reshape(-1))


@pytest.mark.parametrize("nested", [False, True])
def test_from_prequantized(nested):
    w = dense()
    packed, qs = F.quantize_4bit(w, quant_type="fp4", compress_statistics=nested, quant_storage=torch.bfloat16)
    stats = {"weight." + k: v for k, v in qs.as_dict(packed=True).items()}
    m = Linear4bit(64, 16, device="meta")
    p = Params4bit.from_prequantized(packed, stats, requires_grad=False, device="cpu", module=m)
    assert p.bnb_quantized and p.quant_type == "fp4" and p.compress_statistics is nested
    assert p.quant_storage == torch.bfloat16 and p.blocksize == 64
    assert m.quant_state is p.quant_state
    assert torch.equal(F.dequantize_4bit(p.data, p.quant_state), F.dequantize_4bit(packed, qs))


def test_from_prequantized_rejects_bad_input():
    packed, qs = F.quantize_4bit(dense(), quant_type="nf4")
    stats = qs.as_dict(packed=True)
    with pytest.raises(ValueError, match="bytes"):
        Params4bit.from_prequantized(packed[:-1], stats, device="cpu")
    with pytest.raises(ValueError, match="absmax"):
        Params4bit.from_prequantized(packed, {k: v for k, v in stats.items() if k != "absmax"}, device="cpu")
    with pytest.raises(TypeError, match="data"):
        Params4bit.from_prequantized(packed.tolist(), stats, device="cpu")


@pytest.mark.parametrize("op", ["chunk", "split", "method_chunk", "method_split"])
def test_chunk_and_split_keep_metadata(op):
    m = Linear4bit(64, 16, quant_type="nf4").to("cpu")
    p = m.weight
    parts = {
        "chunk": lambda: torch.chunk(p, 4),
        "split": lambda: torch.split(p, 128),
        "method_chunk": lambda: p.chunk(4),
        "method_split": lambda: p.split(128),
    }[op]()
    assert len(parts) == 4
    for part in parts:
        assert type(part) is Params4bit
        assert part.quant_state is p.quant_state and part.module is m and part.bnb_quantized
        assert (part.quant_type, part.blocksize, part.quant_storage) == ("nf4", 64, torch.uint8)
    assert torch.equal(torch.cat([t.data for t in parts]), p.data)


def test_other_ops_give_plain_tensors():
    p = Params4bit(dense(), quant_type="nf4").to("cpu")
    assert type(p.detach()) is torch.Tensor and type(p + 0) is torch.Tensor


def test_copy_shares_and_deepcopy_separates():
    p = Params4bit(dense(), quant_type="nf4").to("cpu")
    shallow = copy.copy(p)
    assert type(shallow) is Params4bit and shallow.quant_state is p.quant_state
    deep = copy.deepcopy(p)
    assert type(deep) is Params4bit and deep.quant_state is not p.quant_state and deep.quant_state == p.quant_state
    assert deep.data_ptr() != p.data_ptr() and torch.equal(deep.data, p.data)
    assert set(deep.__dict__) == UPSTREAM_KEYS


def test_deepcopy_of_a_module_points_the_weight_at_the_copy():
    m = Linear4bit(64, 16, quant_type="nf4").to("cpu")
    m2 = copy.deepcopy(m)
    assert m2.weight.module is m2 and copy.deepcopy(m.weight).module is m
    x = dense((2, 64))
    assert torch.equal(m2(x), m(x))


@pytest.mark.parametrize("via", ["pickle", "torch.save"])
def test_pickle_keeps_the_class_and_state(via):
    # Upstream unpickles a plain Parameter that has lost its quant_state.
    p = Params4bit(dense(), quant_type="nf4", quant_storage=torch.bfloat16).to("cpu")
    if via == "pickle":
        q = pickle.loads(pickle.dumps(p))
    else:
        buf = io.BytesIO()
        torch.save(p, buf)
        buf.seek(0)
        q = torch.load(buf, weights_only=False)
    assert type(q) is Params4bit and q.bnb_quantized and q.quant_storage == torch.bfloat16
    assert set(q.__dict__) == UPSTREAM_KEYS
    assert torch.equal(F.dequantize_4bit(q.data, q.quant_state), F.dequantize_4bit(p.data, p.quant_state))


def test_fsdp_proxy_properties():
    nested = Params4bit(dense(), quant_type="nf4", compress_statistics=True).to("cpu")
    qs = nested.quant_state
    assert nested.absmax is qs.absmax and nested.code is qs.code and nested.quant_map is qs.code
    assert nested.offset is qs.offset and nested.state2 is qs.state2 and nested.nested_offset is qs.offset
    assert nested.nested_absmax is qs.state2.absmax and nested.nested_quant_map is qs.state2.code
    assert nested.nested_blocksize == 256 and nested.nested_dtype == torch.float32
    assert torch.equal(nested.quant_state.bitsandbytes__nf4, qs.as_dict(packed=True)["quant_state.bitsandbytes__nf4"])
    flat = Params4bit(dense(), compress_statistics=False).to("cpu")
    assert flat.absmax is flat.quant_state.absmax
    for name in ("nested_absmax", "nested_blocksize", "nested_quant_map", "nested_dtype"):
        with pytest.raises(AttributeError, match=name):
            getattr(flat, name)
    with pytest.raises(AttributeError, match="absmax"):
        _ = Params4bit(dense()).absmax


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="quant_type"):
        Params4bit(dense(), quant_type="int4")
    with pytest.raises(ValueError, match="blocksize"):
        Params4bit(dense(), blocksize=48)
    with pytest.raises(TypeError, match="quant_storage"):
        Params4bit(dense(), quant_storage=torch.int32)
    with pytest.raises(TypeError, match="quant_state"):
        Params4bit(dense(), quant_state={"absmax": 1})
    with pytest.raises(TypeError, match="float16, bfloat16 or float32"):
        Params4bit(torch.ones(16, 64, dtype=torch.int8)).to("cpu")


def test_fix_quant_state_from_module_after_a_wrapper_dropped_it():
    m = Linear4bit(64, 16, quant_type="nf4").to("cpu")
    x = dense((2, 64))
    y = m(x)
    m.weight = torch.nn.Parameter(m.weight.data.clone(), requires_grad=False)  # what FSDP leaves behind
    fix_4bit_weight_quant_state_from_module(m)
    assert type(m.weight) is Params4bit and m.weight.quant_state is m.quant_state
    assert torch.equal(m(x), y)


def test_fix_quant_state_without_any_state_raises():
    m = Linear4bit(64, 16)
    with pytest.raises(RuntimeError, match="not quantized"):
        fix_4bit_weight_quant_state_from_module(m)


def test_exported_at_the_upstream_paths():
    assert bnb.nn.Params4bit is Params4bit is bnb.nn.modules.Params4bit


def test_reduction_is_class_plus_state_as_upstream_understands():
    # (Params4bit, (data, requires_grad), state) with state holding data and requires_grad: upstream's
    # __setstate__ reads exactly these keys, so a pickle written here loads there too.
    p = Params4bit(dense(), quant_type="nf4").to("cpu")
    fn, args, state = p.__reduce_ex__(2)
    assert fn is Params4bit and args[1] is False and torch.equal(args[0], p.data)
    assert set(state) == UPSTREAM_KEYS | {"data", "requires_grad"}
    assert Params4bit.__module__ == "bitsandbytes.nn.modules"


def test_move_with_device_and_dtype_quantizes_the_converted_values():
    w = dense()
    p = Params4bit(w.clone(), quant_type="nf4").to("cpu", torch.bfloat16)
    assert p.quant_state.dtype == torch.bfloat16
    packed, _ = F.quantize_4bit(w.bfloat16(), quant_type="nf4", compress_statistics=True)
    assert torch.equal(p.data, packed)
