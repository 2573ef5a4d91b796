"""The synthetic task: continue an arithmetic sequence modulo a small number.

Token ``i`` (0 <= i < MODULUS) stands for the number i; one more token marks the start. A sample is
``<s> a, a+k, a+2k, ...`` (mod MODULUS) with a stride k drawn from STRIDES, so the model must read the
stride off the numbers it has seen: the next number is the last one plus the last difference. A randomly
initialised model cannot do that; LoRA adapters on the frozen 4-bit model learn it in about a hundred
steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MODULUS = 64
STRIDES = (1, 2, 3, 5)
BOS = MODULUS
VOCAB = MODULUS + 2  # numbers, <s>, and an end/pad token that the task never uses
PAD = MODULUS + 1


@dataclass
class Task:
    length: int = 16  # numbers per training sample
    prompt_numbers: int = 3  # numbers shown before the model continues: two differences fix the stride

    def sample(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """``n`` sequences ``<s> a a+k ...``, shape (n, 1 + length)."""
        start = torch.randint(0, MODULUS, (n, 1), generator=generator)
        stride = torch.tensor(STRIDES)[torch.randint(0, len(STRIDES), (n, 1), generator=generator)]
        numbers = (start + stride * torch.arange(self.length)) % MODULUS
        return torch.cat([torch.full((n, 1), BOS), numbers], dim=1)

    def labels(self, batch: torch.Tensor) -> torch.Tensor:
        """Loss only where the stride is determined: after <s> and the first two numbers."""
        labels = batch.clone()
        labels[:, :3] = -100
        return labels

    def split(self, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(prompt, expected continuation) of each sequence."""
        cut = 1 + self.prompt_numbers
        return batch[:, :cut], batch[:, cut:]


def show(tokens: torch.Tensor) -> str:
    """Token ids as text: numbers, and <s> for the start token."""
    return " ".join("<s>" if t == BOS else "<pad>" if t == PAD else str(int(t)) for t in tokens)
