"""replace_parameter_4bit(_prequantized): transparent dequantization of any parameter, its cache and
its state_dict layout."""

import pytest
import torch
import torch.nn.utils.parametrize as P

import bitsandbytes.functional as F
from bitsandbytes.nn.parametrize import (
    Bnb4bitParametrization,
    replace_parameter_4bit,
    replace_parameter_4bit_prequantized,
)


class Experts(torch.nn.Module):
    """A mixture-of-experts style weight [E, out, in] that is not an nn.Linear; reads it twice per call."""

    def __init__(self, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.weight = torch.nn.Parameter(torch.randn(2, 16, 64, generator=g))
        self.register_buffer("scale", torch.ones(1))

    def forward(self, x):
        return torch.einsum("bi,eoi->beo", x, self.weight) + self.weight.sum()


@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
@pytest.mark.parametrize("nested", [False, True])
def test_parameter_reads_dequantize(quant_type, nested):
    m = Experts()
    dense = m.weight.detach().clone()
    replace_parameter_4bit(m, "weight", compress_statistics=nested, quant_type=quant_type, blocksize=128)
    packed, qs = F.quantize_4bit(dense, blocksize=128, compress_statistics=nested, quant_type=quant_type)
    assert P.is_parametrized(m, "weight")
    original = m.parametrizations.weight.original
    assert torch.equal(original, packed) and not original.requires_grad
    expect = F.dequantize_4bit(packed, qs)
    assert torch.equal(m.weight, expect) and m.weight.shape == (2, 16, 64)
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(m(x), torch.einsum("bi,eoi->beo", x, expect) + expect.sum())


def test_default_settings_are_upstreams():
    m = Experts()
    replace_parameter_4bit(m, "weight")
    qs = m.parametrizations.weight[0].quant_state
    assert (qs.quant_type, qs.blocksize, qs.nested) == ("nf4", 64, False)


def test_state_dict_holds_the_packed_weight_and_its_quant_state():
    m = Experts()
    replace_parameter_4bit(m, "weight", compress_statistics=True)
    sd = m.state_dict()
    assert set(sd) == {
        "scale",
        "weight",
        "weight.absmax",
        "weight.quant_map",
        "weight.nested_absmax",
        "weight.nested_quant_map",
        "weight.quant_state.bitsandbytes__nf4",
    }
    assert torch.equal(sd["weight"], m.parametrizations.weight.original)
    qs = F.QuantState.from_dict({k: v for k, v in sd.items() if k.startswith("weight.")}, device="cpu")
    assert qs == m.parametrizations.weight[0].quant_state
    # Nested in a parent, the keys carry the prefix.
    parent = torch.nn.ModuleDict({"experts": m})
    assert "experts.weight.quant_state.bitsandbytes__nf4" in parent.state_dict()


def test_prequantized_round_trip_from_a_state_dict():
    m = Experts()
    replace_parameter_4bit(m, "weight", quant_type="fp4", compress_statistics=True)
    sd = m.state_dict()
    target = Experts(seed=5)
    target.weight = torch.nn.Parameter(sd["weight"].clone(), requires_grad=False)
    stats = {k: v for k, v in sd.items() if k.startswith("weight.")}
    replace_parameter_4bit_prequantized(target, "weight", stats, device=torch.device("cpu"))
    assert torch.equal(target.weight, m.weight)
    x = torch.randn(2, 64, generator=torch.Generator().manual_seed(2))
    assert torch.equal(target(x), m(x))


def test_one_dequantization_per_forward_and_the_cache_is_released(monkeypatch):
    m = Experts()
    replace_parameter_4bit(m, "weight")
    calls = []
    real = F.dequantize_4bit
    monkeypatch.setattr(F, "dequantize_4bit", lambda *a, **k: calls.append(1) or real(*a, **k))
    m(torch.ones(1, 64))
    assert len(calls) == 1  # forward reads the weight twice
    assert P._cache_enabled == 0 and not P._cache
    with pytest.raises(RuntimeError):
        m(torch.ones(1, 63))
    assert P._cache_enabled == 0 and not P._cache
    _ = m.weight
    _ = m.weight
    assert len(calls) == 4  # outside forward every read dequantizes


def test_bad_input():
    m = Experts()
    with pytest.raises(AttributeError, match="'bias'"):
        replace_parameter_4bit(m, "bias")
    with pytest.raises(TypeError, match=r"'scale' is not an instance of nn\.Parameter"):
        replace_parameter_4bit(m, "scale")
    with pytest.raises(ValueError, match="quant_type"):
        replace_parameter_4bit(m, "weight", quant_type="int4")
    with pytest.raises(ValueError, match="absmax"):
        replace_parameter_4bit_prequantized(m, "weight", {"quant_type": "nf4"}, device="cpu")
    with pytest.raises(TypeError, match="quant_state"):
        Bnb4bitParametrization({"absmax": None})
