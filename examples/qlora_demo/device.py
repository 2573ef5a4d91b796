"""Where the demo runs: ``--device cpu|mps|cuda|auto``, the transformers ``device_map`` that puts the 4-bit
model there, and the dtype checks each device needs.

Why the demo never leaves ``device_map`` unset: transformers' bitsandbytes 4-bit quantizer fills an unset
map with the first of CUDA, NPU, HPU, XPU it finds, else ``{"": "cpu"}`` (``Bnb4BitHfQuantizer.
update_device_map``), so on a Mac a 4-bit model lands on the CPU. Naming the device puts every module
there, and the quantization at load time then runs on that device's kernels.
"""

from __future__ import annotations

import platform

import torch

DEVICES = ("cpu", "mps", "cuda", "auto")


def resolve(name: str) -> str:
    """The device ``--device name`` means: ``auto`` is CUDA when torch sees a GPU, else Apple's MPS when
    available, else the CPU. A named accelerator that is not there is an error, not a silent CPU run."""
    if name not in DEVICES:
        raise ValueError(f"--device must be one of {', '.join(DEVICES)}; got {name!r}")
    if name == "auto":
        if torch.cuda.is_available():
            return "cuda"
        return "mps" if torch.backends.mps.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: torch.cuda.is_available() is false (no NVIDIA GPU, or a CPU-only torch)")
    if name == "mps" and not torch.backends.mps.is_available():
        why = (
            "this torch build has no MPS support"
            if not torch.backends.mps.is_built()
            else "no Apple Silicon GPU (MPS needs an Apple Silicon Mac and macOS 12.3 or later)"
        )
        raise ValueError(f"--device mps: torch.backends.mps.is_available() is false: {why}")
    return name


def device_map(device: str) -> dict[str, str]:
    """The ``device_map`` for ``from_pretrained``: the whole model (key ``""``) on ``device``."""
    return {"": device}


def check_dtype(device: str, dtype: torch.dtype) -> None:
    """bfloat16 compute needs macOS 14 on MPS (Metal 3.1) and an Ampere-or-later GPU on CUDA."""
    if dtype != torch.bfloat16:
        return
    if device == "mps" and not torch.backends.mps.is_macos_or_newer(14, 0):
        raise ValueError(f"--compute-dtype bfloat16 on mps needs macOS 14 or later (this is {describe('mps')})")
    if device == "cuda" and not torch.cuda.is_bf16_supported():
        raise ValueError(f"--compute-dtype bfloat16: {torch.cuda.get_device_name()} does not support bfloat16")


def describe(device: str) -> str:
    """One line naming the hardware behind ``device``."""
    if device == "cuda":
        return torch.cuda.get_device_name()
    if device == "mps":
        return f"Apple GPU, macOS {platform.mac_ver()[0] or '?'}"
    return f"{platform.machine() or 'CPU'}, {torch.get_num_threads()} threads"


def synchronize(device: str) -> None:
    """Wait for the work queued on ``device``, so a timer stops when the work is done, not when it is queued."""
    if device == "cuda":
        torch.cuda.synchronize()
    elif device == "mps":
        torch.mps.synchronize()
