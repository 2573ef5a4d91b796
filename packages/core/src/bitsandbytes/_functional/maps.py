"""Quantization maps (code tables): the value each 8-bit or 4-bit code stands for.

Same names, signatures, defaults and float32 values as upstream bitsandbytes 0.50, so that a map built
here indexes a checkpoint written there. The arithmetic deliberately follows upstream's order of
float32 operations (e.g. ``linspace`` in float32), because the maps must agree bit for bit.
"""

from __future__ import annotations

import itertools

import torch

from .. import _formats

__all__ = [
    "create_dynamic_map",
    "create_fp8_map",
    "create_linear_map",
    "create_normal_map",
    "get_4bit_type",
]

# Table sizes of the map builders: they always return 256 entries so that any 8-bit code indexes them.
_MAP_SIZE = 256


def _check_bool(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool; got {type(value).__name__}")


def _check_int(name: str, value: object, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int; got {type(value).__name__}")
    if not lo <= value <= hi:
        raise ValueError(f"{name} must be between {lo} and {hi}; got {value}")
    return value


def create_linear_map(signed=True, total_bits=8, add_zero=True):
    """Evenly spaced values over [-1, 1] (signed) or [0, 1], padded with zeros in the middle to 256.

    With ``add_zero`` (or fewer than 8 bits) a signed map has an odd number of points, so 0 is exact.
    """
    _check_bool("signed", signed)
    _check_int("total_bits", total_bits, 1, 8)
    _check_bool("add_zero", add_zero)
    n_values = 2**total_bits
    if (add_zero or total_bits < 8) and signed:
        n_values -= 1
    values = torch.linspace(-1.0 if signed else 0.0, 1.0, n_values)
    gap = _MAP_SIZE - values.numel()
    if gap == 0:
        return values
    half = values.numel() // 2
    return torch.cat([values[:half], torch.zeros(gap), values[half:]])


def _ndtri(q: torch.Tensor) -> torch.Tensor:
    # Inverse normal CDF evaluated in float64 and rounded once to float32, which is what upstream's
    # scipy.stats.norm.ppf on a float32 input amounts to.
    return torch.special.ndtri(q.double()).float()


def create_normal_map(offset=0.9677083, use_extra_value=True):
    """The NormalFloat map: normal quantiles, normalized to [-1, 1], zero-padded to 256 entries.

    ``offset`` is the outermost quantile used. With ``use_extra_value`` there are 8 positive and 7
    negative values (plus 0), as in NF4; otherwise 7 of each. The 16 non-padding entries of the
    default map are exactly the NF4 table.
    """
    if isinstance(offset, bool) or not isinstance(offset, (int, float)) or not 0.5 < offset < 1.0:
        raise ValueError(f"offset must be a probability in (0.5, 1); got {offset!r}")
    _check_bool("use_extra_value", use_extra_value)
    n_positive = 8 if use_extra_value else 7
    positive = _ndtri(torch.linspace(offset, 0.5, n_positive + 1)[:-1])
    negative = -_ndtri(torch.linspace(offset, 0.5, 8)[:-1])
    padding = torch.zeros(_MAP_SIZE - n_positive - 7)
    values = torch.cat([positive, padding, negative]).sort().values
    return values / values.max()


def create_fp8_map(signed=True, exponent_bits=5, precision_bits=2, total_bits=8):
    """A small-float map (sign, ``exponent_bits``, ``precision_bits``), sorted, normalized to max 1.

    Exponent field e > 0 gives ``(1 + mantissa) * 2**(bias + 1 - e)``, e == 0 gives the subnormal
    ``mantissa * 2**-bias``, with ``bias = 2**(exponent_bits - 1)`` (upstream's convention). Fewer
    than 8 bits are zero-padded to 256 entries.
    """
    _check_bool("signed", signed)
    _check_int("exponent_bits", exponent_bits, 0, 8)
    _check_int("precision_bits", precision_bits, 0, 8)
    _check_int("total_bits", total_bits, 1, 8)
    if exponent_bits + precision_bits != total_bits - int(signed):
        raise ValueError(
            f"exponent_bits + precision_bits must equal total_bits - {int(signed)} (the sign bit); got "
            f"{exponent_bits} + {precision_bits} with total_bits={total_bits}"
        )
    bias = 2 ** (exponent_bits - 1)
    values: list[float] = []
    for exponent in range(2**exponent_bits):
        for mantissa_bits in itertools.product((0, 1), repeat=precision_bits):
            fraction = sum(bit * 2.0 ** -(i + 1) for i, bit in enumerate(mantissa_bits))
            if exponent == 0:
                value = fraction * 2.0**-bias
            else:
                value = (1 + fraction) * 2.0 ** -(exponent - bias - 1)
            values.append(value)
            if signed:
                values.append(-value)
    values.sort()
    values += [0.0] * (_MAP_SIZE - len(values))
    values.sort()
    code = torch.tensor(values, dtype=torch.float32)
    return code / code.max()


def create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8):
    """The dynamic (dynamic-exponent) 8-bit map used by blockwise quantization and 8-bit optimizers.

    For each exponent 10**(-(max_exponent_bits - 1) + i) the fraction range [0.1, 1] is split
    linearly, the finer the larger the exponent; plus 0 and 1.0. The signed default has 256 sorted
    entries with no -1.0, 0 at index 127 and 1.0 at index 255. ``max_exponent_bits`` may exceed the
    non-sign bits, as in upstream's few-bit maps (``create_dynamic_map(True, bits, bits)``): exponents
    with fewer than one fraction step then contribute no values.
    """
    _check_bool("signed", signed)
    _check_int("total_bits", total_bits, 2, 8)
    non_sign_bits = total_bits - 1
    # No power of ten below 1e-64 survives float32 anyway; the bound keeps the loop finite.
    _check_int("max_exponent_bits", max_exponent_bits, 1, 64)
    data: list[float] = []

    def add_level(exponent: int, n_fractions: int) -> None:
        # Midpoints of n_fractions equal steps over [0.1, 1], computed in float32 as upstream does.
        edges = torch.linspace(0.1, 1, n_fractions + 1, dtype=torch.float32)
        means = (edges[:-1] + edges[1:]) / 2.0
        data.extend((10 ** (-(max_exponent_bits - 1) + exponent) * means).tolist())
        if signed:
            data.extend((-(10 ** (-(max_exponent_bits - 1) + exponent)) * means).tolist())

    def fractions(log2: int) -> int:
        # 2**log2 steps; a negative log2 is a fraction of a step, which upstream truncates to none.
        return 2**log2 if log2 >= 0 else 0

    for i in range(max_exponent_bits):
        add_level(i, fractions(i + non_sign_bits - max_exponent_bits + (0 if signed else 1)))
    # Codes whose exponent bits are all zero and have no indicator bit; they reuse the last level.
    extra = fractions(non_sign_bits - max_exponent_bits) - 1
    if extra > 0:
        add_level(max_exponent_bits - 1, extra)
    data += [0.0, 1.0]
    if len(data) != 2**total_bits:
        raise ValueError(
            f"signed={signed}, max_exponent_bits={max_exponent_bits} and total_bits={total_bits} give "
            f"{len(data)} values, not 2**total_bits={2**total_bits}"
        )
    data += [0.0] * (_MAP_SIZE - len(data))
    data.sort()
    return torch.tensor(data, dtype=torch.float32)


# Extra 4-bit tables upstream offers through get_4bit_type (not storage formats of the ops). Upstream
# fails on "int4" (an integer tensor cannot be divided in place); here it is a float table.
_INT4 = (7, 6, 5, 4, 3, 2, 1, 0, 0, -1, -2, -3, -4, -5, -6, -7)
# AbnormalFloat4 for blocksize 64 (arXiv:2306.06965), highest value first as upstream stores it.
_AF4_64 = (
    1.0, 0.72424863, 0.55496234, 0.42563882, 0.31675666, 0.21961274, 0.12934483, 0.04273164,
    0.0, -0.04934812, -0.14982478, -0.25607552, -0.3736951, -0.51243739, -0.69441008, -1.0,
)  # fmt: skip


def get_4bit_type(typename, device=None, blocksize=64):
    """The 16-entry float32 table of a 4-bit type, indexed by code, scaled to max |value| == 1.

    ``typename`` is "nf4" or "fp4" (the storage formats), or "int4" / "af4" (af4: blocksize 64 only).
    ``device=None`` means the default torch device (upstream defaults to "cuda").
    """
    if typename in _formats.QUANT_TYPES:
        return _formats.code_table(typename, device)
    if typename == "int4":
        data = _INT4
    elif typename == "af4":
        if blocksize != 64:
            raise ValueError(f"blocksize must be 64 for the af4 table; got {blocksize!r}")
        data = _AF4_64
    else:
        raise ValueError(f"typename must be one of 'nf4', 'fp4', 'int4', 'af4'; got {typename!r}")
    table = torch.tensor(data, dtype=torch.float32, device=device)
    return table / table.abs().max()
