"""The nn modules and optimizers on the device under test give what they give on the reference kernels.

The op modules test each kernel alone; here the modules chain them as users call them (quantize the
weight on ``.to(device)``, then dequantize / matmul; an 8-bit optimizer's state through several steps).
The expected result is the same module run on the CPU with the reference kernels registered as the
``cpu`` kernels for the while (``bad_inputs.registered_for_cpu``), so a CPU backend under test is
compared with the reference too. Tolerances are those of a chain of fp16 matmuls and of three
optimizer steps; ``Linear4bit`` is also checked against float64 math on its dequantized weight.
"""

from __future__ import annotations

import pytest
import torch

import bitsandbytes as bnb
from bitsandbytes._reference import REFERENCE

from ..bad_inputs import registered_for_cpu
from ..compare import assert_close


def on_reference_cpu(fn):
    """``fn("cpu")`` with the reference kernels serving the cpu device."""
    with registered_for_cpu(REFERENCE):
        return fn("cpu")


def module(cls, device, **kwargs):
    torch.manual_seed(0)
    return cls(96, 40, bias=True, **kwargs).to(device)


@pytest.mark.parametrize("batch", [1, 8])
def test_linear8bitlt(bnb_device, batch):
    x = torch.randn(batch, 96, generator=torch.Generator().manual_seed(1)).half()
    x[:, 3] *= 20  # an outlier column

    def run(device):
        # Evaluation mode: LLM.int8() everywhere (in training mode CPU takes upstream's float route).
        m = module(bnb.nn.Linear8bitLt, device, has_fp16_weights=False, threshold=6.0).half().eval()
        with torch.no_grad():
            return m(x.to(device)).float().cpu()

    assert_close(run(bnb_device), on_reference_cpu(run), "Linear8bitLt on device vs reference", rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
@pytest.mark.parametrize("batch", [1, 8])
def test_linear4bit(bnb_device, quant_type, batch):
    x = torch.randn(batch, 96, generator=torch.Generator().manual_seed(2)).half()
    weights = {}

    def run(device):
        m = module(bnb.nn.Linear4bit, device, quant_type=quant_type, compute_dtype=torch.float16)
        with torch.no_grad():
            w = bnb.functional.dequantize_4bit(m.weight.data, m.weight.quant_state).double().cpu()
            weights[str(device)] = (w, m.bias.detach().double().cpu())
            return m(x.to(device)).float().cpu()

    got = run(bnb_device)
    assert_close(got, on_reference_cpu(run), "Linear4bit on device vs reference", rtol=2e-2, atol=2e-2)
    w, b = weights[str(bnb_device)]
    truth = (x.double() @ w.T + b).float()
    assert_close(got, truth, "Linear4bit vs float64 x @ W.T + b on its dequantized weight", rtol=2e-2, atol=2e-2)


@pytest.mark.filterwarnings("ignore:.*has no paged:UserWarning")  # a paged optimizer says so off-GPU
@pytest.mark.parametrize("name", ["Adam8bit", "AdamW", "PagedAdamW8bit", "Lion8bit", "SGD8bit"])
def test_optimizer_steps(bnb_device, name):
    def run(device):
        torch.manual_seed(3)
        p = torch.nn.Parameter(torch.randn(64, 80, device="cpu").to(device))
        kwargs = {"momentum": 0.9} if name.startswith("SGD") else {}
        opt = getattr(bnb.optim, name)([p], lr=1e-2, **kwargs)
        g = torch.Generator().manual_seed(4)
        for _ in range(3):
            p.grad = torch.randn(64, 80, generator=g).to(device)
            opt.step()
        return p.detach().cpu()

    assert_close(
        run(bnb_device), on_reference_cpu(run), f"{name}: 3 steps on device vs reference", rtol=1e-3, atol=1e-3
    )
