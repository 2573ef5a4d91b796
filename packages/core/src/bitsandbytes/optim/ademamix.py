"""AdEMAMix (Adam with a second, slow EMA of the gradient mixed in by ``alpha``), 32-bit or 8-bit blockwise state.

Both EMAs live stacked in ``state1`` (``[2, *p.shape]``). ``t_alpha`` / ``t_beta3`` warm ``alpha`` and ``beta3``
up over that many steps, with the schedules of the AdEMAMix paper (as upstream).
"""

from __future__ import annotations

import math
from typing import Any

from . import _args
from .optimizer import Optimizer2State

__all__ = ["AdEMAMix", "AdEMAMix8bit", "AdEMAMix32bit", "PagedAdEMAMix", "PagedAdEMAMix8bit", "PagedAdEMAMix32bit"]


def _warmup(name: str, t: Any) -> None:
    if t is not None and (isinstance(t, bool) or not isinstance(t, int) or t <= 0):
        raise ValueError(f"{name} must be None or an int > 0, got {t!r}")


class AdEMAMix(Optimizer2State):
    """AdEMAMix; ``optim_bits`` (32 or 8) picks the state precision, ``is_paged`` paged state."""

    def __init__(
        self, params, lr: float = 1e-3, betas: tuple[float, float, float] = (0.9, 0.999, 0.9999),
        alpha: float = 5.0, t_alpha: int | None = None, t_beta3: int | None = None, eps: float = 1e-8,
        weight_decay: float = 1e-2, optim_bits: int = 32, min_8bit_size: int = 4096, is_paged: bool = False,
    ):  # fmt: skip
        betas = _args.parse_betas(betas, 3)
        _warmup("t_alpha", t_alpha)
        _warmup("t_beta3", t_beta3)
        super().__init__(
            "ademamix", params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, optim_bits=optim_bits,
            args=None, min_8bit_size=min_8bit_size, is_paged=is_paged, alpha=alpha, t_alpha=t_alpha, t_beta3=t_beta3,
        )  # fmt: skip

    def _state1_stack(self) -> int:
        return 2

    def _schedule(self, config: dict[str, Any], step: int) -> tuple[float, float]:
        beta1, _, beta3 = config["betas"]
        alpha, t_alpha, t_beta3 = config["alpha"], config["t_alpha"], config["t_beta3"]
        if t_alpha:
            alpha = min(step * alpha / t_alpha, alpha)
        if t_beta3:
            # Interpolates the EMA half-life between beta1's and beta3's, reaching beta3 at step t_beta3.
            ln1, ln3 = math.log(beta1), math.log(beta3)
            s = step / t_beta3
            beta3 = min(math.exp(ln1 * ln3 / ((1 - s) * ln3 + s * ln1)), beta3)
        return beta3, alpha


class AdEMAMix8bit(AdEMAMix):
    """AdEMAMix with 8-bit blockwise state."""

    def __init__(
        self, params, lr: float = 1e-3, betas: tuple[float, float, float] = (0.9, 0.999, 0.9999),
        alpha: float = 5.0, t_alpha: int | None = None, t_beta3: int | None = None, eps: float = 1e-8,
        weight_decay: float = 1e-2, min_8bit_size: int = 4096, is_paged: bool = False,
    ):  # fmt: skip
        super().__init__(
            params, lr=lr, betas=betas, alpha=alpha, t_alpha=t_alpha, t_beta3=t_beta3, eps=eps,
            weight_decay=weight_decay, optim_bits=8, min_8bit_size=min_8bit_size, is_paged=is_paged,
        )  # fmt: skip


class AdEMAMix32bit(AdEMAMix):
    """AdEMAMix with 32-bit state."""

    def __init__(
        self, params, lr: float = 1e-3, betas: tuple[float, float, float] = (0.9, 0.999, 0.9999),
        alpha: float = 5.0, t_alpha: int | None = None, t_beta3: int | None = None, eps: float = 1e-8,
        weight_decay: float = 1e-2, min_8bit_size: int = 4096, is_paged: bool = False,
    ):  # fmt: skip
        super().__init__(
            params, lr=lr, betas=betas, alpha=alpha, t_alpha=t_alpha, t_beta3=t_beta3, eps=eps,
            weight_decay=weight_decay, optim_bits=32, min_8bit_size=min_8bit_size, is_paged=is_paged,
        )  # fmt: skip


class PagedAdEMAMix(AdEMAMix):
    """AdEMAMix with paged state (``optim_bits`` 32 or 8)."""

    def __init__(
        self, params, lr: float = 1e-3, betas: tuple[float, float, float] = (0.9, 0.999, 0.9999),
        alpha: float = 5.0, t_alpha: int | None = None, t_beta3: int | None = None, eps: float = 1e-8,
        weight_decay: float = 1e-2, optim_bits: int = 32, min_8bit_size: int = 4096,
    ):  # fmt: skip
        super().__init__(
            params, lr=lr, betas=betas, alpha=alpha, t_alpha=t_alpha, t_beta3=t_beta3, eps=eps,
            weight_decay=weight_decay, optim_bits=optim_bits, min_8bit_size=min_8bit_size, is_paged=True,
        )  # fmt: skip


class PagedAdEMAMix8bit(AdEMAMix8bit):
    """AdEMAMix with paged 8-bit blockwise state."""

    def __init__(
        self, params, lr: float = 1e-3, betas: tuple[float, float, float] = (0.9, 0.999, 0.9999),
        alpha: float = 5.0, t_alpha: int | None = None, t_beta3: int | None = None, eps: float = 1e-8,
        weight_decay: float = 1e-2, min_8bit_size: int = 4096,
    ):  # fmt: skip
        super().__init__(
            params, lr=lr, betas=betas, alpha=alpha, t_alpha=t_alpha, t_beta3=t_beta3, eps=eps,
            weight_decay=weight_decay, min_8bit_size=min_8bit_size, is_paged=True,
        )  # fmt: skip


class PagedAdEMAMix32bit(AdEMAMix32bit):
    """AdEMAMix with paged 32-bit state."""

    def __init__(
        self, params, lr: float = 1e-3, betas: tuple[float, float, float] = (0.9, 0.999, 0.9999),
        alpha: float = 5.0, t_alpha: int | None = None, t_beta3: int | None = None, eps: float = 1e-8,
        weight_decay: float = 1e-2, min_8bit_size: int = 4096,
    ):  # fmt: skip
        super().__init__(
            params, lr=lr, betas=betas, alpha=alpha, t_alpha=t_alpha, t_beta3=t_beta3, eps=eps,
            weight_decay=weight_decay, min_8bit_size=min_8bit_size, is_paged=True,
        )  # fmt: skip
