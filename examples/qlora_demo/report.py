"""What the demo measures and prints: memory of weights and optimizer state, op/kernel table, loss curve."""

from __future__ import annotations

from pathlib import Path

import torch

import bitsandbytes as bnb
from bitsandbytes.backends import dispatch, records
from bitsandbytes.diagnostics.op_trace import OpTrace
from bitsandbytes.diagnostics.report import table


def nbytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def fourbit_weight_bytes(model: torch.nn.Module) -> tuple[int, int, int]:
    """(layers, bytes as fp32, bytes as stored) over every Linear4bit. Stored bytes are the packed codes
    plus every tensor of the quantization state as it is serialized (scales, code tables)."""
    layers = fp32 = stored = 0
    for module in model.modules():
        if isinstance(module, bnb.nn.Linear4bit):
            weight = module.weight
            layers += 1
            fp32 += weight.quant_state.shape.numel() * 4
            state = weight.quant_state.as_dict(packed=True)
            stored += nbytes(weight.data, *(v for v in state.values() if isinstance(v, torch.Tensor)))
    return layers, fp32, stored


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    return sum(nbytes(v) for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor))


def is_paged(optimizer: torch.optim.Optimizer) -> bool:
    """Whether any state tensor lives in paged (managed) memory; devices without it get ordinary memory."""
    return any(getattr(v, "is_paged", False) for state in optimizer.state.values() for v in state.values())


def paging(optimizer: torch.optim.Optimizer, device: str) -> str:
    """What paging means for the optimizer state on ``device``: on Apple Silicon the CPU and GPU share one
    memory, so the mps backend registers plain MPS memory as "paged" and there is nothing to move."""
    if not is_paged(optimizer):
        return f"unpaged: no managed memory on {device} (no backend registered it)"
    if device == "mps":
        return "paged: unified memory (plain MPS memory, shared by CPU and GPU; nothing to page)"
    if device == "cuda":
        return "paged: CUDA managed memory (pages move to the host under memory pressure)"
    return f"paged: managed memory on {device}"


def adamw32_state_bytes(params: list[torch.nn.Parameter]) -> int:
    """What bitsandbytes' 32-bit AdamW holds for the same parameters: measured on copies after one step."""
    copies = [torch.zeros_like(p, requires_grad=True) for p in params]
    for c in copies:
        c.grad = torch.zeros_like(c)
    optimizer = bnb.optim.AdamW(copies, optim_bits=32)
    optimizer.step()
    return optimizer_state_bytes(optimizer)


def backend_of(op: str, device: str) -> str:
    for record in records():
        if (op, device) in record.kernels:
            return f"{record.name} ({record.dist})" if record.dist else record.name
    return "core (pure PyTorch)"


def op_lines(trace: OpTrace | None) -> list[str]:
    if trace is None:
        return ["  (not traced: the run was too short)"]
    rows = [(r.op, r.device, str(r.calls), r.kernel, backend_of(r.op, r.device)) for r in trace.rows()]
    if not rows:
        return ["  (no bitsandbytes op ran)"]
    return table(("op", "device", "calls", "kernel", "from"), rows)


# What a backend's own kernels are called on each device type, for the one-line summary.
NATIVE_NAME = {"mps": "Metal kernels", "cuda": "CUDA kernels", "cpu": "native CPU kernels"}


def kernel_summary(*traces: OpTrace | None) -> list[str]:
    """Per device: which ops ran on the backend's kernels and which on the core's reference (pure PyTorch on
    that device), over all ``traces``; says so in words, e.g. "mps: ops on Metal kernels: ..."."""
    by_device: dict[str, dict[str, set[str]]] = {}
    for trace in filter(None, traces):
        for r in trace.rows():
            by_device.setdefault(r.device, {}).setdefault(r.kernel, set()).add(r.op)
    lines = []
    for dev, kinds in sorted(by_device.items()):
        native = NATIVE_NAME.get(dev, f"{dev} backend kernels")
        native_ops = ", ".join(sorted(kinds.pop(dispatch.NATIVE, ()))) or "none"
        reference_ops = ", ".join(sorted(kinds.pop(dispatch.REFERENCE, ()))) or "none"
        parts = [f"ops on {native}: {native_ops}", f"ops on the reference (pure PyTorch on {dev}): {reference_ops}"]
        parts += [f"{kind}: {', '.join(sorted(ops))}" for kind, ops in sorted(kinds.items())]
        lines.append(f"  {dev}: " + "; ".join(parts))
    return lines or ["  (no bitsandbytes op ran)"]


def plot_losses(losses: list[float], path: Path, title: str) -> str:
    """Draw the loss curve to ``path``; returns where it went, or why it was not drawn."""
    try:
        import matplotlib
    except ImportError:
        return "not drawn: matplotlib is not installed (nox -s demo installs it)"

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=120)
    ax.plot(range(1, len(losses) + 1), losses, linewidth=1.2)
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (log scale)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return str(path)
