"""The emulator's C++ sources ship inside the core package (package data), where the loader finds them."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

import bitsandbytes_emu as emu


def test_headers_and_runtime_ship_with_the_package():
    root = files("bitsandbytes_emu")
    for name in ["include/bnb_emu/runtime.h", "include/bnb_emu/cuda.h", "src/runtime.cpp"]:
        assert root.joinpath(name).is_file(), name
    for header in ["cuda_runtime.h", "cuda_fp16.h", "cuda_bf16.h", "mma.h", "cub/cub.cuh"]:
        assert root.joinpath("include/bnb_emu/cuda_headers", header).is_file(), header
    assert Path(emu.include_dir(), "bnb_emu", "runtime.h").is_file()
