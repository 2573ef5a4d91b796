"""Optimizer8bit.load_state_dict on a real state dict (8-bit and 32-bit, one- and two-state optimizers) whose
per-parameter entries the fuzz bytes delete, retype, reshape or refill (NaN, Inf, any bits), then a step.

Allowed from load_state_dict: ValueError / TypeError naming the state_dict entry. A state it accepts must
step without an error, and every state tensor keeps its shape and dtype.
"""

from __future__ import annotations

import copy

import torch
from _harness import ANY_DTYPES, Finding, Reader, call, main

OPTIMIZERS = ("Adam8bit", "Adam", "Lion8bit", "AdEMAMix8bit", "SGD8bit", "RMSprop8bit", "Adagrad8bit", "LAMB8bit")
SHAPES = ((300,), (17, 19), (5,), (2, 3, 4))
KEYS = ("state_dict",)
_REFERENCE: dict = {}


def _build(name: str, shape: tuple[int, ...]):
    import bitsandbytes as bnb

    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(shape))
    kwargs = {"lr": 1e-3}
    if name != "Adam":
        kwargs["min_8bit_size"] = 0
    if name == "SGD8bit":
        kwargs["momentum"] = 0.9
    return p, getattr(bnb.optim, name)([p], **kwargs)


def _reference(name: str, shape: tuple[int, ...]) -> dict:
    """The state dict after one step (cached: it depends only on the optimizer and shape)."""
    if (name, shape) not in _REFERENCE:
        p, opt = _build(name, shape)
        p.grad = torch.ones_like(p)
        opt.step()
        _REFERENCE[name, shape] = opt.state_dict()
    return copy.deepcopy(_REFERENCE[name, shape])


def _mutate(r: Reader, value):
    op = r.u8() % 10
    if op < 5:
        return value
    if op == 5:
        return None  # deleted below
    if op == 6 and isinstance(value, torch.Tensor):
        return r.values(value.numel(), value.dtype).reshape(value.shape)  # same layout, any values
    if op == 7:
        n = r.small(400)
        return r.values(n, r.pick(ANY_DTYPES)).reshape(r.pick(((n,), (1, n))))
    if op == 8:
        return r.pick((0, -1, 1.5, float("nan"), "x", [], {}, True, 2**70))
    return value.reshape(-1) if isinstance(value, torch.Tensor) else value


def test_one_input(data: bytes) -> None:
    r = Reader(data)
    name, shape = r.pick(OPTIMIZERS), r.pick(SHAPES)
    sd = _reference(name, shape)
    for index, entry in sd["state"].items():
        flat = dict(entry)
        nested = flat.pop("__bnb_optimizer_quant_state__", None) if r.flag() else None
        if nested:
            flat.update(nested)
        for key in sorted(flat, key=str):
            new = _mutate(r, flat[key])
            if new is None:
                del flat[key]
            else:
                flat[key] = new
        if r.u8() % 16 == 0:
            flat[r.pick(("extra", "state3", "absmax3"))] = torch.zeros(1)
        sd["state"][index] = flat
    p, opt = _build(name, shape)
    ok, _ = call(opt.load_state_dict, sd, names=KEYS)
    if not ok:
        return
    p.grad = r.values(p.numel(), torch.float32).reshape(p.shape)
    before = {k: (v.shape, v.dtype) for k, v in opt.state[p].items() if isinstance(v, torch.Tensor)}
    opt.step()
    after = {k: (v.shape, v.dtype) for k, v in opt.state[p].items() if isinstance(v, torch.Tensor)}
    changed = {k for k in before if after.get(k) != before[k]}
    if changed:
        raise Finding(f"{name}: a step changed the shape or dtype of loaded state {sorted(changed)}")


if __name__ == "__main__":
    main(test_one_input, ["bitsandbytes", "bitsandbytes.optim"])
