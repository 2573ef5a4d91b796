"""The real Metal sources under the emulator's Apple-GPU options (bitsandbytes_emu, docs/pages/emulator.md):

- address spaces: every assembled source passes clang's check of device/constant/threadgroup/thread,
  which the running emulation erases;
- BNB_EMU_METAL_EDGE=dispatched: a short edge threadgroup of a non-uniform grid reads
  threads_per_threadgroup as the dispatched size. Apple does not say which it is, so every family must
  give the reference's results on sizes no threadgroup divides under both readings;
- BNB_EMU_METAL_FAST_MATH=1 (PYTORCH_MPS_FAST_MATH=1 on a Mac: the compiler may assume no NaN or
  infinity): NaN and infinity inputs must give what they give under safe math, which is the reference's;
- BNB_EMU_METAL_FTZ=1 (Apple GPUs flush float32 and bfloat16 subnormals): blocks of subnormal values meet
  the documented contract (bitsandbytes_mps.testing.subnormals, shared with tests/mac); a block whose
  absmax is subnormal gets the reference's codes and absmax bytes (quantizers, int8 rows, the 8-bit
  optimizers' requantization), and no NaN.

Comparisons are as strict as in test_blockwise.py / test_fourbit.py / test_int8.py / test_optimizers.py: bytes
for codes and absmax, exact dequantized values, the matmul bound for gemv, p within 1e-5 for the optimizers.
"""

from __future__ import annotations

import re

import pytest
import torch

import bitsandbytes_emu as emu
from bitsandbytes import _formats, functional
from bitsandbytes._ops import OPTIMIZER_BLOCKSIZE
from bitsandbytes._reference import REFERENCE
from bitsandbytes.testing.conformance.test_fourbit import matmul_tolerance
from bitsandbytes_mps import _assemble, library
from bitsandbytes_mps.ops import blockwise as blockwise_ops
from bitsandbytes_mps.ops import fourbit as fourbit_ops
from bitsandbytes_mps.ops import int8, matmul_4bit, optimizers
from bitsandbytes_mps.testing.subnormals import assert_subnormal_contract, subnormal_blocks

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
EDGE_MODES = ("actual", "dispatched")
QUANT_TYPES = ("nf4", "fp4")
HP = {"beta1": 0.9, "beta2": 0.995, "beta3": 0.999, "alpha": 5.0, "eps": 1e-6, "lr": 1e-2, "gnorm_scale": 0.8}


@pytest.fixture
def emulator(monkeypatch):
    """``emulator(edge=..., fast_math=..., ftz=...)`` (re)loads the Metal kernels in emulation with those
    options; every source must load."""
    emu.skip_unless_available()
    old = library.use_emulator(True)

    def load(edge: str = "actual", fast_math: bool = False, ftz: bool = False) -> None:
        monkeypatch.setenv("BNB_EMU_METAL_EDGE", edge)
        monkeypatch.setenv("BNB_EMU_METAL_FAST_MATH", "1" if fast_math else "0")
        monkeypatch.setenv("BNB_EMU_METAL_FTZ", "1" if ftz else "0")
        library.reset()
        status = library.load()
        failed = {s: r for s, r in status.reasons.items() if s != "metallib"}
        assert not failed and not status.missing, f"emulated sources failed to load: {failed or status.missing}"

    yield load
    library.use_emulator(old)
    library.reset()


def bits_equal(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """Same dtype, shape and bytes, except that any NaN matches any NaN (payloads are not specified)."""
    assert got.dtype == want.dtype and got.shape == want.shape, f"{what}: {got.dtype}{tuple(got.shape)}"
    if got.is_floating_point():
        both = got.isnan() & want.isnan()
        got, want = got.masked_fill(both, 0), want.masked_fill(both, 0)
        ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[got.element_size()]
        got, want = got.view(ints), want.view(ints)
    bad = (got != want).flatten().nonzero().flatten()
    assert bad.numel() == 0, (
        f"{what}: {bad.numel()} of {got.numel()} elements differ, first at {bad[0].item()}: "
        f"{got.flatten()[bad[0]].item()} != {want.flatten()[bad[0]].item()}"
    )


def all_bits_equal(got, want, what: str) -> None:
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if w is None:
            assert g is None, f"{what}[{i}]"
        else:
            bits_equal(g, w, f"{what}[{i}]")


def randn(shape, dtype=torch.float32, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * torch.logspace(-2, 1, shape[-1])).to(dtype)


@pytest.fixture(scope="module")
def code() -> torch.Tensor:
    return functional.create_dynamic_map(signed=True).float()


# ---- the families' results as lists of tensors, ours and the reference's --------------------------------


def blockwise(A, code, blocksize, ops):
    q, absmax = ops["quantize_blockwise"](A, code, blocksize)
    return [q, absmax, ops["dequantize_blockwise"](q, absmax, code, blocksize, A.dtype)]


def fourbit(A, blocksize, quant_type, ops):
    packed, absmax = ops["quantize_4bit"](A, blocksize, quant_type, torch.uint8)
    return [packed, absmax, ops["dequantize_4bit"](packed, absmax, blocksize, quant_type, list(A.shape), A.dtype)]


OURS = {**blockwise_ops.OPS, **fourbit_ops.OPS, **matmul_4bit.OPS, **int8.OPS, **optimizers.OPS}


def run_8bit_optimizer(ops, name, g, n, seed):
    """One 8-bit step from a fixed state; returns [p, state1, state2, absmax1, absmax2]."""
    qmap1, qmap2 = functional.create_dynamic_map(signed=True).float(), functional.create_dynamic_map(False).float()
    gen = torch.Generator().manual_seed(seed)
    blocks = -(n // -OPTIMIZER_BLOCKSIZE)
    p = torch.randn(n, generator=gen)
    s1 = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=gen)
    a1 = torch.rand(blocks, generator=gen) * 0.1
    two = name == "adam"
    s2 = torch.randint(128, 256, (n,), dtype=torch.uint8, generator=gen) if two else None
    a2 = torch.rand(blocks, generator=gen) * 0.01 if two else None
    ops["optimizer_update_8bit_blockwise"](
        name, g, p, s1, s2, HP["beta1"], HP["beta2"], HP["beta3"], HP["alpha"], HP["eps"], 1, HP["lr"],
        qmap1, qmap2 if two else None, a1, a2, 0.01, HP["gnorm_scale"],
    )  # fmt: skip
    return [p, s1, s2, a1, a2]


def run_32bit_optimizer(ops, name, g, n, seed):
    """One 32-bit step; returns [p, state1, state2]."""
    gen = torch.Generator().manual_seed(seed)
    p = torch.randn(n, generator=gen).to(g.dtype)
    s1 = torch.rand(n, generator=gen) * 0.1
    s2 = torch.rand(n, generator=gen) * 0.01 if name == "adam" else None
    ops["optimizer_update_32bit"](
        name, g, p, s1, s2, torch.zeros(1), 0.0, 1.0, HP["beta1"], HP["beta2"], HP["beta3"], HP["alpha"], HP["eps"],
        0.01, 1, HP["lr"], HP["gnorm_scale"],
    )  # fmt: skip
    return [p, s1, s2]


def optimizer_close(got, want, what):
    """States bit for bit, p within the sqrt tolerance of test_optimizers.py (NaNs where the reference's)."""
    p, ref_p = got[0], want[0]
    assert torch.equal(p.isnan(), ref_p.isnan()), f"{what}: NaNs of p"
    torch.testing.assert_close(p.nan_to_num(), ref_p.nan_to_num(), rtol=1e-5, atol=1e-6, msg=lambda m: f"{what}: {m}")
    all_bits_equal(got[1:], want[1:], f"{what} states")


# ---------------------------------------------------------------------------------------- address spaces


@pytest.mark.parametrize("source", _assemble.sources())
def test_assembled_sources_pass_the_address_space_check(source):
    """What torch.mps.compile_shader gets, type-checked with MSL's address spaces by clang."""
    from bitsandbytes_emu.address_spaces import skip_unless_clang

    skip_unless_clang()
    emu.check_metal_address_spaces(_assemble.assemble(source, emulated=True), source)


def test_the_address_space_check_sees_into_the_real_kernels():
    """One helper of blockwise.metal given the wrong space fails at its call, inside a template instance."""
    from bitsandbytes_emu.address_spaces import skip_unless_clang

    skip_unless_clang()
    text = _assemble.assemble("blockwise.metal", emulated=True)
    bad, n = re.subn(
        r"inline uint slot256\(threadgroup const float\* mids", "inline uint slot256(device const float* mids", text
    )
    assert n == 1, "blockwise.metal's slot256 signature moved: update this test"
    with pytest.raises(
        emu.MetalAddressSpaceError, match=r"blockwise\.metal:\d+:\d+: error: no matching function for call to 'slot256'"
    ):
        emu.check_metal_address_spaces(bad, "blockwise.metal")


# --------------------------------------------------------------------- edge threadgroup size, both readings


@pytest.mark.parametrize("n", [5000, 2047, 9, 8 * 256 + 1])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("edge", EDGE_MODES)
def test_dequantize_blockwise_on_sizes_no_threadgroup_divides(emulator, code, edge, dtype, n):
    """n = 5000: 625 threads in groups of 256, 256 and 113 (the case tests/mac hits)."""
    emulator(edge=edge)
    for blocksize in (64, 4096):
        A = randn((n,), dtype, seed=n + blocksize)
        rq, rabsmax = REFERENCE["quantize_blockwise"](A, code, blocksize)
        got = blockwise_ops.dequantize_blockwise(rq, rabsmax, code, blocksize, dtype)
        want = REFERENCE["dequantize_blockwise"](rq, rabsmax, code, blocksize, dtype)
        bits_equal(got, want, f"dequantize_blockwise n={n} blocksize={blocksize} edge={edge}")


ODD_SHAPES = [(5000,), (3, 1001), (7,)]


@pytest.mark.parametrize("shape", ODD_SHAPES, ids=str)
@pytest.mark.parametrize("edge", EDGE_MODES)
def test_blockwise_roundtrip_on_odd_shapes(emulator, code, edge, shape):
    emulator(edge=edge)
    for dtype in DTYPES:
        for blocksize in (64, 256, 4096):
            A = randn(shape, dtype, seed=blocksize)
            what = f"{dtype} {shape} blocksize={blocksize} edge={edge}"
            all_bits_equal(blockwise(A, code, blocksize, OURS), blockwise(A, code, blocksize, REFERENCE), what)


@pytest.mark.parametrize("shape", ODD_SHAPES, ids=str)
@pytest.mark.parametrize("edge", EDGE_MODES)
def test_4bit_roundtrip_on_odd_shapes(emulator, edge, shape):
    emulator(edge=edge)
    for dtype in DTYPES:
        for blocksize in (64, 256, 4096):
            A = randn(shape, dtype, seed=blocksize)
            for qt in QUANT_TYPES:
                what = f"{qt} {dtype} {shape} blocksize={blocksize} edge={edge}"
                all_bits_equal(fourbit(A, blocksize, qt, OURS), fourbit(A, blocksize, qt, REFERENCE), what)


@pytest.mark.parametrize(("a_shape", "N"), [((1, 333), 7), ((5, 130), 9), ((3, 1, 37), 5)], ids=str)
@pytest.mark.parametrize("edge", EDGE_MODES)
def test_gemv_on_odd_shapes(emulator, edge, a_shape, N):
    emulator(edge=edge)
    K = a_shape[-1]
    W = torch.randn((N, K), generator=torch.Generator().manual_seed(K))
    packed, absmax = REFERENCE["quantize_4bit"](W, 64, "nf4", torch.uint8)
    W64 = REFERENCE["dequantize_4bit"](packed, absmax, 64, "nf4", [N, K], torch.float32).double()
    code4 = _formats.code_table("nf4").float()
    for dtype in DTYPES:
        A = randn(a_shape, dtype, seed=N)
        args = (A, packed, [N, K], absmax, code4, 64)
        out, ref = matmul_4bit.gemv_4bit(*args), REFERENCE["gemv_4bit"](*args)
        diff = (out.double() - ref.double()).abs()
        assert (diff <= matmul_tolerance(A.reshape(-1, K), W64, ref.reshape(-1, N)).reshape(diff.shape)).all(), (
            f"gemv {dtype} {a_shape} N={N} edge={edge}: worst {diff.max().item()}"
        )


@pytest.mark.parametrize("edge", EDGE_MODES)
def test_int8_on_odd_shapes(emulator, edge):
    emulator(edge=edge)
    for dtype in DTYPES:
        for shape, threshold in (((5, 1001), 0.0), ((3, 333), 2.5), ((257, 3), 0.0)):
            A = randn(shape, dtype, seed=shape[1])
            what = f"int8_vectorwise_quant {dtype} {shape} threshold={threshold} edge={edge}"
            got, want = int8.int8_vectorwise_quant(A, threshold), REFERENCE["int8_vectorwise_quant"](A, threshold)
            all_bits_equal(got, want, what)
    codes = torch.randint(-127, 128, (7, 333), dtype=torch.int8, generator=torch.Generator().manual_seed(1))
    stats = torch.rand(7, generator=torch.Generator().manual_seed(2)) * 10
    bits_equal(
        int8.int8_vectorwise_dequant(codes, stats), REFERENCE["int8_vectorwise_dequant"](codes, stats), "dequant"
    )
    acc = torch.randint(-(2**20), 2**20, (9, 301), dtype=torch.int32, generator=torch.Generator().manual_seed(3))
    rows, cols = torch.rand(9) * 5, torch.rand(301) * 5
    bias = torch.randn(301).half()
    bits_equal(
        int8.int8_mm_dequant(acc, rows, cols, dtype=torch.float16, bias=bias),
        REFERENCE["int8_mm_dequant"](acc, rows, cols, dtype=torch.float16, bias=bias),
        f"int8_mm_dequant edge={edge}",
    )


@pytest.mark.parametrize("edge", EDGE_MODES)
def test_optimizers_on_odd_sizes(emulator, edge):
    """32-bit steps run one thread per element in a non-uniform grid; 8-bit ones a short last block."""
    emulator(edge=edge)
    for n in (1000, 5 * OPTIMIZER_BLOCKSIZE + 77):
        for name in ("adam", "lion", "momentum"):
            g = torch.randn(n, generator=torch.Generator().manual_seed(n))
            optimizer_close(run_32bit_optimizer(OURS, name, g, n, 1), run_32bit_optimizer(REFERENCE, name, g, n, 1),
                            f"32-bit {name} n={n} edge={edge}")  # fmt: skip
            optimizer_close(run_8bit_optimizer(OURS, name, g, n, 2), run_8bit_optimizer(REFERENCE, name, g, n, 2),
                            f"8-bit {name} n={n} edge={edge}")  # fmt: skip


# --------------------------------------------------------------------------- NaN and infinity, fast math


def safe_and_fast(emulator, run):
    """``run()`` (which returns tensors computed from fresh inputs) under safe math, then fast math."""
    emulator(fast_math=False)
    safe = run()
    emulator(fast_math=True)
    return safe, run()


def nonfinite_input(dtype, blocksize=64, seed=0) -> torch.Tensor:
    """Blocks holding a NaN, +inf and -inf, an all-NaN-free block, and a NaN in the short last block."""
    A = randn((4 * blocksize + 5,), dtype, seed)
    A[blocksize + 3] = float("nan")
    A[2 * blocksize + 1] = float("inf")
    A[2 * blocksize + 9] = -float("inf")
    A[4 * blocksize + 2] = float("nan")
    return A


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fast_math_blockwise_nan_and_inf(emulator, code, dtype):
    A = nonfinite_input(dtype)
    safe, fast = safe_and_fast(emulator, lambda: blockwise(A, code, 64, OURS))
    all_bits_equal(safe, blockwise(A, code, 64, REFERENCE), "safe math against the reference")
    all_bits_equal(fast, safe, "fast math against safe math")


@pytest.mark.parametrize("quant_type", QUANT_TYPES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fast_math_4bit_nan_and_inf(emulator, dtype, quant_type):
    A = nonfinite_input(dtype, seed=1)
    safe, fast = safe_and_fast(emulator, lambda: fourbit(A, 64, quant_type, OURS))
    all_bits_equal(safe, fourbit(A, 64, quant_type, REFERENCE), "safe math against the reference")
    all_bits_equal(fast, safe, "fast math against safe math")


@pytest.mark.parametrize("threshold", [0.0, 4.0])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fast_math_int8_nan_rows(emulator, dtype, threshold):
    """A NaN row (stat NaN, codes 0), an infinity (an outlier under a threshold, the stat without one)."""
    A = randn((4, 40), torch.float32, seed=3)
    A[1, 7] = float("nan")
    A[2, 3] = float("inf")
    A[3, 0] = -float("inf")
    A = A.to(dtype)
    safe, fast = safe_and_fast(emulator, lambda: list(int8.int8_vectorwise_quant(A, threshold)))
    all_bits_equal(safe, REFERENCE["int8_vectorwise_quant"](A, threshold), "safe math against the reference")
    all_bits_equal(fast, safe, "fast math against safe math")


def test_fast_math_int8_dequant_of_nonfinite_stats(emulator):
    codes = torch.randint(-127, 128, (4, 33), dtype=torch.int8, generator=torch.Generator().manual_seed(4))
    stats = torch.tensor([1.0, float("nan"), float("inf"), 0.0])
    acc = codes.int() * 1000
    cols = torch.tensor([float("nan")] + [1.0] * 32)

    def run():
        return [int8.int8_vectorwise_dequant(codes, stats), int8.int8_mm_dequant(acc, stats, cols)]

    safe, fast = safe_and_fast(emulator, run)
    want = [REFERENCE["int8_vectorwise_dequant"](codes, stats), REFERENCE["int8_mm_dequant"](acc, stats, cols)]
    all_bits_equal(safe, want, "safe math against the reference")
    all_bits_equal(fast, safe, "fast math against safe math")


@pytest.mark.parametrize("name", ["adam", "lion", "momentum"])
def test_fast_math_8bit_optimizer_nan_gradient(emulator, name):
    """A NaN gradient poisons its block's new absmax (NaN); the other blocks stay exact."""
    n = 3 * OPTIMIZER_BLOCKSIZE
    g = torch.randn(n, generator=torch.Generator().manual_seed(5))
    g[OPTIMIZER_BLOCKSIZE + 3] = float("nan")
    safe, fast = safe_and_fast(emulator, lambda: run_8bit_optimizer(OURS, name, g, n, 6))
    optimizer_close(safe, run_8bit_optimizer(REFERENCE, name, g, n, 6), "safe math against the reference")
    all_bits_equal(fast, safe, "fast math against safe math")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", ["lion", "adam"])
def test_fast_math_32bit_optimizer_nan_gradient(emulator, name, dtype):
    """Lion's update is sign(d): the sign of a NaN is NaN, which must reach p."""
    n = 300
    g = torch.randn(n, generator=torch.Generator().manual_seed(7)).to(dtype)
    g[5] = float("nan")
    g[17] = float("inf")
    safe, fast = safe_and_fast(emulator, lambda: run_32bit_optimizer(OURS, name, g, n, 8))
    optimizer_close(safe, run_32bit_optimizer(REFERENCE, name, g, n, 8), "safe math against the reference")
    assert safe[0][5].isnan()
    all_bits_equal(fast, safe, "fast math against safe math")


# ------------------------------------------------------------------------- float32 subnormals flushed


def blockwise_roundtrip(code, blocksize, ops):
    return lambda A: blockwise(A, code, blocksize, ops)


def fourbit_roundtrip(blocksize, quant_type, ops):
    return lambda A: fourbit(A, blocksize, quant_type, ops)


@pytest.mark.parametrize("blocksize", [64, 256])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_subnormal_blocks_meet_the_contract_when_flushed(emulator, code, dtype, blocksize):
    """Codes of the blocks with a subnormal absmax (below MIN_SCALE, and the tail between MIN_SCALE and
    2**-126, where a flushed 1 / absmax was inf and the codes those of NaN) and every absmax are the
    reference's bytes; the rest within the contract."""
    emulator(ftz=True)
    A = subnormal_blocks(dtype, blocksize)
    how = [assert_subnormal_contract(A, blockwise_roundtrip(code, blocksize, OURS),
                                     blockwise_roundtrip(code, blocksize, REFERENCE), blocksize)]  # fmt: skip
    for qt in QUANT_TYPES:
        how.append(assert_subnormal_contract(A, fourbit_roundtrip(blocksize, qt, OURS),
                                             fourbit_roundtrip(blocksize, qt, REFERENCE), blocksize))  # fmt: skip
    if dtype == torch.float16:
        assert how == ["exact"] * 3  # float16 subnormals are normal float32 values: nothing is flushed


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_subnormal_blocks_are_exact_without_flushing(emulator, code, dtype):
    """The default emulation keeps subnormals: the kernels then give the reference's bytes exactly."""
    emulator(ftz=False)
    A = subnormal_blocks(dtype, 64)
    assert (
        assert_subnormal_contract(A, blockwise_roundtrip(code, 64, OURS), blockwise_roundtrip(code, 64, REFERENCE), 64)
        == "exact"
    )
    for qt in QUANT_TYPES:
        assert (
            assert_subnormal_contract(A, fourbit_roundtrip(64, qt, OURS), fourbit_roundtrip(64, qt, REFERENCE), 64)
            == "exact"
        )


def test_the_contract_rejects_results_off_by_more_than_the_smallest_normal(code):
    """The assertion bites: a dequantization off by 2**-125 in a subnormal block fails it."""

    def off_by(delta):
        def run(A):
            q, absmax, deq = blockwise(A, code, 64, REFERENCE)
            deq = deq.clone()
            deq[1] += delta
            return [q, absmax, deq]

        return run

    A = subnormal_blocks(torch.float32, 64)
    assert (
        assert_subnormal_contract(A, off_by(2.0**-127), blockwise_roundtrip(code, 64, REFERENCE), 64) == "per element"
    )
    with pytest.raises(AssertionError, match=r"dequantized value 1 .* within 2\*\*-126"):
        assert_subnormal_contract(A, off_by(2.0**-125), blockwise_roundtrip(code, 64, REFERENCE), 64)
    half = subnormal_blocks(torch.float16, 64)
    with pytest.raises(AssertionError, match="float16 input must give the reference's results bit for bit"):
        assert_subnormal_contract(half, off_by(2.0**-24), blockwise_roundtrip(code, 64, REFERENCE), 64)


def test_the_contract_rejects_a_changed_code_or_absmax_of_a_subnormal_block(code):
    """Codes of a block whose absmax is subnormal, and every absmax, must be the reference's: a flushed
    absmax (0), or the code of 0 for a subnormal value, fails it, though both dequantize within 2**-126."""

    def changed(what):
        def run(A):
            q, absmax, deq = (t.clone() for t in blockwise(A, code, 64, REFERENCE))
            if what == "absmax":
                absmax[0] = 0.0
            else:
                q.view(-1)[1] = q.view(-1)[int(A.flatten()[:64].abs().argmin())]
            return [q, absmax, deq]

        return run

    A = subnormal_blocks(torch.float32, 64)
    reference = blockwise_roundtrip(code, 64, REFERENCE)
    with pytest.raises(AssertionError, match=r"block absmax 0 is 0\.0"):
        assert_subnormal_contract(A, changed("absmax"), reference, 64)
    with pytest.raises(AssertionError, match=r"code in a block of subnormal absmax 1 "):
        assert_subnormal_contract(A, changed("code"), reference, 64)


# ------------------------------------------------------- blocks whose absmax is subnormal, flushed

MIN_SCALE = 2.0**-149 * 0x006CE3EE  # bitsandbytes._formats.MIN_SCALE (1e-38) in float32: itself subnormal


def subnormal_absmax_blocks(dtype: torch.dtype, blocksize: int, tail: float, seed: int = 0) -> torch.Tensor:
    """Blocks whose absmax is below MIN_SCALE, between MIN_SCALE and 2**-126 (the window where a flushed
    1 / absmax is inf), ordinary blocks between them, a window block of signed zeros and 2**-149's, and a
    short tail whose absmax is ``tail``."""
    g = torch.Generator().manual_seed(seed)
    b = blocksize

    def block(size, absmax):
        r = torch.randn(size, generator=g)
        return r / r.abs().max() * absmax

    zeros_and_smallest = torch.where(torch.randn(b, generator=g) > 0, 0.0, -0.0)
    zeros_and_smallest[::5] = 2.0**-149
    zeros_and_smallest[3::5] = -(2.0**-148)
    zeros_and_smallest[1] = 1.1e-38
    parts = [block(b, 0.5 * MIN_SCALE), torch.randn(b, generator=g), block(b, 1.1e-38),
             block(b, 1.0001 * MIN_SCALE), zeros_and_smallest, block(b, 2.0**-127 * 1.99),
             torch.randn(b, generator=g), block(b // 2 + 3, tail)]  # fmt: skip
    A = torch.cat(parts).to(dtype)
    assert A.float().abs().lt(2.0**-126).logical_and(A != 0).any()
    return A


SUBNORMAL_DTYPES = (torch.float32, torch.bfloat16)  # float16 has no float32 subnormals: test_subnormal_blocks_*


@pytest.mark.parametrize("fast_math", [False, True], ids=["safe-math", "fast-math"])
@pytest.mark.parametrize("tail", [0.3 * MIN_SCALE, 1.1e-38], ids=["tail-below-min-scale", "tail-in-window"])
@pytest.mark.parametrize("blocksize", [64, 256])
@pytest.mark.parametrize("dtype", SUBNORMAL_DTYPES, ids=str)
def test_subnormal_absmax_blocks_give_the_reference_codes_when_flushed(
    emulator, code, dtype, blocksize, tail, fast_math
):
    """A GPU that flushes subnormals scales a block whose absmax is subnormal by its values' mantissas: codes
    and absmax are the reference's bytes (before, 1 / absmax was inf there and the codes those of NaN or 0);
    the dequantized values (code * subnormal absmax, flushed) are within 2**-126 of the reference's."""
    emulator(ftz=True, fast_math=fast_math)
    A = subnormal_absmax_blocks(dtype, blocksize, tail)
    runs = {"blockwise": (lambda ops: blockwise(A, code, blocksize, ops))}
    for qt in QUANT_TYPES:
        runs[qt] = lambda ops, qt=qt: fourbit(A, blocksize, qt, ops)
    for what, run in runs.items():
        got, want = run(OURS), run(REFERENCE)
        all_bits_equal(got[:2], want[:2], f"{what} {dtype} blocksize={blocksize} codes and absmax")
        deq, ref_deq = got[2].double(), want[2].double()
        assert deq.isfinite().all(), f"{what}: non-finite dequantized values"
        assert ((deq - ref_deq).abs() <= 2.0**-126).all(), f"{what}: dequantized values off by more than 2**-126"


def test_int8_rows_with_a_subnormal_absmax_when_flushed(emulator):
    """The reference's scale 127 / absmax is inf for a subnormal row absmax: nonzero values are +-127 by their
    sign, zeros 0. A flushing GPU must not read 0 * inf there (a NaN, whose sign then chose the code)."""
    emulator(ftz=True)
    g = torch.Generator().manual_seed(11)
    A = torch.randn((4, 70), generator=g)
    A[1] = A[1] / A[1].abs().max() * 1.1e-38
    A[2] = A[2] / A[2].abs().max() * 0.4 * MIN_SCALE
    A[2, ::3] = 0.0
    A[3, ::2] = -0.0
    A[3] = A[3] / A[3].abs().max() * 2.0**-149 * 3
    for dtype in SUBNORMAL_DTYPES:
        for threshold in (0.0, 2.0):
            X = A.to(dtype)
            got, want = int8.int8_vectorwise_quant(X, threshold), REFERENCE["int8_vectorwise_quant"](X, threshold)
            all_bits_equal(got, want, f"int8_vectorwise_quant {dtype} threshold={threshold}")


def decaying_8bit_steps(ops, name: str, steps: int):
    """``steps`` 8-bit steps from a state whose first block (and the short tail) holds values ~1e-37 and
    sees zero gradients, so its absmax decays by beta through the subnormal range (Adam's m: 0.9**k), as
    the embedding rows of tokens that never occur do; the middle block trains normally. Returns the
    [p, state1, state2, absmax1, absmax2] after every step."""
    B = OPTIMIZER_BLOCKSIZE
    n = 2 * B + 77
    gen = torch.Generator().manual_seed(12)
    qmap1, qmap2 = functional.create_dynamic_map(signed=True).float(), functional.create_dynamic_map(False).float()
    m = torch.randn(n, generator=gen) * 1e-37
    m[B : 2 * B] = torch.randn(B, generator=gen) * 0.1
    s1, a1 = REFERENCE["quantize_blockwise"](m, qmap1, B)
    two = name == "adam"
    s2, a2 = REFERENCE["quantize_blockwise"](m.square() if two else m, qmap2, B) if two else (None, None)
    p = torch.randn(n, generator=gen)
    history = []
    for step in range(1, steps + 1):
        g = torch.zeros(n)
        g[B : 2 * B] = torch.randn(B, generator=gen)
        ops["optimizer_update_8bit_blockwise"](
            name, g, p, s1, s2, HP["beta1"], HP["beta2"], HP["beta3"], HP["alpha"], HP["eps"], step, HP["lr"],
            qmap1, qmap2 if two else None, a1, a2, 0.0, 1.0,
        )  # fmt: skip
        history.append([t.clone() if t is not None else None for t in (p, s1, s2, a1, a2)])
    return history, (qmap1, qmap2)


@pytest.mark.parametrize("name", ["adam", "momentum", "lion"])
def test_8bit_optimizer_state_decaying_through_subnormals_when_flushed(emulator, name):
    """Under flushing, no NaN or inf reaches p, a state or an absmax, and each step meets the subnormal
    contract against the reference run from the same start: p and the states dequantized (code * absmax)
    within 2**-126 of the reference's (a subnormal state may read as 0), every absmax the reference's or,
    with it, below 2**-126; the normally trained block stays bit-exact."""
    emulator(ftz=True)
    steps = 30  # 0.9**k * 1e-37 passes 2**-126 at k = 21, MIN_SCALE at k = 22
    ours, maps = decaying_8bit_steps(OURS, name, steps)
    ref, _ = decaying_8bit_steps(REFERENCE, name, steps)
    B = OPTIMIZER_BLOCKSIZE
    for k, (got, want) in enumerate(zip(ours, ref, strict=True), start=1):
        what = f"{name} step {k}"
        for t in got:
            assert t is None or not t.is_floating_point() or t.isfinite().all(), f"{what}: non-finite values"
        # Lion steps p by lr * sign(m): a flushed subnormal m has sign 0, the reference's +-1, so its p
        # drifts by lr a step in the decaying blocks (a known difference, docs/pages/apple-silicon.md).
        trained = slice(B, 2 * B) if name == "lion" else slice(None)
        torch.testing.assert_close(got[0][trained], want[0][trained], rtol=1e-5, atol=1e-6,
                                   msg=lambda m, what=what: f"{what}: p: {m}")  # fmt: skip
        for codes, absmax, ref_codes, ref_absmax, qmap in ((got[1], got[3], want[1], want[3], maps[0]),
                                                           (got[2], got[4], want[2], want[4], maps[1])):  # fmt: skip
            if codes is None:
                continue
            same = absmax.view(torch.int32) == ref_absmax.view(torch.int32)
            assert (same | ((absmax < 2.0**-126) & (ref_absmax < 2.0**-126))).all(), f"{what}: absmax"
            deq = (qmap[codes.long()].reshape(-1) * absmax.repeat_interleave(B)[: codes.numel()]).double()
            ref_deq = qmap[ref_codes.long()].reshape(-1) * ref_absmax.repeat_interleave(B)[: codes.numel()]
            assert ((deq - ref_deq.double()).abs() <= 2.0**-126).all(), f"{what}: dequantized state"
            bits_equal(codes[B : 2 * B], ref_codes[B : 2 * B], f"{what}: codes of the trained block")


SCALE_PROBE = """
kernel void scale_probe(device const float* x [[buffer(0)]], device const float* absmax [[buffer(1)]],
                        device float* out [[buffer(2)]], constant long& full [[buffer(3)]],
                        uint i [[thread_position_in_grid]]) {
  out[i] = scale_to_unit(x[i], absmax[i], full != 0);
}
"""


@pytest.mark.parametrize("full", [True, False], ids=["full-block", "short-block"])
def test_8bit_optimizer_scaling_of_a_subnormal_absmax_when_flushed(full):
    """optimizers.metal's requantization scaling given a subnormal block absmax as it is stored (a GPU that
    flushes arithmetic input but keeps a computed subnormal, as some chips are reported to, leaves one
    there): the reference's x * (1 / max(absmax, MIN_SCALE)) (x / ... for the short block), never NaN.
    The whole-step test above cannot reach it: emulated flushing also flushes the step's results."""
    emu.skip_unless_available()
    lib = emu.metal_library(_assemble.assemble("optimizers.metal", emulated=True) + SCALE_PROBE,
                            filename="optimizers.metal", ftz=True)  # fmt: skip
    g = torch.Generator().manual_seed(13)
    bits = torch.randint(1, 0x00800000, (4096,), generator=g, dtype=torch.int32)
    bits[:8] = torch.tensor([1, 0x006CE3ED, 0x006CE3EE, 0x006CE3EF, 0x007FFFFF, 0x00400000, 7, 0x006CE3EE])
    absmax = bits.view(torch.float32)
    x = absmax * (torch.rand(4096, generator=g) * 2 - 1)  # |x| <= absmax: subnormal or zero
    x[::7] = absmax[::7] * torch.where(torch.arange(0, 4096, 7) % 2 == 0, 1.0, -1.0)
    x[3::11] = torch.where(torch.arange(3, 4096, 11) % 2 == 0, 0.0, -0.0)
    clamped = absmax.clamp(min=_formats.MIN_SCALE)
    want = (x * (1.0 / clamped) if full else x / clamped).clamp(-1.0, 1.0)
    out = torch.empty_like(x)
    lib.scale_probe(x, absmax, out, int(full), threads=4096, group_size=256)
    bits_equal(out, want, f"scale_to_unit full={full}")
