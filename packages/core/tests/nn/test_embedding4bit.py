"""Embedding4bit / EmbeddingNF4 / EmbeddingFP4: lookups against the dequantized table, save and load."""

import logging

import pytest
import torch

import bitsandbytes as bnb
import bitsandbytes.functional as F
from bitsandbytes.nn import Embedding4bit, EmbeddingFP4, EmbeddingNF4, Params4bit

N = 12


def table(dim, seed=0, dtype=torch.float32):
    return torch.randn(N, dim, generator=torch.Generator().manual_seed(seed)).to(dtype)


def quantized(dim=128, quant_type="nf4", storage=torch.uint8, dtype=None, seed=0):
    e = Embedding4bit(N, dim, dtype, quant_type, storage)
    e.load_state_dict({"weight": table(dim, seed, e.dtype)})
    return e.to("cpu")


def idx(*shape, seed=1):
    return torch.randint(0, N, shape, generator=torch.Generator().manual_seed(seed))


def raw(t):
    return t.contiguous().view(torch.uint8)


def test_constructors_take_upstream_positional_arguments():
    e = Embedding4bit(N, 64, torch.bfloat16, "nf4", torch.bfloat16, "meta")
    assert e.dtype == torch.bfloat16 and e.weight.quant_type == "nf4" and e.weight.quant_storage == torch.bfloat16
    assert e.weight.compress_statistics is None and e.weight.module is e and e.weight.device.type == "meta"
    nf4, fp4 = EmbeddingNF4(N, 64, torch.float16, torch.bfloat16, "meta"), EmbeddingFP4(N, 64, None, torch.uint8)
    assert nf4.weight.quant_type == "nf4" and nf4.dtype == torch.float16 and nf4.weight.quant_storage == torch.bfloat16
    assert fp4.weight.quant_type == "fp4" and fp4.dtype == torch.float32


@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
@pytest.mark.parametrize("storage", [torch.uint8, torch.bfloat16])
@pytest.mark.parametrize("dim", [64, 128], ids=["1block", "2blocks"])
def test_lookup_dequantizes_the_picked_rows(quant_type, storage, dim):
    e = quantized(dim, quant_type, storage)
    full = F.dequantize_4bit(e.weight.data, e.weight.quant_state)
    i = idx(3, 5)
    out = e(i)
    assert out.shape == (3, 5, dim) and out.dtype == torch.float32
    assert torch.equal(out, torch.nn.functional.embedding(i, full))
    assert (full - table(dim)).abs().max() < 0.2 * table(dim).abs().max()


def test_dim_not_a_multiple_of_the_block_warns_and_dequantizes_the_table(caplog, recwarn):
    # Upstream 0.50 logs this through its module logger (no warnings.warn), with this wording.
    with caplog.at_level(logging.WARNING, logger="bitsandbytes.nn.modules"):
        e = Embedding4bit(N, 40, quant_type="fp4")
    [record] = [r for r in caplog.records if r.name == "bitsandbytes.nn.modules"]
    assert record.getMessage() == (
        "Embedding size 40 is not divisible by block size 64. This will lead to slow inference."
    )
    assert not [w for w in recwarn if "divisible" in str(w.message)]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="bitsandbytes.nn.modules"):
        Embedding4bit(N, 128, quant_type="fp4")
    assert not caplog.records
    e.load_state_dict({"weight": table(40)})
    e = e.to("cpu")
    i = idx(7)
    full = F.dequantize_4bit(e.weight.data, e.weight.quant_state)
    assert torch.equal(e(i), torch.nn.functional.embedding(i, full))


def test_partial_path_reads_only_the_picked_rows(monkeypatch):
    e = quantized(128)
    seen = []
    real = F.dequantize_4bit

    def spy(A, quant_state=None, *args, **kwargs):
        seen.append(A.numel())
        return real(A, quant_state, *args, **kwargs)

    monkeypatch.setattr(F, "dequantize_4bit", spy)
    e(idx(2))
    assert seen == [2 * 128 // 2]


def test_output_has_the_table_dtype():
    e = quantized(64, dtype=torch.bfloat16)
    out = e(idx(4))
    assert out.dtype == torch.bfloat16
    full = F.dequantize_4bit(e.weight.data, e.weight.quant_state)
    assert torch.equal(out, torch.nn.functional.embedding(idx(4), full).bfloat16())


@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
@pytest.mark.parametrize("storage", [torch.uint8, torch.bfloat16])
def test_save_and_load_into_a_fresh_module(quant_type, storage):
    # Upstream raises NotImplementedError on state_dict().
    e = quantized(64, quant_type, storage)
    sd = e.state_dict()
    assert set(sd) == {"weight", "weight.absmax", "weight.quant_map", f"weight.quant_state.bitsandbytes__{quant_type}"}
    fresh = Embedding4bit(N, 64)
    fresh.load_state_dict(sd)
    assert type(fresh.weight) is Params4bit and fresh.weight.quant_type == quant_type
    assert fresh.quant_state is fresh.weight.quant_state
    i = idx(3, 4)
    assert torch.equal(fresh(i), e(i))
    sd2 = fresh.state_dict()
    assert all(torch.equal(raw(sd2[k]), raw(sd[k])) for k in sd)


def test_nested_checkpoint_loads_and_looks_up():
    # Embeddings quantize without double quantization, but a nested checkpoint must still work.
    w = table(128)
    packed, qs = F.quantize_4bit(w, quant_type="nf4", compress_statistics=True)
    sd = {"weight": packed, **{"weight." + k: v for k, v in qs.as_dict(packed=True).items()}}
    e = EmbeddingNF4(N, 128)
    e.load_state_dict(sd)
    i = idx(6)
    assert torch.equal(e(i), torch.nn.functional.embedding(i, F.dequantize_4bit(packed, qs)))


def test_missing_and_garbled_keys_are_named():
    sd = quantized(64).state_dict()
    broken = {k: v for k, v in sd.items() if k != "weight.absmax"}
    with pytest.raises(RuntimeError, match="absmax"):
        Embedding4bit(N, 64).load_state_dict(broken)
    with pytest.raises(RuntimeError, match=r"\[12, 64\].*\[12, 128\]"):
        Embedding4bit(N, 128).load_state_dict(sd)


def test_bad_input():
    e = quantized(64)
    with pytest.raises(TypeError, match="indices"):
        e(torch.zeros(3))
    with pytest.raises(ValueError, match="quant_type"):
        Embedding4bit(N, 64, quant_type="int4")
    with pytest.raises(RuntimeError, match="not quantized"):
        Embedding4bit(N, 64)(idx(2))


def test_exported_at_the_upstream_paths():
    assert bnb.nn.Embedding4bit is bnb.nn.modules.Embedding4bit is Embedding4bit
    assert bnb.nn.EmbeddingNF4 is EmbeddingNF4 and bnb.nn.EmbeddingFP4 is EmbeddingFP4
