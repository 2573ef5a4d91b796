"""A pytest plugin that makes the ``cpu`` device run one op through an emulated CUDA kernel.

It is what "device = emulated cuda" looks like for the conformance suite: the kernel source is compiled
in emulation and registered as the op's ``cpu`` kernel, so ``--device cpu`` now tests that kernel:

    BNB_BACKENDS=none PYTHONPATH=packages/kernel-emulator/tests \\
        python -m bitsandbytes.testing --device cpu -p emulated_cuda_backend -k vectorwise_dequant

A CUDA backend ships the same kind of module for its own kernels (one ``register`` per op).
"""

from __future__ import annotations

from pathlib import Path

import torch

import bitsandbytes_emu as emu
from bitsandbytes import _ops

KERNELS = Path(__file__).parent / "kernels"
calls = 0


def _int8_vectorwise_dequant(A: torch.Tensor, stats: torch.Tensor) -> torch.Tensor:
    global calls
    _ops.check_int8_vectorwise_dequant(A, stats)  # the same argument errors as on every device
    mod = emu.load_cuda(KERNELS / "int8_dequant.cu", ["int8_vectorwise_dequant"])
    cols = A.shape[-1] if A.dim() else 1
    rows = A.numel() // cols if cols else 0
    out = torch.empty(A.shape, dtype=torch.float32)
    if A.numel():
        mod.int8_vectorwise_dequant[(A.numel() + 255) // 256, 256](
            A.contiguous(), stats.float().contiguous(), out, rows, cols
        )
    calls += 1
    return out


def pytest_configure(config) -> None:
    reason = emu.unavailable_reason()
    if reason:
        raise RuntimeError(reason)
    torch.library.register_kernel("bitsandbytes::int8_vectorwise_dequant", "cpu")(_int8_vectorwise_dequant)


def pytest_terminal_summary(terminalreporter) -> None:
    terminalreporter.write_line(f"emulated CUDA kernel calls: {calls}")
