"""What the quant kernels promise for subnormal input on an Apple GPU, as one assertion the emulator tests
(BNB_EMU_METAL_FTZ=1) and the Mac tests (device mps) share.

Apple GPUs flush float32 subnormals to zero, on input and output, and bfloat16 with them (it is computed
in float32); float16 subnormals are kept (ml-explore/mlx#4205, pytorch/pytorch#190740 and #193897; the
MSL specification allows it). The contract bitsandbytes-mps keeps: every block absmax is the reference's
(it is taken on the bits); in a block whose absmax is below 2**-126 (subnormal or 0) the codes are the
reference's too (the kernels scale such a block by the integer mantissas of its values, which no flushing
touches); every dequantized value is the reference's on the input with its float32/bfloat16 subnormals
flushed to zero, or within 2**-126 of the reference's (code * subnormal absmax flushes, and in a block with
a normal absmax a subnormal value may scale as 0). float16 input is unaffected and bit-exact.
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


def assert_subnormal_contract(A: torch.Tensor, ours: Roundtrip, reference: Roundtrip, blocksize: int) -> str:
    """Assert that ``ours(A)`` = (codes, absmax, dequantized) meets the subnormal contract against
    ``reference`` (run on the CPU); ``blocksize`` is the quantization block of both, ``codes`` one byte a
    value or packed two a byte (4-bit; A then has more than one value). Returns how it is met:

    - ``"exact"``: the reference's results on A itself (always so for float16);
    - ``"per element"``: every block absmax is the reference's, so are the codes of every block whose
      absmax is below 2**-126, and every dequantized value is the flushed input's or within 2**-126 of
      the reference's.
    """
    got = [t.cpu() for t in ours(A)]
    A_cpu = A.cpu()
    want = list(reference(A_cpu))
    if all(_same(g, w) for g, w in zip(got, want, strict=True)):
        return "exact"
    if A_cpu.dtype == torch.float16:
        bad = [i for i, (g, w) in enumerate(zip(got, want, strict=True)) if not _same(g, w)]
        raise AssertionError(f"float16 input must give the reference's results bit for bit; outputs {bad} differ")
    (codes, absmax, deq), (ref_codes, ref_absmax, ref_deq) = got, want
    _, _, fl_deq = reference(flush_subnormals(A_cpu))
    n = A_cpu.numel()
    checks = {
        "block absmax": (_same_each(absmax, ref_absmax), absmax, ref_absmax),
        "dequantized value": (_same_each(deq, fl_deq) | _within(deq, ref_deq), deq, ref_deq),
    }
    small_block = (ref_absmax.abs() < SMALLEST_NORMAL).repeat_interleave(blocksize)[:n]
    value_codes, ref_value_codes = _codes_per_value(codes, n), _codes_per_value(ref_codes, n)
    checks["code in a block of subnormal absmax"] = (
        (value_codes == ref_value_codes) | ~small_block,
        value_codes,
        ref_value_codes,
    )
    for what, (ok, mine, ref) in checks.items():
        if not bool(ok.all()):
            bad = int((~ok).flatten().nonzero()[0])
            raise AssertionError(
                f"{A_cpu.dtype} input with subnormals: {what} {bad} is {mine.flatten()[bad].item()!r}; the "
                f"reference gives {ref.flatten()[bad].item()!r}"
                + (", and it is neither the flushed input's result nor within 2**-126 of it" if what[0] == "d" else "")
            )
    return "per element"


def _codes_per_value(codes: torch.Tensor, n: int) -> torch.Tensor:
    """The code of each of the n values: one byte a value, or two a byte with the first in the high nibble."""
    flat = codes.flatten()
    if flat.numel() == n:
        return flat
    return torch.stack([flat >> 4, flat & 0xF], dim=1).flatten()[:n]


def _same_each(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise: same bits, or both NaN."""
    ints = _int_of(a)
    return (a.view(ints) == b.view(ints)) | (a.isnan() & b.isnan())


def _within(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return ((a.double() - b.double()).abs() <= SMALLEST_NORMAL) | (a.isnan() & b.isnan())


def subnormal_blocks(dtype: torch.dtype, blocksize: int, seed: int = 0) -> torch.Tensor:
    """Four blocks and a short tail: a block whose absmax is a float32 subnormal below MIN_SCALE, one of
    mixed normal and subnormal values (normal absmax), one of signed zeros and the smallest subnormals, one
    ordinary block, and a tail of subnormals whose absmax is between MIN_SCALE and 2**-126.
    For float16 the "subnormals" are float16 ones (its own range)."""
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
    tail = r[4 * b :]
    # float32/bfloat16: a tail whose absmax lies between MIN_SCALE (1e-38) and 2**-126, where a flushed
    # 1 / absmax is inf (the first block's is below MIN_SCALE)
    A[4 * b :] = tail / tail.abs().max() * (1.1e-38 if dtype != torch.float16 else tiny / 2)
    return A.to(dtype)
