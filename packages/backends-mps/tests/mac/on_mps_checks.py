"""What the Mac tests of the quantizers share: an input with NaN, inf, zeros and an all-zero block, and a
bit-exact comparison with the reference's result on cpu."""

from __future__ import annotations

import torch

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def special_input(dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    A = torch.randn(5, 1000, generator=g) * torch.logspace(-3, 2, 1000)
    A[0, 3], A[1, 700], A[2, 0] = float("nan"), float("inf"), 0.0
    A[3, :256] = 0  # an all-zero block
    return A.to(dtype)


def same(got: torch.Tensor, want: torch.Tensor) -> None:
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0, equal_nan=True)
