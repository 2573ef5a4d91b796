"""4-bit modules whose weight a wrapper has swapped for a plain tensor (what FSDP does), in one process.

The module holds its own reference to the QuantState, so forward, state_dict and load_state_dict work on
whatever tensor of packed codes sits in ``weight``, without replacing it.
"""

from __future__ import annotations

import pytest
import torch

from bitsandbytes.nn import Embedding4bit, Linear4bit, Params4bit


def dense(shape, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def quantized_linear(seed=0, quant_storage=torch.bfloat16):
    m = Linear4bit(64, 16, compute_dtype=torch.float32, quant_type="nf4", quant_storage=quant_storage)
    m.weight = Params4bit(dense((16, 64), seed), quant_type="nf4", quant_storage=quant_storage, module=m)
    return m.to("cpu")


def plain(weight: torch.Tensor) -> torch.nn.Parameter:
    """What FSDP puts in place of a Params4bit: a plain parameter over the same packed bytes."""
    return torch.nn.Parameter(weight.data.clone(), requires_grad=False)


def same_bytes(a, b):
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
    )


def test_a_weight_quantized_on_its_own_is_learned_by_the_module():
    w = Params4bit(dense((16, 64)), quant_type="nf4", quant_storage=torch.bfloat16).to("cpu")
    m = Linear4bit(64, 16, compute_dtype=torch.float32, quant_type="nf4")
    m.weight = w
    assert m.quant_state is w.quant_state
    assert m.quant_storage == torch.bfloat16
    assert w.module is m
    x = dense((3, 64), 1)
    y = m(x)
    m.weight = plain(w)
    assert torch.equal(m(x), y)
    assert type(m.weight) is torch.nn.Parameter  # forward reads the module's state, never rebuilds the weight


def test_an_unquantized_weight_assigned_then_moved_tells_the_module():
    m = Linear4bit(64, 16, quant_type="nf4")
    m.weight = Params4bit(dense((16, 64)), quant_type="nf4")
    m.to("cpu")
    assert m.quant_state is not None and m.quant_state is m.weight.quant_state


def test_forward_refuses_codes_cast_to_another_dtype():
    m = quantized_linear()
    m.weight = torch.nn.Parameter(m.weight.data.float(), requires_grad=False)
    with pytest.raises(RuntimeError, match=r"quant_storage=torch.bfloat16(.|\n)*MixedPrecisionPolicy"):
        m(dense((2, 64)))


def test_forward_refuses_a_weight_of_the_wrong_size():
    m = quantized_linear()
    m.weight = torch.nn.Parameter(m.weight.data[:-8].clone(), requires_grad=False)
    with pytest.raises(RuntimeError, match="needs 256 elements"):
        m(dense((2, 64)))


def test_forward_of_a_module_never_quantized_says_so():
    m = Linear4bit(64, 16)
    with pytest.raises(RuntimeError, match="not quantized yet"):
        m(dense((2, 64)))


def test_state_dict_with_a_plain_weight_is_the_same_and_its_keys_resolve_by_getattr():
    m = quantized_linear()
    before = m.state_dict()
    m.weight = plain(m.weight)
    after = m.state_dict()
    assert list(after) == list(before)
    assert all(same_bytes(after[k], before[k]) for k in before)
    # torch.distributed.checkpoint walks every key with getattr from the root module.
    for key in after:
        obj = m
        for part in key.split("."):
            obj = getattr(obj, part)
        assert same_bytes(obj.detach(), after[key]), key


def test_loading_into_a_quantized_module_keeps_the_parameter_object():
    src, dst = quantized_linear(0), quantized_linear(1)
    x = dense((3, 64), 2)
    param = dst.weight
    dst.load_state_dict(src.state_dict())
    assert dst.weight is param
    assert dst.weight.quant_state is dst.quant_state
    assert torch.equal(dst(x), src(x))
    dst.load_state_dict(quantized_linear(3).state_dict(), assign=True)
    assert dst.weight is not param


def test_loading_into_a_plain_weight_copies_the_codes_in_place():
    src, dst = quantized_linear(0), quantized_linear(1)
    dst.weight = plain(dst.weight)
    param = dst.weight
    dst.load_state_dict(src.state_dict())
    assert dst.weight is param
    x = dense((3, 64), 2)
    assert torch.equal(dst(x), src(x))


def test_embedding4bit_with_a_plain_weight():
    m = Embedding4bit(8, 64, quant_type="nf4", quant_storage=torch.float16)
    m.weight = Params4bit(dense((8, 64)), quant_type="nf4", quant_storage=torch.float16)
    m.to("cpu")
    idx = torch.tensor([[1, 7, 0]])
    y = m(idx)
    m.weight = plain(m.weight)
    assert torch.equal(m(idx), y)
