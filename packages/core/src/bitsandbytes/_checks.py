"""Argument checks shared by the fake kernels, the reference kernels and every backend.

Each op's contract is enforced in one place so that a wrong call fails the same way on every device
and under torch.compile: ``TypeError`` for a wrong dtype or type, ``ValueError`` for a wrong value,
shape, length or device, always naming the argument and what was expected. The checks only read
metadata (never tensor values), so they cost no device synchronisation; the one exception is
``index_values``, for index tensors, whose values decide which memory is read.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# Block sizes that every backend must accept (upstream 0.50 accepts these on its CUDA backend). The
# 8-bit blockwise ops take any positive block size (upstream's CPU path does, its tests use 16384); a
# backend whose kernels cover only these hands the others to the reference kernel.
BLOCKSIZES = (32, 64, 128, 256, 512, 1024, 2048, 4096)
QUANT_TYPES = ("nf4", "fp4")
# Storage dtypes a packed 4-bit tensor may be viewed as (upstream: any dtype the FSDP shards use).
QUANT_STORAGE_DTYPES = (torch.uint8, torch.int8, torch.float16, torch.bfloat16, torch.float32)
OPTIMIZER_NAMES = ("adam", "momentum", "rmsprop", "lion", "adagrad", "ademamix", "lamb", "lars")


def _names(dtypes: Iterable[torch.dtype]) -> str:
    return ", ".join(str(d).removeprefix("torch.") for d in dtypes)


def tensor(name: str, t: object) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    return t


def dtype(name: str, t: torch.Tensor, allowed: Sequence[torch.dtype]) -> None:
    tensor(name, t)
    if t.dtype not in allowed:
        raise TypeError(f"{name} must have dtype {_names(allowed)}; got {_names([t.dtype])}")


def dtype_arg(name: str, d: object, allowed: Sequence[torch.dtype]) -> None:
    if not isinstance(d, torch.dtype) or d not in allowed:
        got = _names([d]) if isinstance(d, torch.dtype) else repr(d)
        raise TypeError(f"{name} must be one of {_names(allowed)}; got {got}")


def same_device(ref_name: str, ref: torch.Tensor, **others: torch.Tensor | None) -> None:
    for name, t in others.items():
        if t is None:
            continue
        tensor(name, t)
        if t.device != ref.device:
            raise ValueError(f"{name} must be on the same device as {ref_name} ({ref.device}); got {t.device}")


def contiguous(name: str, t: torch.Tensor) -> None:
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (call .contiguous() first); got strides {tuple(t.stride())}")


def blocksize(b: object, allowed: Sequence[int] = BLOCKSIZES) -> None:
    if isinstance(b, bool) or not isinstance(b, int) or b not in allowed:
        raise ValueError(f"blocksize must be one of {', '.join(map(str, allowed))}; got {b!r}")


def any_blocksize(b: object) -> None:
    """The block size of the 8-bit blockwise ops: any positive int."""
    if isinstance(b, bool) or not isinstance(b, int) or b < 1:
        raise ValueError(f"blocksize must be a positive int; got {b!r}")


def quant_type(q: object) -> None:
    if q not in QUANT_TYPES:
        raise ValueError(f"quant_type must be 'nf4' or 'fp4'; got {q!r}")


def numel(name: str, t: torch.Tensor, expected: int, why: str) -> None:
    if t.numel() != expected:
        raise ValueError(f"{name} must have {expected} elements ({why}); got {t.numel()}")


def ndim(name: str, t: torch.Tensor, expected: int) -> None:
    if t.dim() != expected:
        raise ValueError(f"{name} must be {expected}-D; got shape {tuple(t.shape)}")


def index_values(name: str, t: torch.Tensor, size: int, what: str) -> None:
    """Every value of the integer tensor ``t`` is an index in ``[0, size)``.

    This reads the values (one device synchronisation), which is worth it only for index tensors: an
    entry out of range would otherwise surface as torch's IndexError, which names no argument, or on a
    GPU as a device-side assert that leaves the CUDA context unusable. Negative indices are refused too:
    an index of ``what`` counts from 0, and torch's wrap-around would silently pick another column.
    """
    if t.numel() == 0:
        return
    lo, hi = torch.stack(torch.aminmax(t)).tolist()
    if lo < 0 or hi >= size:
        raise ValueError(f"{name} must hold indices of {what} in [0, {size}); got values from {lo} to {hi}")


def n_blocks(n: int, block: int) -> int:
    return -(n // -block)


def shape_arg(name: str, shape: object) -> tuple[int, ...]:
    try:
        dims = tuple(int(s) for s in shape)  # type: ignore[union-attr]
    except TypeError:
        raise TypeError(f"{name} must be a sequence of ints; got {shape!r}") from None
    if any(d < 0 for d in dims):
        raise ValueError(f"{name} must not contain negative sizes; got {list(dims)}")
    return dims


def packed_4bit_bytes(n: int) -> int:
    """Bytes that hold ``n`` 4-bit codes, two per byte, the first in the high nibble."""
    return (n + 1) // 2


def _byte_range(t: torch.Tensor) -> tuple[int, int] | None:
    """The [first, last) addresses ``t``'s elements can occupy; None where there is no data to compare
    (empty, meta, or a tensor without storage such as a FakeTensor under torch.compile)."""
    if t.numel() == 0 or t.device.type == "meta":
        return None
    # A plain tensor that neither functionalization nor functorch wraps has storage: torch's is_fake
    # (microseconds per call, five tensors per .out call) is asked only for subclasses and those wrappers,
    # the cases its own implementation unwraps.
    if (
        type(t) is not torch.Tensor
        or torch._is_functional_tensor(t)
        or torch._C._functorch.is_functorch_wrapped_tensor(t)
    ):
        from torch._subclasses.fake_tensor import is_fake

        if is_fake(t):
            return None
    try:
        start = t.data_ptr()
    except RuntimeError:  # other tensor subclasses without real storage
        return None
    if t.is_contiguous():
        return start, start + t.numel() * t.element_size()
    last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride(), strict=True))
    return start, start + (last + 1) * t.element_size()


def out_tensor(
    out: torch.Tensor,
    shape: Sequence[int],
    dtype: torch.dtype,
    device: torch.device,
    *,
    reads: Mapping[str, torch.Tensor] | None = None,
) -> None:
    """``out`` as a ``.out`` overload needs it: this shape, dtype and device, contiguous, and sharing no
    memory with the inputs ``reads`` (a kernel writing ``out`` while it reads them gives a result that
    depends on thread scheduling)."""
    tensor("out", out)
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"out must have shape {tuple(shape)}; got {tuple(out.shape)}")
    if out.dtype != dtype:
        raise TypeError(f"out must have dtype {_names([dtype])}; got {_names([out.dtype])}")
    if out.device != device:
        raise ValueError(f"out must be on {device}; got {out.device}")
    contiguous("out", out)
    span = _byte_range(out)
    for name, t in (reads or {}).items():
        other = _byte_range(t) if isinstance(t, torch.Tensor) and t.device == out.device else None
        if span is not None and other is not None and span[0] < other[1] and other[0] < span[1]:
            raise ValueError(f"out must not share memory with {name}: the op writes out while it reads {name}")


def finite_scalar(name: str, x: object) -> None:
    if not isinstance(x, (int, float)) or isinstance(x, bool) or not math.isfinite(x):
        raise ValueError(f"{name} must be a finite number; got {x!r}")
