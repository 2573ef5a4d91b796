"""Native 4-bit kernels: bytes identical to the reference at every ISA level, any thread count."""

from __future__ import annotations

import importlib

import pytest
import torch
from native_helpers import isa

import bitsandbytes  # noqa: F401  (first: importing it loads the cpu backend)
from bitsandbytes import _formats
from bitsandbytes._reference import fourbit as ref

# Imported after bitsandbytes: importing bitsandbytes_cpu first would run the backend discovery while
# bitsandbytes_cpu is half-initialised, and the kernels would not be registered.
_C = importlib.import_module("bitsandbytes_cpu._C")
ops = torch.ops.bitsandbytes
ISAS = _C.supported_isas()
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
STORAGES = (torch.uint8, torch.int8, torch.float16, torch.bfloat16, torch.float32)


def assert_same(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)


def _midpoints(quant_type: str) -> torch.Tensor:
    v = _formats.code_table(quant_type).sort(stable=True).values
    return (v[:-1] + v[1:]) / 2


def sample(n: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Random values with the cases that decide bytes: exact midpoints, signed zeros, subnormals, inf, NaN."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * torch.exp(torch.randn(n, generator=g) * 2)
    mids = torch.cat([_midpoints(qt) for qt in _formats.QUANT_TYPES])
    if n >= 256:
        # A block of scale 1 holding every midpoint and its float neighbours: the ties.
        tie = torch.cat([mids, torch.nextafter(mids, torch.tensor(2.0)), torch.nextafter(mids, torch.tensor(-2.0))])
        x[64 : 64 + tie.numel()] = tie
        x[64 + tie.numel()] = 1.0
        x[128:132] = torch.tensor([0.0, -0.0, 1e-40, -1e-45])
        x[200:256] = 0.0  # inside an all-zero block for blocksize <= 32
    if n >= 2048:
        x[1000] = float("inf")
        x[1500] = float("nan")
        x[1600] = float("-inf")
    return x.to(dtype)


@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_quantize_matches_reference_at_every_isa(quant_type, dtype):
    for blocksize, n in [(32, 4097), (64, 3000), (128, 129), (256, 2 * 256 + 63), (1024, 2048 + 5), (4096, 12289)]:
        x = sample(n, dtype, seed=n)
        want_q, want_absmax = ref.quantize_4bit(x, blocksize, quant_type, torch.uint8)
        for name in ISAS:
            with isa(name):
                q, absmax = ops.quantize_4bit(x, blocksize, quant_type, torch.uint8)
            assert torch.equal(q, want_q), (name, blocksize, n)
            assert_same(absmax, want_absmax)


def test_values_on_midpoints_take_the_reference_code():
    # Blocks of scale exactly 1 (absmax 1.0, so s == x) holding each midpoint and its float neighbours.
    mids = torch.cat([_midpoints(qt) for qt in _formats.QUANT_TYPES])
    near = torch.cat([mids, -mids, torch.nextafter(mids, torch.tensor(2.0)), torch.nextafter(mids, torch.tensor(-2.0))])
    chunks = [torch.cat([torch.ones(1), c]) for c in near.split(31)]
    x = torch.cat([torch.nn.functional.pad(c, (0, 32 - c.numel())) for c in chunks])
    for n in (x.numel(), x.numel() - 7):  # the short last block divides instead of multiplying
        for quant_type in _formats.QUANT_TYPES:
            want = ref.quantize_4bit(x[:n], 32, quant_type, torch.uint8)
            for name in ISAS:
                with isa(name):
                    got = ops.quantize_4bit(x[:n], 32, quant_type, torch.uint8)
                assert torch.equal(got[0], want[0]), name


@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dequantize_matches_reference_at_every_isa(quant_type, dtype):
    g = torch.Generator().manual_seed(1)
    for blocksize, n in [(32, 4097), (64, 1000), (256, 777), (4096, 8192 + 33)]:
        blocks = (n + blocksize - 1) // blocksize
        packed = torch.randint(0, 256, ((n + 1) // 2, 1), generator=g, dtype=torch.uint8)
        absmax = torch.rand(blocks, generator=g) * 1e3
        absmax[0] = 0.0
        if blocks > 2:
            absmax[1] = float("nan")
            absmax[2] = float("inf")
        want = ref.dequantize_4bit(packed, absmax, blocksize, quant_type, (n,), dtype)
        for name in ISAS:
            with isa(name):
                got = ops.dequantize_4bit(packed, absmax, blocksize, quant_type, (n,), dtype)
                out = torch.full((n,), 7.0, dtype=dtype)
                ops.dequantize_4bit.out(packed, absmax, blocksize, quant_type, (n,), dtype, out=out)
            assert_same(got, want)
            assert_same(out, want)


def test_subnormal_and_overflowing_outputs_round_like_torch():
    # Scales that push table values into f16/bf16 subnormals and past the f16 range.
    packed = torch.arange(256, dtype=torch.uint8).repeat(4).reshape(-1, 1)
    n = packed.numel() * 2
    for absmax_value in (1e-6, 3e-41, 7e4, 3.3e38):
        absmax = torch.full((n // 64,), absmax_value)
        for dtype in (torch.float16, torch.bfloat16):
            want = ref.dequantize_4bit(packed, absmax, 64, "nf4", (n,), dtype)
            for name in ISAS:
                with isa(name):
                    assert_same(ops.dequantize_4bit(packed, absmax, 64, "nf4", (n,), dtype), want)


@pytest.mark.parametrize("storage", STORAGES, ids=str)
def test_every_quant_storage_holds_the_same_bytes(storage):
    x = sample(4096, torch.float32)
    base, absmax = ops.quantize_4bit(x, 64, "fp4", torch.uint8)
    q, absmax2 = ops.quantize_4bit(x, 64, "fp4", storage)
    assert q.dtype == storage and q.shape == _formats.packed_4bit_shape(x.numel(), storage)
    assert torch.equal(q.reshape(-1).view(torch.uint8), base.reshape(-1))
    assert_same(absmax, absmax2)
    assert_same(
        ops.dequantize_4bit(q, absmax, 64, "fp4", x.shape, torch.float32),
        ops.dequantize_4bit(base, absmax, 64, "fp4", x.shape, torch.float32),
    )


def test_results_do_not_depend_on_the_thread_count():
    x = sample(1 << 18, torch.bfloat16)
    q, absmax = torch.empty(x.numel() // 2, dtype=torch.uint8), torch.empty(x.numel() // 64)
    results = []
    for threads in (1, 2, 3):
        _C.quantize_4bit(x, "nf4", 64, q, absmax, threads)
        out = torch.empty(x.numel(), dtype=torch.float16)
        _C.dequantize_4bit(q, absmax, "nf4", 64, out, threads)
        results.append((q.clone(), absmax.clone(), out))
    for r in results[1:]:
        for a, b in zip(results[0], r, strict=True):
            assert_same(a, b)


def test_odd_counts_pad_the_last_low_nibble():
    for n in (1, 3, 33, 65):
        x = torch.ones(n)
        for quant_type, pad in (("nf4", 7), ("fp4", 0)):
            q, _ = ops.quantize_4bit(x, 32, quant_type, torch.uint8)
            assert int(q.reshape(-1)[-1]) & 0x0F == pad


def test_cpp_rechecks_sizes():
    x = torch.randn(100)
    absmax = torch.empty(2)
    with pytest.raises(ValueError, match="out must have 50"):
        _C.quantize_4bit(x, "nf4", 64, torch.empty(49, dtype=torch.uint8), absmax, 1)
    with pytest.raises(ValueError, match="absmax"):
        _C.quantize_4bit(x, "nf4", 64, torch.empty(50, dtype=torch.uint8), torch.empty(1), 1)
    with pytest.raises(ValueError, match="quant_type"):
        _C.quantize_4bit(x, "int4", 64, torch.empty(50, dtype=torch.uint8), absmax, 1)
    with pytest.raises(ValueError, match="blocksize"):
        _C.quantize_4bit(x, "nf4", 48, torch.empty(50, dtype=torch.uint8), absmax, 1)
    with pytest.raises(ValueError, match="at least 50 bytes"):
        _C.dequantize_4bit(torch.empty(49, dtype=torch.uint8), absmax, "nf4", 64, torch.empty(100), 1)
    with pytest.raises(ValueError, match="absmax"):
        _C.dequantize_4bit(torch.empty(50, dtype=torch.uint8), torch.empty(3), "nf4", 64, torch.empty(100), 1)
    with pytest.raises(ValueError, match="element type"):
        _C.dequantize_4bit(torch.empty(50, dtype=torch.int8), absmax, "nf4", 64, torch.empty(100), 1)


def test_is_native():
    from bitsandbytes.backends.dispatch import has_kernel

    assert all(has_kernel(op, "CPU") for op in ("quantize_4bit", "dequantize_4bit", "dequantize_4bit.out"))


def test_concurrent_calls_from_python_threads():
    from concurrent.futures import ThreadPoolExecutor

    xs = [sample(1 << 16, torch.float32, seed=s) for s in range(6)]
    want = [ref.quantize_4bit(x, 64, "nf4", torch.uint8) for x in xs]

    def run(x):
        q, absmax = ops.quantize_4bit(x, 64, "nf4", torch.uint8)
        return q, absmax, ops.dequantize_4bit(q, absmax, 64, "nf4", x.shape, torch.bfloat16)

    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(run, xs))
    for (q, absmax, deq), (want_q, want_absmax) in zip(got, want, strict=True):
        assert torch.equal(q, want_q)
        assert_same(absmax, want_absmax)
        assert_same(deq, ref.dequantize_4bit(want_q, want_absmax, 64, "nf4", deq.shape, torch.bfloat16))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("blocksize", [32, 64, 4096])
def test_large_dequantize_streams_the_same_bytes(dtype, blocksize):
    # Outputs of 16 MiB and more are written with streaming stores (AVX-512 and AVX2) when the output
    # and every block start on the vector width (plain stores otherwise: a misaligned streaming store
    # faults): both must give the reference's bytes, at every ISA level and thread count.
    n = (16 << 20) // dtype.itemsize + blocksize
    g = torch.Generator().manual_seed(11)
    packed = torch.randint(0, 256, ((n + 1) // 2,), generator=g, dtype=torch.uint8)
    absmax = torch.rand(n // blocksize, generator=g) * 4
    want = ref.dequantize_4bit(packed, absmax, blocksize, "nf4", (n,), dtype)
    bits = torch.int32 if dtype == torch.float32 else torch.int16
    buf = torch.empty(n + 16, dtype=dtype)
    assert buf.data_ptr() % 64 == 0
    for name in ISAS:
        with isa(name):
            # Aligned to 64 bytes, to 32 but not 64 (AVX2 streams, AVX-512 must not), and to neither.
            for shift in (0, 32 // dtype.itemsize, 1):
                out = buf[shift : shift + n]
                for threads in (1, 2):
                    out.fill_(0)
                    _C.dequantize_4bit(packed, absmax, "nf4", blocksize, out, threads)
                    assert torch.equal(out.view(bits), want.view(bits)), (name, shift, threads)
