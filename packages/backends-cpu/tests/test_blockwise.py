"""Native 8-bit blockwise kernels: bytes identical to the reference at every ISA level, any thread count."""

from __future__ import annotations

import contextlib
import importlib

import pytest
import torch

import bitsandbytes  # noqa: F401  (first: importing it loads the cpu backend)
from bitsandbytes import functional as F
from bitsandbytes._reference import blockwise as ref

# Imported after bitsandbytes: importing bitsandbytes_cpu first would run the backend discovery while
# bitsandbytes_cpu is half-initialised, and the kernels would not be registered.
_C = importlib.import_module("bitsandbytes_cpu._C")
ops = torch.ops.bitsandbytes
ISAS = _C.supported_isas()
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@contextlib.contextmanager
def isa(name: str):
    before = _C.isa()
    _C.set_isa(name)
    try:
        yield
    finally:
        _C.set_isa(before)


def assert_same(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)


def maps() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    dynamic = F.create_dynamic_map(signed=True).float()
    # Not sorted by value, with repeated entries and entries beyond [-1, 1]: the general rule (sort
    # stably, ties to the lower index) and the clamp both matter here.
    odd = dynamic[torch.randperm(256, generator=g)].clone()
    odd[:8] = odd[8]
    odd[10], odd[11] = 1.5, -1.25
    return {"dynamic": dynamic, "linear": torch.linspace(-1, 1, 256), "unsorted": odd}


def midpoints(code: torch.Tensor) -> torch.Tensor:
    v = code.sort(stable=True).values
    return (v[:-1] + v[1:]) / 2


def sample(n: int, dtype: torch.dtype, code: torch.Tensor, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * torch.exp(torch.randn(n, generator=g) * 2)
    if n >= 2048:
        # Blocks of 32 of scale exactly 1 holding midpoints and their float neighbours (the ties).
        m = midpoints(code)[::3]
        near = torch.cat([m, torch.nextafter(m, torch.tensor(2.0)), torch.nextafter(m, torch.tensor(-2.0))])[: 31 * 40]
        chunks = [torch.cat([torch.ones(1), c]) for c in near.split(31)]
        tie = torch.cat([torch.nn.functional.pad(c, (0, 32 - c.numel())) for c in chunks])[: n // 2]
        x[: tie.numel()] = tie
        x[-40:-36] = torch.tensor([0.0, -0.0, 1e-40, -1e-45])
        x[-100] = float("inf")
        x[-200] = float("nan")
        x[-300] = float("-inf")
    return x.to(dtype)


@pytest.mark.parametrize("map_name", ["dynamic", "linear", "unsorted"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_quantize_matches_reference_at_every_isa(map_name, dtype):
    code = maps()[map_name]
    for blocksize, n in [(32, 4096 + 17), (64, 2048 + 100), (256, 3000), (4096, 8192 + 4000)]:
        x = sample(n, dtype, code, seed=n)
        want_q, want_absmax = ref.quantize_blockwise(x, code, blocksize)
        for name in ISAS:
            with isa(name):
                q, absmax = ops.quantize_blockwise(x, code, blocksize)
            assert torch.equal(q, want_q), (name, blocksize, n)
            assert_same(absmax, want_absmax)


def beyond_one() -> torch.Tensor:
    # Midpoints 1 ulp beyond -1 and 1: the clamp decides the code of a value 2 ulps beyond.
    code = F.create_dynamic_map(signed=True).float()
    step = torch.tensor(2.0**-23)
    code[100], code[200] = -(1 + 2 * step), 1 + 2 * step
    return code


@pytest.mark.parametrize("map_name", ["dynamic", "linear", "unsorted", "beyond_one"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_quantize_blocks_of_extreme_absmax_match_reference(map_name, dtype):
    # The AVX-512 search takes a block's scaled values unclamped when its absmax is finite: x times the
    # reciprocal of the absmax stays in [-1, 1] while the reciprocal is normal, and within a few ulps of it
    # when the reciprocal is subnormal (absmax >= 2^126). Blocks at those ends, and at the smallest scales
    # (absmax below BNB_MIN_SCALE, where the scale is clamped), must still give the reference's codes.
    code = beyond_one() if map_name == "beyond_one" else maps()[map_name]
    g = torch.Generator().manual_seed(11)
    for blocksize in (64, 4096):
        blocks = 24
        x = torch.rand(blocks, blocksize, generator=g, dtype=torch.float64) * 2 - 1
        # The absmax of each block: its largest |x| scaled to a target, kept exactly as the block's maximum.
        top = x.abs().argmax(dim=1)
        rows = torch.arange(blocks)
        x[rows, top] = torch.copysign(torch.ones(blocks, dtype=x.dtype), x[rows, top])
        mantissa = 1 + torch.rand(blocks, generator=g, dtype=torch.float64)
        exponent = torch.tensor([127, 126, 126, 125, 0, -1, -125, -126, -127, -130] * 3, dtype=torch.float64)[:blocks]
        scale = mantissa * 2.0**exponent
        # An absmax whose scaled maximum lands 2 ulps beyond 1 (float32 only; bf16 rounds it away).
        scale[1] = torch.tensor([0x7F4006EE], dtype=torch.int32).view(torch.float32).double()
        x = (x * scale[:, None]).flatten()
        x = x.clamp(-torch.finfo(torch.float32).max, torch.finfo(torch.float32).max).to(dtype)
        x = torch.cat([x, x[: blocksize // 2 + 3]])  # and a partial last block
        want_q, want_absmax = ref.quantize_blockwise(x, code, blocksize)
        assert torch.isfinite(want_absmax).all()
        for name in ISAS:
            with isa(name):
                q, absmax = ops.quantize_blockwise(x, code, blocksize)
            assert torch.equal(q, want_q), (name, blocksize)
            assert_same(absmax, want_absmax)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dequantize_matches_reference_at_every_isa(dtype):
    g = torch.Generator().manual_seed(5)
    for code in maps().values():
        for blocksize, n in [(32, 1000), (256, 4096 + 33), (4096, 4100)]:
            blocks = (n + blocksize - 1) // blocksize
            A = torch.randint(0, 256, (n,), generator=g, dtype=torch.uint8)
            absmax = torch.rand(blocks, generator=g) * torch.tensor([1e-40, 1.0, 7e4, 3e38])[torch.arange(blocks) % 4]
            if blocks > 2:
                absmax[1] = float("nan")
                absmax[2] = float("inf")
            want = ref.dequantize_blockwise(A, absmax, code, blocksize, dtype)
            for name in ISAS:
                with isa(name):
                    got = ops.dequantize_blockwise(A, absmax, code, blocksize, dtype)
                assert_same(got, want)


def test_results_do_not_depend_on_the_thread_count():
    code = maps()["dynamic"]
    x = sample(1 << 18, torch.float16, code)
    q, absmax = torch.empty(x.numel(), dtype=torch.uint8), torch.empty(x.numel() // 256)
    results = []
    for threads in (1, 2, 3):
        _C.quantize_blockwise(x, code, 256, q, absmax, threads)
        out = torch.empty(x.numel(), dtype=torch.bfloat16)
        _C.dequantize_blockwise(q, absmax, code, 256, out, threads)
        results.append((q.clone(), absmax.clone(), out))
    for r in results[1:]:
        for a, b in zip(results[0], r, strict=True):
            assert_same(a, b)


@pytest.mark.parametrize("name", ISAS)
def test_unaligned_output(name):
    code = maps()["dynamic"]
    x = sample(64 * 1024 + 100, torch.float32, code, seed=9)
    want_q, want_absmax = ref.quantize_blockwise(x, code, 256)
    buf, absmax = torch.empty(x.numel() + 1, dtype=torch.uint8), torch.empty(want_absmax.numel())
    with isa(name):
        for q in (buf[:-1], buf[1:]):
            _C.quantize_blockwise(x, code, 256, q, absmax, 2)
            assert torch.equal(q, want_q)
            assert_same(absmax, want_absmax)


def test_cpp_rechecks_sizes():
    code = maps()["dynamic"]
    x = torch.randn(100)
    with pytest.raises(ValueError, match="out must have 100"):
        _C.quantize_blockwise(x, code, 64, torch.empty(99, dtype=torch.uint8), torch.empty(2), 1)
    with pytest.raises(ValueError, match="absmax"):
        _C.quantize_blockwise(x, code, 64, torch.empty(100, dtype=torch.uint8), torch.empty(1), 1)
    with pytest.raises(ValueError, match="code"):
        _C.quantize_blockwise(x, code[:255], 64, torch.empty(100, dtype=torch.uint8), torch.empty(2), 1)
    with pytest.raises(ValueError, match="absmax"):
        _C.dequantize_blockwise(torch.empty(100, dtype=torch.uint8), torch.empty(3), code, 64, torch.empty(100), 1)
    with pytest.raises(ValueError, match="out must have 100"):
        _C.dequantize_blockwise(torch.empty(100, dtype=torch.uint8), torch.empty(2), code, 64, torch.empty(99), 1)


def test_is_native():
    from bitsandbytes.backends.dispatch import has_kernel

    ops = ("quantize_blockwise", "dequantize_blockwise", "dequantize_blockwise.out")
    assert all(has_kernel(op, "CPU") for op in ops)
