"""Context managers the native-kernel tests share: run at one ISA level, or with n torch threads."""

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
