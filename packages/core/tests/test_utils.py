"""bitsandbytes.utils: the helpers clients import, with upstream 0.50's names and behaviour."""

import json
import shlex
import sys
import types

import pytest
import torch

from bitsandbytes import utils
from bitsandbytes.utils import (
    INVERSE_LINEAR_8BIT_WEIGHTS_FORMAT_MAPPING,
    LINEAR_8BIT_WEIGHTS_FORMAT_MAPPING,
    OutlierTracer,
    execute_and_return,
    find_outlier_dims,
    pack_dict_to_tensor,
    replace_linear,
    unpack_tensor_to_dict,
)


def test_pack_dict_round_trip_and_bytes():
    d = {"quant_type": "nf4", "blocksize": 64, "shape": [4, 8], "nested": {"ü": 1.5}}
    t = pack_dict_to_tensor(d)
    assert t.dtype == torch.uint8 and t.dim() == 1
    assert bytes(t.tolist()) == json.dumps(d).encode("utf-8")  # upstream's layout: UTF-8 JSON text
    assert unpack_tensor_to_dict(t) == d
    with pytest.raises(TypeError, match="uint8"):
        unpack_tensor_to_dict(t.to(torch.int32))
    with pytest.raises(TypeError, match=r"torch\.Tensor"):
        unpack_tensor_to_dict(b"{}")


def test_weight_format_mappings():
    assert LINEAR_8BIT_WEIGHTS_FORMAT_MAPPING == {"row": 0, "col32": 1, "col_turing": 2, "col_ampere": 3}
    assert INVERSE_LINEAR_8BIT_WEIGHTS_FORMAT_MAPPING == {0: "row", 1: "col32", 2: "col_turing", 3: "col_ampere"}


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 6)
        self.inner = torch.nn.Sequential(torch.nn.Linear(6, 3, bias=False), torch.nn.ReLU())
        self.lm_head = torch.nn.Linear(3, 2)


class Replacement(torch.nn.Linear):
    pass


def test_replace_linear_recursive_skip_and_copy():
    model = Block()
    old_proj = model.proj
    calls = []
    old_proj.post = lambda module: calls.append(module)
    out = replace_linear(model, Replacement, copy_weights=True, post_processing_function="post")
    assert out is model
    assert type(model.proj) is Replacement and type(model.inner[0]) is Replacement
    assert type(model.lm_head) is torch.nn.Linear  # skipped by default
    assert model.inner[0].bias is None and model.proj.weight is old_proj.weight
    assert calls == [old_proj]


def test_replace_linear_without_copy_and_custom_skip():
    model = Block()
    replace_linear(model, lambda i, o, b: Replacement(i, o, b), skip_modules=("proj",))
    assert type(model.proj) is torch.nn.Linear and type(model.lm_head) is Replacement
    assert model.inner[0].weight.shape == (3, 6)


def test_find_outlier_dims():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 32, generator=g)
    w[:, 9] *= 30
    assert find_outlier_dims(w).tolist() == [9]
    assert set(find_outlier_dims(w, topk=2).tolist()) >= {9}
    rows = find_outlier_dims(w.T.contiguous(), reduction_dim=1)
    assert rows.tolist() == [9]
    r = find_outlier_dims(w, topk=5, rdm=True)
    assert r.shape == (5,) and r.dtype == torch.int64 and r.max() < 32
    with pytest.raises(ValueError, match="topk"):
        find_outlier_dims(w, rdm=True)


def test_outlier_tracer():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 8))
    with torch.no_grad():
        model[1].weight[:, 20] *= 50  # second layer: predicted from its weight's input columns
    x = torch.randn(128, 16)
    x[:, 5] *= 40  # first layer: found from its input
    with pytest.raises(RuntimeError, match="get_instance"):
        OutlierTracer()
    tracer = OutlierTracer.get_instance()
    tracer.initialize(model)
    assert tracer.is_initialized() and len(tracer.hooks) == 2
    model(x)
    assert 5 in tracer.get_outliers(model[0].weight).tolist()
    assert tracer.get_outliers(model[1].weight).tolist() == [20]
    model(x)  # a layer seen again: the hooks are removed
    assert not model[0]._forward_pre_hooks and not model[1]._forward_pre_hooks
    assert tracer.get_outliers(torch.nn.Linear(2, 2).weight) is None


def test_outlier_hook_rejects_other_modules():
    with pytest.raises(TypeError, match=r"torch\.nn\.Linear"):
        utils.outlier_hook(torch.nn.ReLU(), (torch.ones(1),))


def test_execute_and_return():
    code = "import sys; print('to out '); print('to err', file=sys.stderr)"
    out, err = execute_and_return(f"{shlex.quote(sys.executable)} -c {shlex.quote(code)}")
    assert (out, err) == ("to out", "to err")


def test_sync_gpu(monkeypatch):
    calls = []
    fake = types.SimpleNamespace(synchronize=lambda *a: calls.append(("xpu", *a)))
    monkeypatch.setattr(torch, "xpu", fake, raising=False)
    utils.sync_gpu(torch.ones(1))  # CPU: nothing to wait for
    utils.sync_gpu(types.SimpleNamespace(device=torch.device("xpu", 1)))
    assert calls == [("xpu", torch.device("xpu", 1))]
