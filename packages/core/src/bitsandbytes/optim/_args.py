"""Checks of optimizer hyperparameters, shared by the constructors and ``GlobalOptimManager`` overrides.

Upstream raised ``ValueError("Invalid ...")`` for some of these and let the rest fail later inside a kernel;
here every one is checked up front and the message names the argument and what it accepts.
"""

from __future__ import annotations

import math
from typing import Any

OPTIM_BITS = (8, 32)


def number(name: str, x: Any) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(x).__name__}")
    if not math.isfinite(x):
        raise ValueError(f"{name} must be finite, got {x}")
    return x


def non_negative(name: str, x: Any) -> float:
    if number(name, x) < 0:
        raise ValueError(f"{name} must be >= 0, got {x}")
    return x


def optim_bits(x: Any, name: str = "optim_bits") -> int:
    if isinstance(x, bool) or not isinstance(x, int):
        raise TypeError(f"{name} must be 8 or 32, got {type(x).__name__} {x!r}")
    if x not in OPTIM_BITS:
        raise ValueError(f"{name} must be 8 or 32, got {x}")
    return x


def parse_betas(betas: Any, count: int | None = None, name: str = "betas") -> tuple[float, ...]:
    """``betas`` as a tuple of floats in [0, 1); a string "(b1, b2)" is accepted as upstream does."""
    if isinstance(betas, str):
        try:
            betas = tuple(float(b) for b in betas.strip().strip("()").split(","))
        except ValueError:
            raise ValueError(f"{name} must look like '(0.9, 0.999)', got {betas!r}") from None
    if not isinstance(betas, (tuple, list)):
        raise TypeError(f"{name} must be a tuple of floats, got {type(betas).__name__}")
    if count is not None and len(betas) != count:
        raise ValueError(f"{name} must have {count} values, got {len(betas)}")
    for i, b in enumerate(betas):
        number(f"{name}[{i}]", b)
        if not 0.0 <= b < 1.0:
            raise ValueError(f"{name}[{i}] must be in [0, 1), got {b}")
    return tuple(betas)


def min_8bit_size(x: Any) -> int:
    if isinstance(x, bool) or not isinstance(x, int) or x < 0:
        raise ValueError(f"min_8bit_size must be an int >= 0, got {x!r}")
    return x


def percentile_clipping(x: Any) -> int:
    # 100 disables clipping; below that it is the percentile of the gradient-norm history to clip to.
    if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x <= 100:
        raise ValueError(f"percentile_clipping must be an int in [0, 100] (100: off), got {x!r}")
    return x


def hyperparameters(lr: Any, eps: Any, weight_decay: Any, betas: Any, betas_count: int | None = None) -> tuple:
    """The common constructor arguments, checked; returns them with ``betas`` parsed."""
    non_negative("lr", lr)
    non_negative("eps", eps)
    non_negative("weight_decay", weight_decay)
    return lr, eps, weight_decay, parse_betas(betas, betas_count)


_OVERRIDE_CHECKS = {
    "optim_bits": optim_bits,
    "lr": lambda v: non_negative("lr", v),
    "eps": lambda v: non_negative("eps", v),
    "weight_decay": lambda v: non_negative("weight_decay", v),
    "betas": parse_betas,
    "alpha": lambda v: number("alpha", v),
    "min_8bit_size": min_8bit_size,
    "max_unorm": lambda v: non_negative("max_unorm", v),
    "percentile_clipping": percentile_clipping,
}


def check_override(key: Any, value: Any) -> None:
    """Check one override value; keys this package does not read are accepted (upstream stores any)."""
    if not isinstance(key, str):
        raise TypeError(f"override keys must be str, got {type(key).__name__}")
    check = _OVERRIDE_CHECKS.get(key)
    if check is not None:
        try:
            check(value)
        except (TypeError, ValueError) as e:
            raise type(e)(f"override {key!r}: {e}") from None


def no_amsgrad(cls: type, amsgrad: Any) -> None:
    # Upstream's 32-bit classes ignored amsgrad=True silently; no class here implements it, so all refuse it.
    if amsgrad:
        raise ValueError(f"{cls.__name__} does not support amsgrad=True")


def fixed_bits(cls: type, optim_bits: Any, expected: int = 32) -> None:
    # Fixed-precision classes take optim_bits only for signature compatibility with upstream.
    if optim_bits != expected:
        raise ValueError(
            f"{cls.__name__} only supports optim_bits={expected} (the default, kept for compatibility), "
            f"got {optim_bits!r}"
        )
