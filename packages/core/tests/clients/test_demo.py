"""The QLoRA demo (examples/demo.py): where ``--device`` puts it, the ``device_map`` its loader gives
transformers and why (checked against the installed transformers and accelerate, with the machine's
accelerators faked), the kernel summary of its report, and one short run end to end on this machine."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import transformers

import bitsandbytes as bnb
from bitsandbytes.diagnostics import op_trace

EXAMPLES = Path(__file__).resolve().parents[4] / "examples"


@pytest.fixture
def demo(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    from qlora_demo import device, model, report

    return SimpleNamespace(device=device, model=model, report=report)


def fake_machine(monkeypatch, *, cuda: bool, mps: bool, mps_built: bool = True):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)
    monkeypatch.setattr(torch.backends.mps, "is_built", lambda: mps_built)


@pytest.mark.parametrize(
    ("cuda", "mps", "expected"),
    [(True, True, "cuda"), (True, False, "cuda"), (False, True, "mps"), (False, False, "cpu")],
)
def test_auto_prefers_cuda_then_mps_then_cpu(demo, monkeypatch, cuda, mps, expected):
    fake_machine(monkeypatch, cuda=cuda, mps=mps)
    assert demo.device.resolve("auto") == expected
    assert demo.device.resolve("cpu") == "cpu"  # asking for the CPU is never overridden


def test_a_named_accelerator_that_is_missing_is_an_error(demo, monkeypatch):
    fake_machine(monkeypatch, cuda=False, mps=False, mps_built=False)
    with pytest.raises(ValueError, match=r"--device cuda: torch.cuda.is_available\(\) is false"):
        demo.device.resolve("cuda")
    with pytest.raises(ValueError, match=r"--device mps: .*this torch build has no MPS support"):
        demo.device.resolve("mps")
    fake_machine(monkeypatch, cuda=False, mps=False, mps_built=True)
    with pytest.raises(ValueError, match=r"--device mps: .*macOS 12\.3"):
        demo.device.resolve("mps")
    with pytest.raises(ValueError, match="--device must be one of cpu, mps, cuda, auto; got 'gpu'"):
        demo.device.resolve("gpu")


def test_bfloat16_on_mps_needs_macos_14(demo, monkeypatch):
    monkeypatch.setattr(torch.backends.mps, "is_macos_or_newer", lambda major, minor: (major, minor) <= (13, 5))
    with pytest.raises(ValueError, match="bfloat16 on mps needs macOS 14"):
        demo.device.check_dtype("mps", torch.bfloat16)
    demo.device.check_dtype("mps", torch.float32)
    demo.device.check_dtype("cpu", torch.bfloat16)
    monkeypatch.setattr(torch.backends.mps, "is_macos_or_newer", lambda major, minor: (major, minor) <= (14, 0))
    demo.device.check_dtype("mps", torch.bfloat16)


class _Placed:
    """Stands in for a loaded model: every parameter on ``device``."""

    def __init__(self, device: str):
        self.tensor = SimpleNamespace(device=torch.device(device))

    def parameters(self):
        return [self.tensor]

    def buffers(self):
        return []


@pytest.mark.parametrize("device", ["cpu", "mps", "cuda"])
def test_loader_names_the_device_in_device_map(demo, monkeypatch, tmp_path, device):
    seen = {}

    def from_pretrained(path, **kwargs):
        seen.update(kwargs, path=path)
        return _Placed(kwargs["device_map"][""])

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", from_pretrained)
    demo.model.load_4bit(tmp_path, torch.bfloat16, device)
    assert seen["device_map"] == {"": device}
    q = seen["quantization_config"]
    assert (q.load_in_4bit, q.bnb_4bit_quant_type, q.bnb_4bit_use_double_quant) == (True, "nf4", True)
    assert q.bnb_4bit_compute_dtype == torch.bfloat16 and seen["dtype"] == torch.bfloat16


def test_loader_refuses_a_model_placed_elsewhere(demo, monkeypatch, tmp_path):
    # What an unset device_map does on a Mac (below): the model on the CPU although mps was asked for.
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", lambda path, **kw: _Placed("cpu"))
    with pytest.raises(RuntimeError, match=r"asked for the model on mps, transformers placed it on \['cpu'\]"):
        demo.model.load_4bit(tmp_path, torch.float32, "mps")


def test_transformers_puts_an_unmapped_4bit_model_on_the_cpu_of_a_mac(monkeypatch):
    """Why the demo names the device: with device_map unset, transformers' 4-bit quantizer picks CUDA, NPU,
    HPU or XPU, else the CPU, never MPS; a named map passes through unchanged."""
    from transformers.integrations.accelerate import check_and_set_device_map
    from transformers.quantizers import quantizer_bnb_4bit

    fake_machine(monkeypatch, cuda=False, mps=True)
    for name in ("is_torch_npu_available", "is_torch_hpu_available", "is_torch_xpu_available"):
        monkeypatch.setattr(quantizer_bnb_4bit, name, lambda: False)
    quantizer = quantizer_bnb_4bit.Bnb4BitHfQuantizer(transformers.BitsAndBytesConfig(load_in_4bit=True))
    assert quantizer.update_device_map(None) == {"": "cpu"}
    assert quantizer.update_device_map({"": "mps"}) == {"": "mps"}
    assert check_and_set_device_map("mps") == {"": torch.device("mps")}
    assert check_and_set_device_map({"": "mps"}) == {"": "mps"}


def test_device_map_auto_on_a_mac_is_all_mps(monkeypatch):
    """``device_map="auto"`` on a Mac: accelerate budgets unified memory as "mps" alone (no CPU entry), and
    transformers then maps every module to mps."""
    import accelerate.utils.modeling as accelerate_modeling
    from transformers.integrations.accelerate import get_max_memory, infer_auto_device_map

    monkeypatch.setattr(accelerate_modeling, "is_mps_available", lambda *a, **k: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert list(get_max_memory()) == ["mps"]
    config = transformers.LlamaConfig(
        vocab_size=66, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2
    )
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config)
    mapped = infer_auto_device_map(model, max_memory={"mps": 2**30}, no_split_module_classes=model._no_split_modules)
    assert dict(mapped) == {"": "mps"}


def test_kernel_summary_names_metal_kernels_and_the_reference(demo, monkeypatch):
    kinds = {("gemv_4bit", "mps"): "native", ("int8_linear_matmul", "mps"): "reference"}
    monkeypatch.setattr(op_trace, "kernel_kind", lambda op, dev: kinds.get((op, dev), "native"))
    trace = op_trace.OpTrace(Counter({("gemv_4bit", "mps"): 3, ("int8_linear_matmul", "mps"): 1}))
    other = op_trace.OpTrace(Counter({("quantize_4bit", "cpu"): 2}))
    assert demo.report.kernel_summary(trace, None, other) == [
        "  cpu: ops on native CPU kernels: quantize_4bit; ops on the reference (pure PyTorch on cpu): none",
        "  mps: ops on Metal kernels: gemv_4bit; ops on the reference (pure PyTorch on mps): int8_linear_matmul",
    ]
    assert demo.report.kernel_summary(None) == ["  (no bitsandbytes op ran)"]


@pytest.mark.filterwarnings("ignore:PagedAdamW8bit.*unpaged:UserWarning")
def test_paging_says_what_it_means_on_each_device(demo):
    param = torch.nn.Parameter(torch.randn(4096))
    param.grad = torch.randn(4096)
    optimizer = bnb.optim.PagedAdamW8bit([param])
    optimizer.step()
    assert demo.report.paging(optimizer, "cpu").startswith("unpaged: no managed memory on cpu")
    paged = SimpleNamespace(state={param: {"state1": SimpleNamespace(is_paged=True)}})
    assert "unified memory" in demo.report.paging(paged, "mps")
    assert "CUDA managed memory" in demo.report.paging(paged, "cuda")


@pytest.mark.skipif(
    torch.cuda.is_available() or torch.backends.mps.is_available(),
    reason="--device auto resolves to cpu only on a machine without CUDA and MPS",
)
def test_demo_runs_end_to_end_with_auto_on_the_cpu(tmp_path):
    """The demo as a user runs it, a few steps: ``--device auto`` is the CPU here, the model is loaded
    there, and the report says which kernels served each op."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    args = ["--device", "auto", "--steps", "3", "--plot", str(tmp_path / "loss.png")]
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "demo.py"), *args], capture_output=True, text=True, env=env, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "device cpu (--device auto)" in out and "device_map={'': 'cpu'}" in out
    assert "quantized to NF4 + double quant in" in out and ", on cpu" in out
    assert "after 3 steps: loss" in out
    summary = out.split("which kernels ran the bitsandbytes ops")[1].splitlines()[1]
    assert summary.startswith("  cpu: ops on ") and "ops on the reference (pure PyTorch on cpu): " in summary
    for op in ("quantize_4bit", "gemm_4bit", "optimizer_update_8bit_blockwise"):
        assert op in summary
