"""Reference kernels for 8-bit blockwise quantization with a 256-entry code map.

Semantics (the contract every backend is checked against):

* The input is flattened in row-major order and cut into blocks of ``blocksize`` values; the last
  block may be shorter. ``absmax[b]`` is the largest ``|x|`` of block ``b`` in float32 (0 for an
  all-zero block, NaN if the block holds a NaN, inf if it holds an inf and no NaN).
* Each value is scaled to ``s = clamp(x * (1 / max(absmax, 1e-38)), -1, 1)`` in float32 (the final,
  partial block divides, ``x / max(absmax, 1e-38)``, exactly as upstream does; the two can differ in
  the last bit). The clamp to 1e-38 keeps an all-zero block at s == 0 instead of 0/0.
* Its 8-bit code is that of the nearest map entry, measured against the float32 midpoints
  ``(v[i] + v[i+1]) / 2`` of the map sorted by value: the code whose interval ``(m[i-1], m[i]]``
  contains ``s``. A value exactly on a midpoint takes the smaller neighbour, which for the sorted
  maps bitsandbytes builds (all of them) is the lower index; equal map values resolve to the lowest
  index. Maps need not be sorted: they are sorted here (stably) first.
* A NaN scales to NaN and takes the code of the largest map value; its block's absmax is NaN, so the
  whole block dequantizes to NaN: a visible failure, never a crash and never a silent finite value.
* Dequantization is ``code[q] * absmax[block]`` computed in float32, then cast to ``dtype``.
"""

from __future__ import annotations

import torch

from .. import _checks, _formats
from .._ops import check_dequantize_blockwise, check_quantize_blockwise
from ._registry import reference


def block_absmax_and_scale(A: torch.Tensor, blocksize: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-block float32 absmax of the flattened ``A``, and every value scaled into [-1, 1].

    Shared by the 8-bit and 4-bit references: both formats scale blocks the same way.
    """
    flat = A.reshape(-1).float()
    n = flat.numel()
    n_full = n - n % blocksize
    full = flat[:n_full].reshape(-1, blocksize)
    tail = flat[n_full:]
    absmax = full.abs().amax(dim=1)
    scaled = (full * (1.0 / absmax.clamp(min=_formats.MIN_SCALE)).unsqueeze(1)).reshape(-1)
    if tail.numel():
        tail_absmax = tail.abs().amax()
        absmax = torch.cat([absmax, tail_absmax.unsqueeze(0)])
        scaled = torch.cat([scaled, tail / tail_absmax.clamp(min=_formats.MIN_SCALE)])
    return absmax, scaled.clamp(-1.0, 1.0)


def nearest_code(scaled: torch.Tensor, code: torch.Tensor) -> torch.Tensor:
    """Index (int64) of the entry of ``code`` nearest to each value (rule in the module docstring)."""
    # A map of any shape is its flat entries: the op contracts count elements, and the kernels take pointers.
    code = code.reshape(-1)
    order = torch.argsort(code, stable=True)
    by_value = code[order]
    midpoints = (by_value[:-1] + by_value[1:]) / 2
    return order[torch.bucketize(scaled, midpoints)]


def expand_per_block(absmax: torch.Tensor, n: int, blocksize: int) -> torch.Tensor:
    """``absmax`` repeated so that element ``i`` of the result is the scale of flat position ``i``."""
    return absmax.repeat_interleave(blocksize)[:n]


@reference("quantize_blockwise")
def quantize_blockwise(A: torch.Tensor, code: torch.Tensor, blocksize: int) -> tuple[torch.Tensor, torch.Tensor]:
    check_quantize_blockwise(A, code, blocksize)
    absmax, scaled = block_absmax_and_scale(A, blocksize)
    q = nearest_code(scaled, code).to(torch.uint8)
    return q.reshape(A.shape), absmax


def _dequantize(A: torch.Tensor, absmax: torch.Tensor, code: torch.Tensor, blocksize: int, dtype: torch.dtype):
    flat = A.reshape(-1).long()
    values = code.reshape(-1)[flat] * expand_per_block(absmax, flat.numel(), blocksize)
    return values.to(dtype).reshape(A.shape)


@reference("dequantize_blockwise")
def dequantize_blockwise(
    A: torch.Tensor, absmax: torch.Tensor, code: torch.Tensor, blocksize: int, dtype: torch.dtype
) -> torch.Tensor:
    check_dequantize_blockwise(A, absmax, code, blocksize, dtype)
    return _dequantize(A, absmax, code, blocksize, dtype)


@reference("dequantize_blockwise.out")
def dequantize_blockwise_out(
    A: torch.Tensor, absmax: torch.Tensor, code: torch.Tensor, blocksize: int, dtype: torch.dtype, out: torch.Tensor
) -> None:
    check_dequantize_blockwise(A, absmax, code, blocksize, dtype)
    _checks.out_tensor(out, A.shape, dtype, A.device, reads={"A": A, "absmax": absmax, "code": code})
    out.copy_(_dequantize(A, absmax, code, blocksize, dtype))
