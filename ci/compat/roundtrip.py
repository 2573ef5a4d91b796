"""Upstream bitsandbytes loads this project's checkpoints and gets this project's results.

    python ci/compat/roundtrip.py --upstream-python PATH   # from this project's venv: write, then check
    python ci/compat/roundtrip.py --write FILE             # this project's venv: write our checkpoints
    python ci/compat/roundtrip.py --check FILE             # upstream's venv: load them and compare

The writer builds the cases of checkpoints.py with our package and saves state dicts, inputs and our
outputs. The checker loads them the way clients load checkpoints into upstream (transformers'
Params4bit.from_prequantized for 4-bit; for Linear8bitLt, upstream's requirement of moving the module
to the device before load_state_dict) and requires identical stored bytes and dequantized weights,
outputs within a few units of precision times sum(|x| * |w|) + |bias| (the kernels accumulate in
different orders), and, for optimizers, the next step within a few float32 units and the requantized
state within one code.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from compat import checkpoints

UPSTREAM_VERSION = "0.50.2"
ULPS = 2
STEP_ULPS = 4  # an optimizer step: a handful of float32 roundings in another order
WRAPPED = "__bnb_optimizer_quant_state__"


def identical_up_to_zero_sign(a, b) -> bool:
    """``identical``, except that a zero may carry either sign. Upstream's own FP4 dequantization of code
    0b1000 (the negative zero) depends on the machine: its CUDA kernel and its CPU path without AVX-512
    compute -0.0 (sign * 0 * absmax), its AVX-512 CPU path reads +0.0 from the code table, as this
    package does on every device (the fixtures, made on an AVX-512 machine, hold +0.0)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    zero = (a == 0) & (b == 0)
    return identical(torch.where(zero, torch.zeros_like(a), a), torch.where(zero, torch.zeros_like(b), b))


def out_tolerance(x, w, bias, dtype):
    scale = x.double().abs().reshape(-1, x.shape[-1]) @ w.double().abs().t()
    if bias is not None:
        scale = scale + bias.double().abs()
    return (ULPS * torch.finfo(dtype).eps * scale + torch.finfo(dtype).tiny).reshape(*x.shape[:-1], -1)


def identical(a, b) -> bool:
    """Same dtype, shape and bytes (packed 4-bit codes stored as bfloat16 may read as NaN)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))


class Checker:
    def __init__(self) -> None:
        self.failures: list[str] = []
        self.checks = 0

    def expect(self, ok: bool, what: str) -> None:
        self.checks += 1
        if not ok:
            self.failures.append(what)
            print(f"FAIL {what}")

    def close(self, ours, theirs, tol, what: str) -> None:
        same_kind = ours.dtype == theirs.dtype and ours.shape == theirs.shape
        err = (ours.double() - theirs.double()).abs() if same_kind else None
        ok = same_kind and bool(torch.isfinite(ours).all()) and bool((err <= tol).all())
        detail = f"max error {err.max().item():.3g}" if same_kind else f"{ours.dtype}{tuple(ours.shape)}"
        self.expect(ok, f"{what}: {detail}")

    def same_state_dict(self, ours: dict, theirs: dict, what: str) -> None:
        self.expect(list(ours) == list(theirs), f"{what}: keys {list(ours)} != {list(theirs)}")
        for k, v in theirs.items():
            o = ours.get(k)
            self.expect(o is not None and identical(o, v), f"{what}: {k} differs")


def load_linear4bit(bnb, name: str, sd: dict):
    qt, dq, storage, _, cdt, bias = checkpoints.LINEAR4BIT[name]
    m = bnb.nn.Linear4bit(
        checkpoints.IN_4BIT,
        checkpoints.OUT_4BIT,
        bias=bias,
        compute_dtype=checkpoints.DTYPES[cdt] if cdt else None,
        compress_statistics=dq,
        quant_type=qt,
        quant_storage=getattr(torch, storage),
    )
    stats = {k.removeprefix("weight."): v for k, v in sd.items() if k.startswith("weight.")}
    m.weight = bnb.nn.Params4bit.from_prequantized(
        data=sd["weight"], quantized_stats=stats, requires_grad=False, device="cpu", module=m
    )
    if bias:
        m.bias = torch.nn.Parameter(sd["bias"].clone(), requires_grad=False)
    return m


def check_modules(bnb, cases: dict, c: Checker) -> None:
    F = bnb.functional
    for name in checkpoints.LINEAR4BIT:
        data = cases[name]
        sd = data["state_dict"]
        m = load_linear4bit(bnb, name, sd)
        w = F.dequantize_4bit(m.weight.data, m.weight.quant_state)
        c.expect(identical_up_to_zero_sign(w, data["weight_dequant"]), f"{name}: dequantized weight")
        c.same_state_dict(m.state_dict(), sd, f"{name}: state dict")
        cdt = checkpoints.LINEAR4BIT[name][4]
        compute = checkpoints.DTYPES[cdt] if cdt else data["x"].dtype
        coarse = max(compute, data["x"].dtype, key=lambda d: torch.finfo(d).eps)
        tol = out_tolerance(data["x"], w.to(compute), sd.get("bias"), coarse)
        with torch.no_grad():
            m.train()  # upstream's inference route on AVX512-BF16 CPUs computes in bfloat16
            c.close(m(data["x"].clone()), data["y_train"], tol, f"{name}: output")
    for name, (threshold, dt) in checkpoints.LINEAR8BIT.items():
        data = cases[name]
        sd = data["state_dict"]
        m = bnb.nn.Linear8bitLt(
            checkpoints.IN_8BIT, checkpoints.OUT_8BIT, bias=True, has_fp16_weights=False, threshold=threshold
        )
        m = m.to(checkpoints.DTYPES[dt]).to("cpu")  # upstream loads int8 weights only into a quantized module
        m.load_state_dict(sd)
        c.same_state_dict(m.state_dict(), sd, f"{name}: state dict")
        w = sd["weight"].double() * sd["SCB"].double().unsqueeze(1) / 127
        tol = out_tolerance(data["x"], w, sd["bias"], data["x"].dtype)
        # Each mode against ours in that mode: on CPU both packages compute training mode with the
        # float route (MatMul8bitFp) and evaluation mode with LLM.int8().
        with torch.no_grad():
            for mode in ("train", "eval"):
                getattr(m, mode)()
                c.close(m(data["x"].clone()), data[f"y_{mode}"], tol, f"{name}: {mode}-mode output")


def check_optimizers(bnb, cases: dict, c: Checker) -> None:
    eps32 = torch.finfo(torch.float32).eps
    for name, data in cases.items():
        params = [torch.nn.Parameter(t.clone()) for t in data["params"]]
        opt = checkpoints.build_optimizer(bnb, name, params)
        opt.load_state_dict(data["state_dict"])
        for p, g in zip(params, data["grads"], strict=True):
            p.grad = g.clone()
        opt.step()
        for i, (p, before, ours) in enumerate(zip(params, data["params"], data["params_next"], strict=True)):
            tol = STEP_ULPS * eps32 * (before.abs() + (ours - before).abs()) + torch.finfo(torch.float32).tiny
            c.close(p.detach(), ours, tol, f"{name}: parameter {i} after one more step")
        sd = opt.state_dict()
        for i, state in data["state_dict_next"]["state"].items():
            c.expect(sd["state"][i]["step"] == state["step"], f"{name}: step of parameter {i}")
            theirs_q = sd["state"][i][WRAPPED]
            c.expect(sorted(theirs_q) == sorted(state[WRAPPED]), f"{name}: state keys of parameter {i}")
            for key, value in state[WRAPPED].items():
                got = theirs_q.get(key)
                if got is None or got.shape != value.shape or got.dtype != value.dtype:
                    c.expect(False, f"{name}: {key} of parameter {i} has another shape or dtype")
                elif value.dtype == torch.uint8:
                    diff = (got.long() - value.long()).abs()
                    ok = diff.max() <= 1 and (diff > 0).float().mean() < 0.02
                    c.expect(bool(ok), f"{name}: codes {key} of parameter {i}")
                elif key.startswith("qmap"):
                    c.expect(identical(got, value), f"{name}: {key} of parameter {i}")
                else:
                    # absmax, or a 32-bit state: an EMA of g (state1) or g * g (state2), whose terms may cancel.
                    terms = value.abs()
                    if not key.startswith("absmax"):
                        g = data["grads"][i].abs()
                        terms = terms + data["state_dict"]["state"][i][WRAPPED][key].abs()
                        terms = terms + (g * g if key == "state2" else g)
                    tol = STEP_ULPS * eps32 * terms + torch.finfo(torch.float32).tiny
                    c.close(got, value, tol, f"{name}: {key} of parameter {i}")


def write(path: Path) -> None:
    import bitsandbytes

    if bitsandbytes.__version__ == UPSTREAM_VERSION:
        sys.exit(f"--write must run with this project's bitsandbytes, found upstream's at {bitsandbytes.__file__}")
    torch.save(checkpoints.record(bitsandbytes), path)
    print(f"wrote our checkpoints to {path}")


def check(path: Path) -> int:
    import bitsandbytes

    if bitsandbytes.__version__ != UPSTREAM_VERSION:
        sys.exit(f"--check must run with upstream bitsandbytes {UPSTREAM_VERSION}, found {bitsandbytes.__version__}")
    recorded = torch.load(path, weights_only=True)
    c = Checker()
    check_modules(bitsandbytes, recorded["modules"], c)
    check_optimizers(bitsandbytes, recorded["optimizers"], c)
    print(f"upstream {bitsandbytes.__version__} loaded our checkpoints: {c.checks - len(c.failures)}/{c.checks} ok")
    return 1 if c.failures else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--upstream-python", help="python of a venv that holds upstream bitsandbytes")
    mode.add_argument("--write", type=Path, metavar="FILE")
    mode.add_argument("--check", type=Path, metavar="FILE")
    args = parser.parse_args()
    if args.write:
        write(args.write)
        return 0
    if args.check:
        return check(args.check)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ours.pt"
        write(path)
        # A fresh interpreter, without a PYTHONPATH that could lead it to our package (same import name).
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        return subprocess.run([args.upstream_python, __file__, "--check", str(path)], env=env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
