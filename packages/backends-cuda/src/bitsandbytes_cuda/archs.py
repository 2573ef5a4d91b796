"""Which CUDA devices the kernel library can serve, from its list of architectures (no CUDA context made).

The library reports what it holds (``bnb_cuda_archs()``: ``"sm_75 sm_80 ... compute_75 compute_120 (PTX)"``).
NVIDIA's binary compatibility rules decide a device of compute capability X.Y from that alone: SASS for
``sm_XZ`` runs on X.Y when Z <= Y (same major; an ``a`` variant only on X.Z itself), PTX for
``compute_AB`` is compiled by the driver for any X.Y >= A.B (an ``a`` variant only for A.B itself).

Deciding from the list, rather than probing each device with the library (``bnb_cuda_check_device``, which
``launch.check_device`` still runs at a device's first launch), keeps loading from creating a CUDA context
on every visible GPU: each process of a multi-GPU job would otherwise hold one on all of them.
"""

from __future__ import annotations

import re

__all__ = ["covers", "parse", "unsupported_message"]

_ARCH = re.compile(r"^(sm|compute)_(\d+)([af]?)$")


def parse(archs: str) -> tuple[list[tuple[int, int, str]], list[tuple[int, int, str]]]:
    """``bnb_cuda_archs()`` text -> (SASS, PTX) as lists of (major, minor, suffix)."""
    sass, ptx = [], []
    for word in archs.split():
        m = _ARCH.match(word)
        if m:
            number = int(m.group(2))
            (sass if m.group(1) == "sm" else ptx).append((number // 10, number % 10, m.group(3)))
    return sass, ptx


def covers(archs: str, major: int, minor: int) -> bool:
    """Whether a library holding ``archs`` has code a device of compute capability major.minor can run."""
    sass, ptx = parse(archs)
    for a_major, a_minor, suffix in sass:
        if a_major == major and (a_minor == minor if suffix == "a" else a_minor <= minor):
            return True
    for a_major, a_minor, suffix in ptx:
        if suffix == "a":
            if (a_major, a_minor) == (major, minor):
                return True
        elif suffix == "f":
            if a_major == major and a_minor <= minor:
                return True
        elif (a_major, a_minor) <= (major, minor):
            return True
    return False


def unsupported_message(index: int, name: str, major: int, minor: int, archs: str) -> str:
    """The warning for a device the library holds no code for: the device, its arch, what would serve it."""
    arch = f"{major}{minor}"
    how = f"build bitsandbytes-cuda from source for it with BNB_CUDA_ARCHS={arch}"
    if major < 7 or (major, minor) < (7, 5):
        # CUDA 13 no longer compiles for Maxwell, Pascal and Volta (sm_50 to sm_72).
        how += " and a CUDA 12.x toolkit (CUDA 13 dropped sm_50 to sm_72)"
    else:
        how += " and a CUDA toolkit that knows sm_" + arch
    return (
        f"bitsandbytes-cuda has no code for CUDA device {index} ({name}, sm_{arch}): the library holds {archs}. "
        f"Its bitsandbytes ops on that device run on the reference kernels (pure torch, slower); for native "
        f"kernels, {how} (see the CUDA backend's documentation)."
    )
