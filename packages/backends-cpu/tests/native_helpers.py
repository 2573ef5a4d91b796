"""Context managers the native-kernel tests share: run at one ISA level, with n torch threads, with one way
of reading 8-bit code tables, or with torch's oneDNN switched off."""

from __future__ import annotations

import contextlib

import torch

from bitsandbytes_cpu import _C


@contextlib.contextmanager
def isa(name: str):
    before = _C.isa()
    _C.set_isa(name)
    try:
        yield
    finally:
        _C.set_isa(before)


@contextlib.contextmanager
def num_threads(n: int):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextlib.contextmanager
def onednn_off():
    """torch.backends.mkldnn.enabled = False for the block, as a user sets it (torch's own flags() context
    also sets oneDNN's TF32 switch, which warns on a build without Intel GPU support)."""
    before = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = False
    try:
        yield
    finally:
        torch.backends.mkldnn.enabled = before


@contextlib.contextmanager
def map_lookup(name: str):
    """AVX-512 kernels read 8-bit code tables (optimizer maps, double quantization's scale codes) by a gather
    or from registers, by CPU vendor ("auto"); each way must give the same bytes."""
    _C.set_map_lookup(name)
    try:
        yield
    finally:
        _C.set_map_lookup("auto")


# Every ISA level, and at avx512 both ways of reading code tables (the other levels have one).
LEVEL_LOOKUPS = [
    (level, lookup)
    for level in _C.supported_isas()
    for lookup in (("gather", "registers") if level == "avx512" else ("auto",))
]
