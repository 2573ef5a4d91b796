"""Which accelerators this torch build can use, and which extra of bitsandbytes brings their backend."""

from __future__ import annotations

import torch

from .platforms import EXTRA_PLATFORMS, current, describe, supports

# device type -> extra of the `bitsandbytes` distribution that installs its backend.
EXTRAS = {"cpu": "cpu", "cuda": "cuda", "mps": "mps"}


def _is_available(module_name: str) -> bool:
    module = getattr(torch, module_name, None) if module_name != "mps" else getattr(torch.backends, "mps", None)
    try:
        return bool(module is not None and module.is_available())
    except Exception:  # a half-installed driver must not break the import of bitsandbytes
        return False


def accelerators() -> list[str]:
    """Device types of the accelerators present (only ones torch can actually use)."""
    found = [name for name in ("cuda", "mps", "xpu") if _is_available(name)]
    # ROCm builds expose AMD GPUs as "cuda"; no backend of ours targets them yet (see install_hint).
    return found


def is_rocm() -> bool:
    return getattr(torch.version, "hip", None) is not None


def install_hint(device_type: str) -> str:
    """What to tell a user who has ``device_type`` but no backend for it."""
    if device_type == "cuda" and is_rocm():
        return "no ROCm backend is published yet; the reference kernels run on the GPU meanwhile"
    extra = EXTRAS.get(device_type)
    if extra is None:
        return f"no {device_type} backend is published yet; the reference kernels run on it meanwhile"
    if not supports(extra, *current()):
        dist = EXTRA_PLATFORMS[extra][0]
        return f"{dist} is not built for {describe(*current())}; the reference kernels run on {device_type} meanwhile"
    return f"pip install 'bitsandbytes[{extra}]'"
