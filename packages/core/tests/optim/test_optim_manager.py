"""GlobalOptimManager overrides and min_8bit_size: which parameters get 8-bit state."""

from __future__ import annotations

import gc

import pytest
import torch

import bitsandbytes as bnb

BIG = (80, 64)  # 5120 elements: over the default min_8bit_size of 4096


def _step(opt, *params):
    for p in params:
        p.grad = torch.ones_like(p)
    opt.step()


def _bits(opt, p):
    return 8 if opt.state[p]["state1"].dtype == torch.uint8 else 32


def test_singleton():
    mng = bnb.optim.GlobalOptimManager.get_instance()
    assert bnb.optim.GlobalOptimManager.get_instance() is mng
    with pytest.raises(RuntimeError, match="get_instance"):
        bnb.optim.GlobalOptimManager()


def test_min_8bit_size():
    big = torch.nn.Parameter(torch.zeros(BIG))
    at = torch.nn.Parameter(torch.zeros(4096))
    under = torch.nn.Parameter(torch.zeros(4095))
    opt = bnb.optim.Adam8bit([big, at, under])
    _step(opt, big, at, under)
    assert (_bits(opt, big), _bits(opt, at), _bits(opt, under)) == (8, 8, 32)
    assert "qmap1" not in opt.state[under] and "absmax1" not in opt.state[under]
    opt = bnb.optim.Adam8bit([under], min_8bit_size=100)
    _step(opt, under)
    assert _bits(opt, under) == 8


@pytest.mark.parametrize("when", ["before construction", "after construction"])
def test_override_config(when):
    a, b = torch.nn.Parameter(torch.zeros(BIG)), torch.nn.Parameter(torch.zeros(BIG))
    mng = bnb.optim.GlobalOptimManager.get_instance()
    if when == "before construction":
        mng.override_config(a, "optim_bits", 32)
    opt = bnb.optim.Adam([a, b], optim_bits=8)
    if when == "after construction":
        mng.override_config([a], key_value_dict={"optim_bits": 32})
    _step(opt, a, b)
    assert (_bits(opt, a), _bits(opt, b)) == (32, 8)


def test_override_of_a_hyperparameter_applies_at_every_step():
    a, b = torch.nn.Parameter(torch.zeros(10)), torch.nn.Parameter(torch.zeros(10))
    opt = bnb.optim.SGD([a, b], lr=0.1, momentum=0.9)
    bnb.optim.GlobalOptimManager.get_instance().override_config(a, "lr", 0.0)
    _step(opt, a, b)
    assert torch.equal(a, torch.zeros(10)) and torch.allclose(b, torch.full((10,), -0.1))


def test_module_override_registered_after_construction_applies():
    # What transformers' Trainer and PEFT's LoRA+ do for embeddings: build the optimizer, then register.
    model = torch.nn.Sequential(torch.nn.Embedding(100, 64), torch.nn.Linear(64, 80))
    opt = bnb.optim.Adam8bit(model.parameters())
    bnb.optim.GlobalOptimManager.get_instance().register_module_override(model[0], "weight", {"optim_bits": 32})
    _step(opt, *model.parameters())
    assert _bits(opt, model[0].weight) == 32
    assert _bits(opt, model[1].weight) == 8


def test_a_module_override_does_not_change_other_parameters():
    # Upstream's defect: a module override was recorded by (group, position) in the process-wide manager, so
    # the parameter at the embedding's position in any LATER optimizer (another model, another Trainer run)
    # silently got 32-bit state as well. Overrides follow the parameter object here.
    emb = torch.nn.Embedding(100, 64)
    model_a = torch.nn.Sequential(emb, torch.nn.Linear(64, 80))
    opt_a = bnb.optim.Adam8bit(model_a.parameters())
    bnb.optim.GlobalOptimManager.get_instance().register_module_override(emb, "weight", {"optim_bits": 32})
    _step(opt_a, *model_a.parameters())
    assert _bits(opt_a, emb.weight) == 32 and _bits(opt_a, model_a[1].weight) == 8

    model_b = torch.nn.Sequential(torch.nn.Linear(64, 80), torch.nn.Linear(80, 64))  # same position, same size
    opt_b = bnb.optim.Adam8bit(model_b.parameters())
    _step(opt_b, *model_b.parameters())
    assert _bits(opt_b, model_b[0].weight) == 8
    assert _bits(opt_b, model_b[1].weight) == 8

    # A second optimizer over the same embedding still sees its override.
    opt_c = bnb.optim.Adam8bit([emb.weight])
    _step(opt_c, emb.weight)
    assert _bits(opt_c, emb.weight) == 32


def test_override_follows_a_replaced_weight():
    # The override is looked up when the state is created, so it names the module's current weight.
    model = torch.nn.Linear(64, 80)
    bnb.optim.GlobalOptimManager.get_instance().register_module_override(model, "weight", {"optim_bits": 32})
    model.weight = torch.nn.Parameter(torch.zeros(BIG))
    opt = bnb.optim.Adam8bit([model.weight])
    _step(opt, model.weight)
    assert _bits(opt, model.weight) == 32


def test_overrides_do_not_outlive_their_objects():
    mng = bnb.optim.GlobalOptimManager.get_instance()
    model = torch.nn.Linear(64, 80)
    mng.register_module_override(model, "weight", {"optim_bits": 32})
    p = torch.nn.Parameter(torch.zeros(BIG))
    mng.override_config(p, "optim_bits", 32)
    del model, p
    gc.collect()
    # A new tensor may reuse a dead one's id(); it must not inherit the dead one's override.
    fresh = [torch.nn.Parameter(torch.zeros(BIG)) for _ in range(20)]
    opt = bnb.optim.Adam8bit(fresh)
    _step(opt, *fresh)
    assert all(_bits(opt, q) == 8 for q in fresh)
    assert len(mng._param_config) == 0


def test_register_parameters_carries_overrides_to_replaced_tensors():
    # Upstream's documented flow: override and register on CPU, then move plain tensors (new objects).
    p1, p2, p3 = (torch.zeros(BIG) for _ in range(3))
    mng = bnb.optim.GlobalOptimManager.get_instance()
    mng.override_config(p3, "optim_bits", 32)
    mng.register_parameters([p1, p2, p3])
    moved = [t.clone().requires_grad_() for t in (p1, p2, p3)]  # stands for .cuda()
    opt = bnb.optim.Adam(moved, optim_bits=8)
    _step(opt, *moved)
    assert [_bits(opt, q) for q in moved] == [8, 8, 32]
    # The positions apply only to an optimizer over the same layout.
    other = [torch.zeros(BIG).requires_grad_() for _ in range(4)]
    opt = bnb.optim.Adam(other, optim_bits=8)
    _step(opt, *other)
    assert [_bits(opt, q) for q in other] == [8, 8, 8, 8]


def test_bad_overrides_fail_when_registered():
    mng = bnb.optim.GlobalOptimManager.get_instance()
    p = torch.nn.Parameter(torch.zeros(4))
    with pytest.raises(ValueError, match=r"override 'optim_bits'.*8 or 32"):
        mng.override_config(p, "optim_bits", 4)
    with pytest.raises(ValueError, match="override 'lr'"):
        mng.override_config(p, key_value_dict={"lr": -1.0})
    with pytest.raises(ValueError, match="override 'betas'"):
        mng.register_module_override(torch.nn.Linear(2, 2), "weight", {"betas": (0.9, 1.5)})
    with pytest.raises(TypeError, match="module"):
        mng.register_module_override("not a module", "weight", {"optim_bits": 32})
    with pytest.raises(ValueError, match="either key"):
        mng.override_config(p, "lr", 0.1, key_value_dict={"eps": 0.0})
    assert p not in mng._param_config and not mng._module_overrides


def test_registering_a_module_override_again_merges():
    mng = bnb.optim.GlobalOptimManager.get_instance()
    model = torch.nn.Linear(64, 80)
    mng.register_module_override(model, "weight", {"optim_bits": 32})
    mng.register_module_override(model, "weight", {"lr": 0.0})
    assert len(mng._module_overrides) == 1
    opt = bnb.optim.Adam8bit([model.weight])
    before = model.weight.detach().clone()
    _step(opt, model.weight)
    assert _bits(opt, model.weight) == 32 and torch.equal(model.weight, before)


def test_stable_embedding_keeps_only_its_own_weight_32bit():
    # The real client of module overrides: StableEmbedding registers one for its weight at construction.
    emb = bnb.nn.StableEmbedding(100, 64)
    model_a = torch.nn.Sequential(emb, torch.nn.Linear(64, 80))
    opt_a = bnb.optim.Adam8bit(model_a.parameters())
    model_a(torch.tensor([1, 2, 3])).sum().backward()
    opt_a.step()
    assert _bits(opt_a, emb.weight) == 32 and _bits(opt_a, model_a[1].weight) == 8
    model_b = torch.nn.Sequential(torch.nn.Linear(64, 100), torch.nn.Linear(100, 64))  # weight at index 0
    opt_b = bnb.optim.Adam8bit(model_b.parameters())
    _step(opt_b, *model_b.parameters())
    assert _bits(opt_b, model_b[0].weight) == 8
