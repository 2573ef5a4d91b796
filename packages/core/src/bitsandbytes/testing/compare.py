"""Comparisons that say where two tensors differ: the first mismatching index, both values, and how many.

``assert_equal`` compares bytes (so NaN equals NaN and -0.0 differs from 0.0): for results whose bytes
the format defines. ``assert_close`` allows a stated tolerance: for results whose float rounding
depends on summation order. Both move tensors to the CPU first, so they accept any device.
"""

from __future__ import annotations

import torch

_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _cpu(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu").contiguous()


def _first(mask: torch.Tensor, actual: torch.Tensor, expected: torch.Tensor, what: str, extra: str = "") -> str:
    bad = mask.nonzero()
    idx = tuple(int(i) for i in bad[0])
    count = bad.shape[0]
    return (
        f"{what}: {count} of {mask.numel()} elements differ{extra}; first at index {idx}: "
        f"got {actual[idx].item()!r}, expected {expected[idx].item()!r}"
    )


def _same_meta(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    if actual.dtype != expected.dtype:
        raise AssertionError(f"{what}: dtype {actual.dtype}, expected {expected.dtype}")
    if tuple(actual.shape) != tuple(expected.shape):
        raise AssertionError(f"{what}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}")


def assert_equal(actual: torch.Tensor | None, expected: torch.Tensor | None, what: str) -> None:
    """Same dtype, shape and bytes."""
    if actual is None or expected is None:
        if actual is not expected:
            raise AssertionError(f"{what}: got {actual!r}, expected {expected!r}")
        return
    _same_meta(actual, expected, what)
    a, e = _cpu(actual), _cpu(expected)
    if a.numel() == 0:
        return
    if a.dtype.is_floating_point:
        view = _INT_VIEW[a.element_size()]
        mask = a.view(view) != e.view(view)
    else:
        mask = a != e
    if mask.any():
        raise AssertionError(_first(mask, a, e, what, " (bit-exact comparison)"))


def assert_equal_up_to_nan_payload(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    """``assert_equal``, except that a NaN meets any NaN: the payload of a NaN is not part of any format
    (a GPU converts NaN to fp16 as 0x7fff, torch on a CPU as 0x7e00)."""
    _same_meta(actual, expected, what)
    a, e = _cpu(actual), _cpu(expected)
    if a.dtype.is_floating_point:
        both = a.isnan() & e.isnan()
        a, e = a.masked_fill(both, 0), e.masked_fill(both, 0)
    assert_equal(a, e, what)


def assert_close(
    actual: torch.Tensor, expected: torch.Tensor, what: str, *, rtol: float, atol: float, check_dtype: bool = True
) -> None:
    """|actual - expected| <= atol + rtol * |expected| elementwise (in float64); NaN must meet NaN and
    an infinity the same infinity."""
    if check_dtype:
        _same_meta(actual, expected, what)
    elif tuple(actual.shape) != tuple(expected.shape):
        raise AssertionError(f"{what}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}")
    a, e = _cpu(actual).double(), _cpu(expected).double()
    if a.numel() == 0:
        return
    nan_a, nan_e = a.isnan(), e.isnan()
    inf_mismatch = (a.isinf() | e.isinf()) & (a != e)
    finite = ~(nan_a | nan_e | a.isinf() | e.isinf())
    tol_bad = finite & ((a - e).abs() > atol + rtol * e.abs())
    mask = (nan_a != nan_e) | inf_mismatch | tol_bad
    if mask.any():
        worst = ((a - e).abs() - rtol * e.abs())[finite].max().item() if finite.any() else float("nan")
        raise AssertionError(_first(mask, a, e, what, f" (rtol={rtol}, atol={atol}; worst excess {worst:.3g})"))


def assert_codes_near(
    actual: torch.Tensor, expected: torch.Tensor, what: str, *, max_step: int, max_fraction: float
) -> None:
    """Integer codes equal except for at most ``max_fraction`` of them, each off by at most ``max_step``."""
    _same_meta(actual, expected, what)
    a, e = _cpu(actual).long(), _cpu(expected).long()
    if a.numel() == 0:
        return
    diff = (a - e).abs()
    far = diff > max_step
    if far.any():
        raise AssertionError(_first(far, a, e, what, f" by more than {max_step} code(s)"))
    n_diff = int((diff > 0).sum())
    allowed = max_fraction * a.numel()
    if n_diff > allowed:
        raise AssertionError(
            _first(diff > 0, a, e, what, f" (more than the {max_fraction:.2%} allowed to land on a neighbour code)")
        )


def assert_all(mask: torch.Tensor, what: str, values: torch.Tensor | None = None) -> None:
    """Every element of a boolean ``mask`` is True; otherwise name the first False one."""
    m = _cpu(mask)
    if m.numel() == 0 or bool(m.all()):
        return
    bad = (~m).nonzero()
    idx = tuple(int(i) for i in bad[0])
    shown = f": value {_cpu(values)[idx].item()!r}" if values is not None else ""
    raise AssertionError(f"{what}: {bad.shape[0]} of {m.numel()} elements fail; first at index {idx}{shown}")


def matmul_tolerance(A: torch.Tensor, W: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """The allowed |difference| per element of ``A @ W.T`` (the 4-bit matmuls) from ``ref``.

    A kernel may sum the K products in any order, in fp32, and may multiply by the fp32 weight instead
    of the weight rounded to A's dtype. With ``S = |A| @ |W|.T`` (the sum of the magnitudes of the
    products) the bound is ``eps(dtype) * (|ref| + 2 S) + 2 sqrt(K) eps(fp32) S``: the final rounding
    to A's dtype, the rounding of the weight to A's dtype, and fp32 accumulation in another order.
    """
    S = A.double().abs() @ W.double().abs().T
    K = A.shape[-1]
    eps = torch.finfo(A.dtype).eps
    return eps * (ref.double().abs() + 2 * S) + 2 * K**0.5 * torch.finfo(torch.float32).eps * S
