"""What the quant kernels promise for subnormal input on an Apple GPU, as one assertion the emulator tests
(BNB_EMU_METAL_FTZ=1) and the Mac tests (device mps) share.

Apple GPUs flush float32 subnormals to zero, on input and output, and bfloat16 with them (it is computed
in float32); float16 subnormals are kept (ml-explore/mlx#4205, pytorch/pytorch#190740 and #193897; the
MSL specification allows it). The contract bitsandbytes-mps keeps: a float32 or
bfloat16 value, or a block absmax, below 2**-126 may be treated as 0. The results are then those of the
reference on the input with its float32/bfloat16 subnormals flushed to zero, or within 2**-126 of the
reference's dequantized values (decided per value: a block can mix both). float16 input is unaffected
and bit-exact.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

SMALLEST_NORMAL = 2.0**-126  # float32 and bfloat16 alike

# quantize(A) -> (codes, absmax, dequantized).
Roundtrip = Callable[[torch.Tensor], Sequence[torch.Tensor]]


def flush_subnormals(t: torch.Tensor) -> torch.Tensor:
    """``t`` with float32/bfloat16 subnormals replaced by zeros of their sign (float16 is returned as is)."""
    if t.dtype not in (torch.float32, torch.bfloat16):
        return t
    tiny = (t != 0) & (t.float().abs() < SMALLEST_NORMAL)
    return torch.where(tiny, torch.zeros_like(t).copysign(t), t)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.cpu(), b.cpu()
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.is_floating_point():
        both = a.isnan() & b.isnan()
        a, b = a.masked_fill(both, 0), b.masked_fill(both, 0)
        return bool((a.view(_int_of(a)) == b.view(_int_of(b))).all())  # signed zeros count
    return torch.equal(a, b)


def _int_of(t: torch.Tensor) -> torch.dtype:
    return {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]


def assert_subnormal_contract(A: torch.Tensor, ours: Roundtrip, reference: Roundtrip) -> str:
    """Assert that ``ours(A)`` = (codes, absmax, dequantized) meets the subnormal contract against
    ``reference`` (run on the CPU). Returns how it is met:

    - ``"exact"``: the reference's results on A itself (always so for float16);
    - ``"flushed"``: the reference's results on A with its subnormals flushed to zero;
    - ``"per element"``: every dequantized value is the flushed input's or within 2**-126 of the
      reference's, and every block absmax is the reference's, the flushed input's, or, with the
      reference's, below 2**-126 (a subnormal absmax treated as 0).
    """
    got = [t.cpu() for t in ours(A)]
    A_cpu = A.cpu()
    want = list(reference(A_cpu))
    if all(_same(g, w) for g, w in zip(got, want, strict=True)):
        return "exact"
    if A_cpu.dtype == torch.float16:
        bad = [i for i, (g, w) in enumerate(zip(got, want, strict=True)) if not _same(g, w)]
        raise AssertionError(f"float16 input must give the reference's results bit for bit; outputs {bad} differ")
    flushed = list(reference(flush_subnormals(A_cpu)))
    if all(_same(g, w) for g, w in zip(got, flushed, strict=True)):
        return "flushed"
    (_, absmax, deq), (_, ref_absmax, ref_deq), (_, fl_absmax, fl_deq) = got, want, flushed
    deq_ok = _same_each(deq, fl_deq) | _within(deq, ref_deq)
    absmax_ok = _same_each(absmax, ref_absmax) | _same_each(absmax, fl_absmax)
    absmax_ok |= (absmax.abs() < SMALLEST_NORMAL) & (ref_absmax.abs() < SMALLEST_NORMAL)
    if bool(deq_ok.all()) and bool(absmax_ok.all()):
        return "per element"
    what = "dequantized value" if not bool(deq_ok.all()) else "block absmax"
    bad = int((~deq_ok if what == "dequantized value" else ~absmax_ok).flatten().nonzero()[0])
    mine, ref = (deq, ref_deq) if what == "dequantized value" else (absmax, ref_absmax)
    raise AssertionError(
        f"{A_cpu.dtype} input with subnormals: {what} {bad} is {mine.flatten()[bad].item()!r}; the reference "
        f"gives {ref.flatten()[bad].item()!r}, and neither the flushed input's result nor within 2**-126 of it"
    )


def _same_each(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise: same bits, or both NaN."""
    ints = _int_of(a)
    return (a.view(ints) == b.view(ints)) | (a.isnan() & b.isnan())


def _within(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return ((a.double() - b.double()).abs() <= SMALLEST_NORMAL) | (a.isnan() & b.isnan())


def subnormal_blocks(dtype: torch.dtype, blocksize: int, seed: int = 0) -> torch.Tensor:
    """Four blocks and a short tail: a block whose absmax is a float32 subnormal, one of mixed normal and
    subnormal values (normal absmax), one of signed zeros and the smallest subnormals, one ordinary
    block, and a tail of subnormals. For float16 the "subnormals" are float16 ones (its own range)."""
    g = torch.Generator().manual_seed(seed)
    tiny = SMALLEST_NORMAL if dtype != torch.float16 else 2.0**-14
    r = torch.randn(4 * blocksize + blocksize // 2 + 3, generator=g)
    b = blocksize
    A = r.clone()
    A[:b] = r[:b] * tiny / 8  # absmax subnormal
    A[b : 2 * b] = r[b : 2 * b] * tiny / 4
    A[b] = 3 * tiny  # normal absmax, subnormal neighbours
    A[2 * b : 3 * b] = torch.where(r[2 * b : 3 * b] > 0, 0.0, -0.0)
    A[2 * b : 3 * b : 7] = 2.0**-130 if dtype != torch.float16 else 2.0**-24  # exact in the dtype
    A[4 * b :] = r[4 * b :] * tiny / 16
    return A.to(dtype)
