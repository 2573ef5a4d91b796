"""A pytest plugin that makes the ``cpu`` device run the 4-bit ops through emulated Metal kernels.

What "device = emulated mps" looks like for the conformance suite: kernels/metal_fourbit.metal is compiled
in emulation and registered as the ``cpu`` kernel of ``quantize_4bit`` and ``dequantize_4bit``, called the
way an MPS backend calls ``torch.mps.compile_shader`` kernels, so ``--device cpu`` tests those kernels:

    BNB_BACKENDS=none PYTHONPATH=packages/kernel-emulator/tests \\
        python -m bitsandbytes.testing --device cpu -p emulated_mps_backend -k "fourbit and not gemv and not gemm"
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod
from pathlib import Path

import torch

from bitsandbytes import _formats, _ops
from bitsandbytes_emu.metal import metal_library

KERNEL_SOURCE = Path(__file__).parent / "kernels" / "metal_fourbit.metal"
SUFFIX = {torch.float32: "float", torch.float16: "half", torch.bfloat16: "bfloat"}
calls = 0


def _table(quant_type: str):
    """The code table, its midpoints sorted by value, and the code of each sorted entry (the reference's
    nearest-code rule)."""
    table = _formats.code_table(quant_type).float()
    order = torch.argsort(table, stable=True)
    by_value = table[order]
    return table.contiguous(), ((by_value[:-1] + by_value[1:]) / 2).contiguous(), order.to(torch.uint8)


def quantize_4bit(A: torch.Tensor, blocksize: int, quant_type: str, quant_storage: torch.dtype):
    global calls
    _ops.check_quantize_4bit(A, blocksize, quant_type, quant_storage)
    n = A.numel()
    blocks = -(-n // blocksize)
    packed = torch.zeros(_formats.packed_4bit_numel_bytes(n), dtype=torch.uint8)
    absmax = torch.zeros(blocks, dtype=torch.float32)
    if n:
        _, midpoints, order = _table(quant_type)
        group = min(256, blocksize // 2)
        kernel = getattr(metal_library(KERNEL_SOURCE), f"quantize_4bit_{SUFFIX[A.dtype]}")
        kernel(A.contiguous().reshape(-1), midpoints, order, packed, absmax, n, blocksize,
               threads=blocks * group, group_size=group)  # fmt: skip
        calls += 1
    return packed.view(quant_storage).reshape(_formats.packed_4bit_shape(n, quant_storage)), absmax


def dequantize_4bit(
    A: torch.Tensor, absmax: torch.Tensor, blocksize: int, quant_type: str, shape: Sequence[int], dtype: torch.dtype
) -> torch.Tensor:
    global calls
    dims = _ops.check_dequantize_4bit(A, absmax, blocksize, quant_type, shape, dtype)
    n = prod(dims)
    out = torch.empty(n, dtype=dtype)
    if n:
        table, _, _ = _table(quant_type)
        kernel = getattr(metal_library(KERNEL_SOURCE), f"dequantize_4bit_{SUFFIX[dtype]}")
        kernel(A.contiguous().view(torch.uint8).reshape(-1), table, absmax.contiguous(), out, blocksize,
               threads=n, group_size=min(n, 256))  # fmt: skip
        calls += 1
    return out.reshape(dims)


def pytest_configure(config) -> None:
    from bitsandbytes_emu.build import unavailable_reason

    reason = unavailable_reason()
    if reason:
        raise RuntimeError(reason)
    torch.library.register_kernel("bitsandbytes::quantize_4bit", "cpu")(quantize_4bit)
    torch.library.register_kernel("bitsandbytes::dequantize_4bit", "cpu")(dequantize_4bit)


def pytest_terminal_summary(terminalreporter) -> None:
    terminalreporter.write_line(f"emulated Metal kernel calls: {calls}")
