"""Optimizer steps: ``optimizer_update_32bit`` and ``optimizer_update_8bit_blockwise``, every optimizer.

Each step starts the device kernel and the reference from identical inputs (the device's state after
the previous step is copied to the reference), so differences cannot pile up over steps.

Tolerances (a step is a chain of fp32 operations whose order, fusion (FMA) and sqrt/division a kernel
may choose; nothing in the format fixes those bits):
- parameters: ``|p - ref| <= eps(p.dtype) * |ref| + 32 eps(fp32) * (|ref| + |ref - p_before|)``: one
  rounding to p's dtype, plus a few fp32 ulps of the parameter and of the update.
- 32-bit states: ``rtol = 32 eps(fp32)``, ``atol = 32 eps(fp32) * max |state|``.
- ``unorm_vec`` (a sum over all elements, any order): ``rtol = 1e-5``.
- 8-bit states: absmax ``rtol = 32 eps(fp32)``; codes equal except at most 1% of them, each at most
  one code away: a state value within an fp32 ulp of the midpoint between two codes may land on either
  side. The rounding rule itself is tested bit-exactly in test_blockwise.
- lion moves by ``lr * sign(...)``: an argument within rounding of 0 may take the other sign, so at
  most 1% of lion's parameters may differ by up to ``2 lr``.
"""

from __future__ import annotations

import pytest
import torch

from bitsandbytes import functional
from bitsandbytes._checks import OPTIMIZER_NAMES, n_blocks
from bitsandbytes._ops import OPTIMIZER_BLOCKSIZE, TWO_STATE_OPTIMIZERS
from bitsandbytes._reference import REFERENCE

from ..cases import DTYPES, dtype_id, randn, seed_of, to
from ..compare import assert_all, assert_close, assert_codes_near, assert_equal
from ..samples import CLIPPED_OPTIMIZERS, OPTIMIZER_HYPERPARAMETERS, op_overload

OPS_TESTED = ("optimizer_update_32bit", "optimizer_update_8bit_blockwise")

N = 3 * OPTIMIZER_BLOCKSIZE + 45  # three full blocks and a tail
STEPS = 3
EPS32 = torch.finfo(torch.float32).eps


class Run:
    """The tensors of one optimizer run and how to call one step of it."""

    def __init__(self, name: str, bits: int, dtype: torch.dtype, device, **overrides):
        self.name, self.bits, self.dtype = name, bits, dtype
        beta1, beta2, beta3, alpha, eps, wd, lr = OPTIMIZER_HYPERPARAMETERS[name]
        self.hp = {"beta1": beta1, "beta2": beta2, "beta3": beta3, "alpha": alpha, "eps": eps, "weight_decay": wd}
        self.hp |= {"lr": lr, "gnorm_scale": 0.7, "skip_zeros": False} | overrides
        self.p = randn((N,), dtype, seed_of("p", name, bits, dtype), device, spread=False)
        n_ema = 2 if name == "ademamix" else 1
        two = name in TWO_STATE_OPTIMIZERS
        if bits == 32:
            self.state1 = torch.zeros((n_ema, N) if n_ema == 2 else (N,), device=device)
            self.state2 = torch.zeros(N, device=device) if two else None
            clipped = name in CLIPPED_OPTIMIZERS
            self.max_unorm = 1.0 if clipped else 0.0
            self.unorm_vec = torch.zeros(1, device=device) if clipped else None
        else:
            blocks = n_blocks(N, OPTIMIZER_BLOCKSIZE)
            self.state1 = torch.zeros((n_ema, N) if n_ema == 2 else (N,), dtype=torch.uint8, device=device)
            self.absmax1 = torch.zeros((n_ema, blocks) if n_ema == 2 else (blocks,), device=device)
            self.qmap1 = functional.create_dynamic_map(signed=True).float().to(device)
            self.state2 = torch.zeros(N, dtype=torch.uint8, device=device) if two else None
            self.absmax2 = torch.zeros(blocks, device=device) if two else None
            self.qmap2 = functional.create_dynamic_map(signed=False).float().to(device) if two else None

    def tensors(self) -> dict[str, torch.Tensor | None]:
        if self.bits == 32:
            return {"p": self.p, "state1": self.state1, "state2": self.state2, "unorm_vec": self.unorm_vec}
        return {
            "p": self.p,
            "state1": self.state1,
            "state2": self.state2,
            "absmax1": self.absmax1,
            "absmax2": self.absmax2,
        }

    def args(self, g, t, step):
        h = self.hp
        if self.bits == 32:
            return (
                self.name, g, t["p"], t["state1"], t["state2"], t["unorm_vec"], self.max_unorm, 1.5, h["beta1"],
                h["beta2"], h["beta3"], h["alpha"], h["eps"], h["weight_decay"], step, h["lr"], h["gnorm_scale"],
                h["skip_zeros"],
            )  # fmt: skip
        return (
            self.name, g, t["p"], t["state1"], t["state2"], h["beta1"], h["beta2"], h["beta3"], h["alpha"], h["eps"],
            step, h["lr"], self.qmap1, self.qmap2, t["absmax1"], t["absmax2"], h["weight_decay"], h["gnorm_scale"],
            h["skip_zeros"],
        )  # fmt: skip

    @property
    def op(self) -> str:
        return "optimizer_update_32bit" if self.bits == 32 else "optimizer_update_8bit_blockwise"

    def step(self, g: torch.Tensor, step: int) -> dict[str, torch.Tensor | None]:
        """Run one step on the device (in place) and on the reference; return the reference's tensors."""
        ref = to(self.tensors(), "cpu")
        cpu_args = to(self.args(g, ref, step), "cpu")
        # The reference mutates the CPU copies inside cpu_args; map them back by position.
        op_overload(self.op)(*self.args(g.to(self.p.device), self.tensors(), step))
        REFERENCE[self.op](*cpu_args)
        names = list(self.tensors())
        positions = {name: i for i, name in enumerate(self._arg_names()) if name in names}
        return {name: cpu_args[positions[name]] for name in names}

    def _arg_names(self) -> list[str]:
        if self.bits == 32:
            return ["name", "g", "p", "state1", "state2", "unorm_vec"]
        return ["name", "g", "p", "state1", "state2", *[""] * 9, "absmax1", "absmax2"]


def assert_params_close(p, ref, before, name, what):
    """p (the device's, in its dtype) vs the reference's p, within the tolerance of the module docstring."""
    eps = torch.finfo(p.dtype).eps
    p, ref, before = p.cpu().double(), ref.to(p.dtype).double(), before.cpu().double()
    allowed = eps * ref.abs() + 32 * EPS32 * (ref.abs() + (ref - before).abs())
    diff = (p - ref).abs()
    same_special = (p.isnan() & ref.isnan()) | (p.isinf() & (p == ref))
    bad = ~(diff <= allowed) & ~same_special
    if name == "lion":
        # A sign decided by rounding: at most 1% of the elements may move the other way (2 lr).
        lr = OPTIMIZER_HYPERPARAMETERS["lion"][-1]
        assert_all((diff <= allowed + 2 * lr * (1 + 1e-3) + 4 * eps * ref.abs()) | same_special, what, diff)
        assert bad.sum().item() <= 0.01 * p.numel(), f"{what}: {bad.sum().item()} lion signs differ"
        return
    assert_all(~bad, what, diff)


def check_step(run: Run, ref: dict, before: torch.Tensor, where: str):
    assert_params_close(run.p, ref["p"], before, run.name, f"{where}: p vs reference")
    assert run.p.dtype == run.dtype
    for key in ("state1", "state2"):
        got, want = run.tensors()[key], ref[key]
        if want is None:
            continue
        if run.bits == 32:
            atol = 32 * EPS32 * want.abs().max().item()
            assert_close(got, want, f"{where}: {key} vs reference", rtol=32 * EPS32, atol=atol)
        else:
            assert_codes_near(got, want, f"{where}: {key} codes vs reference", max_step=1, max_fraction=0.01)
            absmax = "absmax1" if key == "state1" else "absmax2"
            assert_close(run.tensors()[absmax], ref[absmax], f"{where}: {absmax} vs reference", rtol=32 * EPS32, atol=0)
    if run.bits == 32 and ref["unorm_vec"] is not None:
        assert_close(run.unorm_vec, ref["unorm_vec"], f"{where}: unorm_vec vs reference", rtol=1e-5, atol=0)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("bits", [32, 8])
@pytest.mark.parametrize("name", OPTIMIZER_NAMES)
def test_steps_match_reference(bnb_device, name, bits, dtype):
    run = Run(name, bits, dtype, bnb_device)
    for step in range(1, STEPS + 1):
        g = randn((N,), dtype, seed_of("g", name, bits, dtype, step), spread=False)
        before = run.p.clone()
        ref = run.step(g, step)
        check_step(run, ref, before, f"{name} {bits}-bit {dtype_id(dtype)} step {step}")


@pytest.mark.parametrize("bits", [32, 8])
@pytest.mark.parametrize("name", OPTIMIZER_NAMES)
def test_zero_lr_keeps_parameters(bnb_device, name, bits):
    run = Run(name, bits, torch.float32, bnb_device, lr=0.0, weight_decay=0.0)
    before = run.p.clone()
    for step in (1, 2):
        g = randn((N,), torch.float32, seed_of("z", name, bits, step), spread=False)
        run.step(g, step)
        assert_equal(run.p, before, f"{name} {bits}-bit: lr=0 must leave p unchanged (step {step})")


@pytest.mark.parametrize("bits", [32, 8])
@pytest.mark.parametrize("name", OPTIMIZER_NAMES)
def test_skip_zeros(bnb_device, name, bits):
    run = Run(name, bits, torch.float32, bnb_device, skip_zeros=True)
    g = randn((N,), torch.float32, seed_of("s", name, bits), spread=False)
    run.step(g, 1)  # give the states non-zero values first
    g = randn((N,), torch.float32, seed_of("s2", name, bits), spread=False)
    zero = torch.zeros(N, dtype=torch.bool)
    zero[::7] = True
    g[zero] = 0.0
    before = run.tensors()
    before = {k: (v.clone() if v is not None else None) for k, v in before.items()}
    ref = run.step(g, 2)
    check_step(run, ref, before["p"], f"{name} {bits}-bit skip_zeros")
    assert_equal(run.p.cpu()[zero], before["p"].cpu()[zero], "p where g == 0 is unchanged")
    if bits == 32:
        for key in ("state1", "state2"):
            if before[key] is not None:
                assert_equal(run.tensors()[key].cpu()[..., zero], before[key].cpu()[..., zero], f"{key} where g == 0")
    assert not torch.equal(run.p.cpu()[~zero], before["p"].cpu()[~zero]), "the other elements must move"


@pytest.mark.parametrize("bits", [32, 8])
@pytest.mark.parametrize("name", [n for n in OPTIMIZER_NAMES if n not in CLIPPED_OPTIMIZERS])
def test_nonfinite_gradient(bnb_device, name, bits):
    """A NaN gradient poisons its state element (8-bit: its block's absmax) and its parameter, nothing else.

    Lion included: its ``sign(u)`` of a NaN ``u`` is NaN here, although ``torch.sign(NaN)`` is 0.
    """
    run = Run(name, bits, torch.float32, bnb_device)
    g = randn((N,), torch.float32, seed_of("nf", name, bits), spread=False)
    bad = OPTIMIZER_BLOCKSIZE + 3
    g[bad] = float("nan")
    before = run.p.clone()
    ref = run.step(g, 1)
    keep = torch.ones(N, dtype=torch.bool)
    keep[bad] = False
    where = f"{name} {bits}-bit NaN gradient"
    assert_params_close(run.p.cpu()[keep], ref["p"][keep], before.cpu()[keep], name, f"{where}: p vs reference")
    if bits == 8:
        # The codes of the poisoned block are not defined; the other blocks' are.
        block = torch.arange(N) // OPTIMIZER_BLOCKSIZE != 1
        got, want = run.state1.cpu().reshape(-1, N)[:, block], ref["state1"].reshape(-1, N)[:, block]
        assert_codes_near(got, want, f"{where}: state1 codes", max_step=1, max_fraction=0.01)
        assert_close(run.absmax1, ref["absmax1"], f"{where}: absmax1 vs reference", rtol=32 * EPS32, atol=0)
    p = run.p.cpu()
    assert not p[bad].isfinite().item(), "a NaN gradient makes its parameter non-finite"
    assert_all(p[keep].isfinite(), "the other parameters stay finite", p)
    if bits == 32:
        state1 = run.state1.cpu().reshape(-1, N)
        assert not state1[0, bad].isfinite().item(), "a NaN gradient makes its state non-finite"
        assert_all(state1[:, keep].isfinite(), "the other states stay finite", state1)
    else:
        absmax1 = run.absmax1.cpu().reshape(-1, n_blocks(N, OPTIMIZER_BLOCKSIZE))
        assert not absmax1[0, 1].isfinite().item(), "the poisoned block's absmax is non-finite"
        assert_all(absmax1[:, [0, 2, 3]].isfinite(), "the other blocks' absmax stay finite", absmax1)
