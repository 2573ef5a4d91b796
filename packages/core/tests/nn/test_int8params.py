"""Int8Params: quantization on first move, the client rebuild pattern, copies and pickling.

Expected codes and scales come from ``functional.int8_vectorwise_quant`` of the fp16 weight (the
format upstream writes); everything else is compared with the original tensors.
"""

import copy
import io
import pickle

import pytest
import torch

import bitsandbytes.functional as F
from bitsandbytes.nn import Int8Params


def weight(rows=6, cols=10, seed=0):
    return torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed))


def test_constructor_defaults_and_dict():
    p = Int8Params(weight())
    assert p.requires_grad and p.has_fp16_weights is False and p.CB is None and p.SCB is None
    # transformers and PEFT rebuild parameters from __dict__: only constructor keywords, never data/requires_grad.
    assert set(p.__dict__) == {"CB", "SCB", "has_fp16_weights"}
    assert Int8Params().shape == (0,)
    with pytest.raises(TypeError, match=r"data must be a torch\.Tensor"):
        Int8Params([1.0, 2.0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_first_move_quantizes_cpu_to_cpu(dtype):
    w = weight().to(dtype)
    p = Int8Params(w.clone(), requires_grad=False)
    moved = p.to("cpu")
    assert moved is p
    codes, scales, _ = F.int8_vectorwise_quant(w.to(torch.float16))
    assert p.dtype == torch.int8 and torch.equal(p.data, codes)
    assert torch.equal(p.SCB, scales) and p.SCB.dtype == torch.float32
    assert p.CB.data_ptr() == p.data_ptr()
    assert not p.requires_grad


@pytest.mark.parametrize("move", ["to", "cpu", "to_kw"])
def test_never_quantizes_twice(move):
    p = Int8Params(weight(), requires_grad=False).cpu()
    codes, scales = p.data.clone(), p.SCB.clone()
    again = {"to": lambda: p.to("cpu"), "cpu": p.cpu, "to_kw": lambda: p.to(device="cpu", dtype=torch.float16)}[move]()
    assert isinstance(again, Int8Params)
    assert torch.equal(again.data, codes) and torch.equal(again.SCB, scales)
    assert again.CB.data_ptr() == again.data_ptr()


def test_rebuild_from_dict_like_transformers():
    w = weight()
    old = Int8Params(torch.empty(6, 10, device="meta"), requires_grad=False)
    kwargs = dict(old.__dict__)
    kwargs["_is_hf_initialized"] = True  # unknown keywords are tolerated
    new = Int8Params(w, requires_grad=False, **kwargs).to("cpu")
    assert new.dtype == torch.int8
    assert torch.equal(new.SCB, F.int8_vectorwise_quant(w.half())[1])
    # Rebuilding an already quantized parameter (new codes + their SCB) keeps them as given.
    again = Int8Params(new.data, requires_grad=False, **new.__dict__).to("cpu")
    assert torch.equal(again.data, new.data) and torch.equal(again.SCB, new.SCB)


def test_has_fp16_weights_is_never_quantized():
    w = weight()
    p = Int8Params(w.clone(), requires_grad=True, has_fp16_weights=True)
    moved = p.to("cpu")
    assert moved.dtype == torch.float32 and torch.equal(moved.data, w) and moved.SCB is None
    assert moved.requires_grad and moved.has_fp16_weights


def test_meta_stays_unquantized():
    p = Int8Params(torch.empty(4, 8, device="meta"), requires_grad=False)
    moved = p.to("meta")
    assert moved.dtype == torch.float32 and moved.device.type == "meta" and moved.SCB is None


def test_deepcopy_is_independent_and_keeps_aliasing():
    p = Int8Params(weight(), requires_grad=False).cpu()
    q = copy.deepcopy(p)
    assert type(q) is Int8Params and q.has_fp16_weights is False
    assert torch.equal(q.data, p.data) and torch.equal(q.SCB, p.SCB)
    assert q.data_ptr() != p.data_ptr() and q.SCB.data_ptr() != p.SCB.data_ptr()
    assert q.CB.data_ptr() == q.data_ptr()
    q.SCB.mul_(2)
    assert not torch.equal(q.SCB, p.SCB)


def test_copy_shares_tensors():
    p = Int8Params(weight(), requires_grad=False).cpu()
    q = copy.copy(p)
    assert type(q) is Int8Params and q.data_ptr() == p.data_ptr() and q.SCB is p.SCB


@pytest.mark.parametrize("fp16", [False, True])
def test_pickle_and_torch_save_round_trip(fp16):
    p = Int8Params(weight(), requires_grad=fp16, has_fp16_weights=fp16).cpu()
    for q in (pickle.loads(pickle.dumps(p)), _torch_round_trip(p)):
        assert type(q) is Int8Params and q.has_fp16_weights is fp16 and q.requires_grad is fp16
        assert torch.equal(q.data, p.data)
        if fp16:
            assert q.SCB is None
        else:
            assert torch.equal(q.SCB, p.SCB) and q.CB.data_ptr() == q.data_ptr()


def _torch_round_trip(p):
    buf = io.BytesIO()
    torch.save(p, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)
