"""Module and optimizer checkpoints, written and checked by whichever bitsandbytes is importable.

The same code runs in two venvs: upstream's release (the fixtures, and the check of our checkpoints)
and this project's package (the checkpoints that upstream must load). It only uses the public API the
two share. Every weight, input and gradient comes from a fixed seed.

A record is a dict: ``modules`` maps a case name to its state dict, input ``x`` and outputs (4-bit:
``y_train`` and the dequantized weight; 8-bit: ``y_train`` and ``y_eval``); ``optimizers`` maps a case name to the
optimizer's state dict after a few steps, the parameters and gradients needed for one more step, and
the parameters and state dict after that step.
"""

from __future__ import annotations

import copy

import torch

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}

# (quant_type, compress_statistics, quant_storage, weight dtype, compute dtype or None, bias)
LINEAR4BIT = {
    "nf4-dq1-uint8": ("nf4", True, "uint8", "bf16", "bf16", True),
    "nf4-dq0-uint8": ("nf4", False, "uint8", "fp32", "fp32", True),
    "nf4-dq1-bf16": ("nf4", True, "bfloat16", "bf16", "bf16", True),
    "nf4-dq0-bf16": ("nf4", False, "bfloat16", "fp16", "fp16", True),
    "fp4-dq1-uint8": ("fp4", True, "uint8", "fp16", "fp32", True),
    "fp4-dq0-uint8": ("fp4", False, "uint8", "fp32", None, True),
    "fp4-dq1-bf16": ("fp4", True, "bfloat16", "fp32", "bf16", True),
    "fp4-dq0-bf16": ("fp4", False, "bfloat16", "bf16", "bf16", False),
}
# Multiples of 64 and 32, which upstream's AVX512-BF16 inference route requires. Its output is not
# recorded (it rounds to bfloat16 and exists only on such CPUs); training mode is the same everywhere.
IN_4BIT, OUT_4BIT = 64, 32

# (threshold, module dtype)
LINEAR8BIT = {
    "int8-t0-fp16": (0.0, "fp16"),
    "int8-t6-fp16": (6.0, "fp16"),
    "int8-t6-bf16": (6.0, "bf16"),
}
IN_8BIT, OUT_8BIT = 96, 48

# (optimizer class name, keyword arguments, parameter shapes). In each case one parameter is large
# enough for 8-bit state (min_8bit_size, 4096 by default: the first case keeps the default, the others
# lower it to stay small) and one is below it, so a state dict holds both the 8-bit and the 32-bit
# layout. 480 values make two blocks of 256, the second a partial one.
OPTIMIZERS = {
    "Adam8bit": ("Adam8bit", {"lr": 1e-2, "weight_decay": 1e-2}, ((65, 64), (10,))),
    "Lion8bit": ("Lion8bit", {"lr": 1e-3, "betas": (0.9, 0.99), "min_8bit_size": 256}, ((24, 20), (10,))),
    "PagedAdamW8bit": ("PagedAdamW8bit", {"lr": 1e-2, "min_8bit_size": 256}, ((24, 20), (10,))),
    "AdEMAMix8bit": ("AdEMAMix8bit", {"lr": 1e-2, "min_8bit_size": 256}, ((24, 20), (10,))),
}
OPT_STEPS = 3


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def seed_of(name: str, salt: int) -> int:
    """A seed that depends only on the case name (stable across runs and Python processes)."""
    return salt + sum((i + 1) * b for i, b in enumerate(name.encode()))


def weight_and_bias(name: str, out_f: int, in_f: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = generator(seed_of(name, 5000))
    # Rows with different scales, so blocks get different absmax values.
    w = torch.randn(out_f, in_f, generator=gen) * torch.exp(torch.randn(out_f, 1, generator=gen))
    return w * 0.1, torch.randn(out_f, generator=gen) * 0.1


def linear4bit_input(name: str) -> torch.Tensor:
    # FP4 cases take a batch of sequences (3-D), NF4 cases a plain batch.
    shape = (2, 3, IN_4BIT) if name.startswith("fp4") else (3, IN_4BIT)
    return torch.randn(shape, generator=generator(seed_of(name, 6000)))


def linear8bit_input(name: str, threshold: float) -> torch.Tensor:
    x = torch.randn(4, IN_8BIT, generator=generator(seed_of(name, 7000)))
    if threshold:
        # Outliers above the threshold in two columns (one of them in a single row).
        x[0, 5], x[2, 5], x[3, 40] = 8.0, -9.5, 7.25
    # The bfloat16 case takes a batch of sequences (3-D).
    return x.reshape(2, 2, IN_8BIT) if name.endswith("bf16") else x


def build_linear4bit(bnb, name: str):
    """A freshly built, unquantized Linear4bit holding the case's weight (not yet moved to a device)."""
    qt, dq, storage, wdt, cdt, bias = LINEAR4BIT[name]
    m = bnb.nn.Linear4bit(
        IN_4BIT,
        OUT_4BIT,
        bias=bias,
        compute_dtype=DTYPES[cdt] if cdt else None,
        compress_statistics=dq,
        quant_type=qt,
        quant_storage=getattr(torch, storage),
    )
    w, b = weight_and_bias(name, OUT_4BIT, IN_4BIT)
    with torch.no_grad():
        m.weight.data = w
        if bias:
            m.bias.data = b
    return m.to(DTYPES[wdt])


def build_linear8bit(bnb, name: str):
    threshold, dt = LINEAR8BIT[name]
    m = bnb.nn.Linear8bitLt(IN_8BIT, OUT_8BIT, bias=True, has_fp16_weights=False, threshold=threshold)
    w, b = weight_and_bias(name, OUT_8BIT, IN_8BIT)
    with torch.no_grad():
        m.weight.data = w
        m.bias.data = b
    return m.to(DTYPES[dt])


def outputs(module, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Forward in training mode, then in evaluation mode, without autograd."""
    out = {}
    with torch.no_grad():
        module.train()
        out["y_train"] = module(x.clone())
        module.eval()
        out["y_eval"] = module(x.clone())
    return out


def detached(sd: dict) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone().contiguous() for k, v in sd.items()}


def record_modules(bnb) -> dict:
    F = bnb.functional
    cases = {}
    for name, (_, _, _, wdt, cdt, _) in LINEAR4BIT.items():
        m = build_linear4bit(bnb, name).to("cpu")  # quantizes
        x = linear4bit_input(name).to(DTYPES[cdt or wdt])
        case = {"state_dict": detached(m.state_dict()), "x": x}
        case["weight_dequant"] = F.dequantize_4bit(m.weight.data, m.weight.quant_state)
        with torch.no_grad():
            m.train()
            case["y_train"] = m(x.clone())
        cases[name] = case
    for name, (threshold, dt) in LINEAR8BIT.items():
        m = build_linear8bit(bnb, name).to("cpu")
        x = linear8bit_input(name, threshold).to(DTYPES[dt])
        case = {"state_dict": detached(m.state_dict()), "x": x}
        case.update(outputs(m, x))
        cases[name] = case
    return cases


def optimizer_params(name: str) -> list[torch.nn.Parameter]:
    gen = generator(seed_of(name, 8000))
    return [torch.nn.Parameter(torch.randn(shape, generator=gen)) for shape in OPTIMIZERS[name][2]]


def optimizer_grads(name: str, step: int) -> list[torch.Tensor]:
    gen = generator(seed_of(name, 9000 + 100 * step))
    return [torch.randn(shape, generator=gen) * (1 + step) for shape in OPTIMIZERS[name][2]]


def build_optimizer(bnb, name: str, params):
    cls, kwargs, _ = OPTIMIZERS[name]
    return getattr(bnb.optim, cls)(params, **kwargs)


def record_optimizers(bnb) -> dict:
    cases = {}
    for name in OPTIMIZERS:
        params = optimizer_params(name)
        opt = build_optimizer(bnb, name, params)
        for step in range(OPT_STEPS):
            for p, g in zip(params, optimizer_grads(name, step), strict=True):
                p.grad = g
            opt.step()
        case = {
            "state_dict": copy.deepcopy(opt.state_dict()),  # the next step updates in place
            "params": [p.detach().clone() for p in params],
            "grads": optimizer_grads(name, OPT_STEPS),
        }
        for p, g in zip(params, case["grads"], strict=True):
            p.grad = g.clone()
        opt.step()
        case["params_next"] = [p.detach().clone() for p in params]
        case["state_dict_next"] = copy.deepcopy(opt.state_dict())
        cases[name] = case
    return cases


def record(bnb) -> dict:
    return {"modules": record_modules(bnb), "optimizers": record_optimizers(bnb)}
