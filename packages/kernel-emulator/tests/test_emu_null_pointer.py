"""``None`` is a null pointer in the kernel; an empty tensor is a real (zero-byte, guarded) buffer."""

from __future__ import annotations

import pytest
import torch

import bitsandbytes_emu as emu

CODE = """
__global__ void is_null(const float* p, int* out) { out[0] = p == nullptr; }
__global__ void read_first(const float* p, float* out) { out[0] = p[0]; }
"""


def test_none_is_a_null_pointer_and_empty_tensor_is_not(compile_cuda):
    mod = compile_cuda(CODE, ["is_null", "read_first"], name="null.cu")
    out = torch.full((1,), -1, dtype=torch.int32)
    mod.is_null[1, 1](None, out)
    assert out.item() == 1
    mod.is_null[1, 1](torch.empty(0), out)
    assert out.item() == 0
    with pytest.raises(emu.EmulationError, match="out-of-bounds read"):
        mod.read_first[1, 1](torch.empty(0), torch.zeros(1))
