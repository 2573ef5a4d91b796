"""Embedding, StableEmbedding and Embedding8bit.

The optimizer override that Embedding/StableEmbedding register is checked against a recording stand-in
for ``bitsandbytes.optim.GlobalOptimManager`` (the optimizer package is tested on its own). Embedding8bit
outputs are compared with the row-wise dequantization of ``functional.int8_vectorwise_quant``.
"""

import sys
import types
import typing

import pytest
import torch
import torch.nn.functional as TF

import bitsandbytes.functional as F
from bitsandbytes.nn import Embedding, Embedding8bit, Int8Params, StableEmbedding


class RecordingManager:
    calls: typing.ClassVar[list] = []
    _instance = None

    @classmethod
    def get_instance(cls):
        cls._instance = cls._instance or cls()
        return cls._instance

    def register_module_override(self, module, param_name, config):
        self.calls.append((module, param_name, config))


@pytest.fixture
def manager(monkeypatch):
    RecordingManager.calls = []
    monkeypatch.setitem(sys.modules, "bitsandbytes.optim", types.SimpleNamespace(GlobalOptimManager=RecordingManager))
    return RecordingManager


def ids(*values):
    return torch.tensor(values, dtype=torch.int64)


@pytest.mark.parametrize("cls", [Embedding, StableEmbedding])
def test_registers_32bit_optimizer_state(manager, cls):
    emb = cls(10, 4)
    assert manager.calls == [(emb, "weight", {"optim_bits": 32})]


@pytest.mark.parametrize("cls", [Embedding, StableEmbedding])
def test_xavier_init_and_padding(manager, cls):
    torch.manual_seed(0)
    emb = cls(50, 8, padding_idx=3)
    bound = (6 / (50 + 8)) ** 0.5
    assert torch.all(emb.weight.abs() <= bound) and emb.weight.abs().max() > 0.8 * bound
    assert torch.all(emb.weight[3] == 0)


def test_embedding_forward(manager):
    emb = Embedding(10, 4, padding_idx=0)
    i = ids(1, 0, 9, 1)
    assert torch.equal(emb(i), TF.embedding(i, emb.weight))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_stable_embedding_normalizes(manager, dtype):
    emb = StableEmbedding(10, 6, dtype=dtype)
    with torch.no_grad():
        emb.norm.weight.uniform_()
        emb.norm.bias.uniform_()
    i = ids(2, 7)
    out = emb(i)
    ref = TF.layer_norm(emb.weight[i].float(), (6,), emb.norm.weight, emb.norm.bias, emb.norm.eps).to(dtype)
    assert out.dtype == dtype and torch.equal(out, ref)
    assert emb.norm.weight.dtype == torch.float32
    out.float().sum().backward()
    assert emb.weight.grad is not None


def test_positional_constructor(manager):
    w = torch.randn(5, 3)
    emb = StableEmbedding(5, 3, None, None, 2.0, False, False, w)
    assert torch.equal(emb.weight, w)
    emb = Embedding(5, 3, None, None, 2.0, False, False, w, "cpu")
    assert torch.equal(emb.weight, w)


# --- Embedding8bit -------------------------------------------------------------------------------


def float_embedding(n=12, d=8, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Embedding(n, d)


def quantized_embedding(seed=0, dtype=None):
    e = Embedding8bit(12, 8, dtype=dtype)
    e.load_state_dict(float_embedding(seed=seed).state_dict())
    return e.to("cpu")


def test_embedding8bit_forward_is_row_dequantization():
    ref = float_embedding()
    e = quantized_embedding()
    codes, scales, _ = F.int8_vectorwise_quant(ref.weight.detach().half())
    assert isinstance(e.weight, Int8Params) and torch.equal(e.weight.data, codes) and torch.equal(e.weight.SCB, scales)
    i = torch.tensor([[0, 5], [11, 5]])
    out = e(i)
    expected = codes[i].float() * (scales[i].unsqueeze(-1) / 127.0)
    assert out.shape == (2, 2, 8) and out.dtype == torch.float32 and torch.equal(out, expected)
    assert torch.allclose(out, ref(i), atol=ref.weight.abs().max().item() / 127)


def test_embedding8bit_output_dtype_follows_construction():
    e = quantized_embedding(dtype=torch.float16)
    assert e(ids(1, 2)).dtype == torch.float16


@pytest.mark.parametrize("forward_first", [False, True])
def test_embedding8bit_save_and_load(forward_first):
    e = quantized_embedding()
    i = ids(3, 0, 11)
    y = e(i) if forward_first else None
    sd = e.state_dict()
    assert set(sd) == {"weight", "SCB"} and sd["weight"].dtype == torch.int8 and sd["SCB"].shape == (12,)
    fresh = Embedding8bit(12, 8)
    fresh.load_state_dict(sd)
    assert torch.equal(fresh(i), e(i))
    if y is not None:
        assert torch.equal(fresh(i), y)
    with torch.device("meta"):
        meta = Embedding8bit(12, 8)
    meta.load_state_dict(sd, assign=True)
    assert torch.equal(meta(i), e(i))


def test_embedding8bit_lazy_quantization_and_requantize_on_float_load():
    e = Embedding8bit(12, 8)
    e.load_state_dict(float_embedding(seed=1).state_dict())
    out = e(ids(4))  # never moved: quantized on first use
    assert e.weight.dtype == torch.int8
    e.load_state_dict(float_embedding(seed=2).state_dict())  # float weights into a quantized module
    assert e.weight.dtype == torch.int8 and not torch.equal(e(ids(4)), out)
    assert torch.equal(e(ids(4)), quantized_embedding(seed=2)(ids(4)))


def test_embedding8bit_bad_input():
    e = quantized_embedding()
    with pytest.raises(TypeError, match="input must be an integer tensor"):
        e(torch.tensor([1.0]))
    sd = e.state_dict()
    del sd["SCB"]
    with pytest.raises(RuntimeError, match="'SCB'"):
        Embedding8bit(12, 8).load_state_dict(sd)
    sd = e.state_dict()
    sd["SCB"] = sd["SCB"][:3]
    with pytest.raises(RuntimeError, match="'SCB'"):
        Embedding8bit(12, 8).load_state_dict(sd)
    with torch.device("meta"):
        meta = Embedding8bit(12, 8)
    with pytest.raises(RuntimeError, match="meta device"):
        meta(ids(1))
