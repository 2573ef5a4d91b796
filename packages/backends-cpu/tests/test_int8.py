"""Native LLM.int8() kernels: bytes identical to the reference at every ISA level (VNNI on and off), any
thread count, odd sizes, int32 wrap-around, and the C++ size re-checks."""

from __future__ import annotations

import pytest
import torch
from native_helpers import isa, onednn_off

import bitsandbytes  # noqa: F401  (registers the cpu backend)
from bitsandbytes._reference import int8 as ref
from bitsandbytes_cpu import _C

ops = torch.ops.bitsandbytes
ISAS = _C.supported_isas()
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# (isa, vnni): every GEMM tile this build and CPU can run.
GEMM_PATHS = [(name, False) for name in ISAS] + ([("avx512", True)] if "avx512" in ISAS and _C.int8_has_vnni() else [])


def assert_same(a, b, what=""):
    """Same dtype, shape and bytes; NaN meets any NaN (torch's own NaN payloads vary with shape)."""
    if a is None or b is None:
        assert a is b, what
        return
    assert a.dtype == b.dtype and a.shape == b.shape, (what, a.dtype, b.dtype, a.shape, b.shape)
    if a.dtype.is_floating_point:
        view = {2: torch.int16, 4: torch.int32}[a.element_size()]
        bad = (a.view(view) != b.view(view)) & ~(a.isnan() & b.isnan())
    else:
        bad = a != b
    assert not bad.any(), f"{what}: {int(bad.sum())} differ, first at {bad.nonzero()[0].tolist()}"


def activations(rows: int, K: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Random rows plus the rows that decide bytes: all zero, NaN, inf, subnormal absmax, exact .5 ties."""
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(rows, K, generator=g) * 2
    with_inf = torch.randn(K, generator=g)
    with_inf[K // 2 :][:1] = float("inf")
    specials = [
        torch.zeros(K),
        torch.full((K,), float("nan")),
        with_inf,
        torch.full((K,), 1e-40 if dtype != torch.float16 else 6e-8),
        (torch.arange(K) % 255 - 127) / 127 * 3.0,  # codes land exactly on integers and halves
    ]
    for i, row in enumerate(specials[: max(rows - 1, 0)]):
        A[i + 1] = row
    if rows and K > 3:
        A[0, 3] = -7.5  # an outlier column for threshold 6
    return A.to(dtype)


QUANT_SHAPES = [(1, 1), (3, 15), (6, 16), (7, 17), (9, 65), (2, 300), (33, 129), (0, 5), (4, 0)]


@pytest.mark.parametrize("threshold", [0.0, 6.0, 2.999])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_quant_matches_reference_at_every_isa(dtype, threshold):
    for rows, K in QUANT_SHAPES:
        A = activations(rows, K, dtype, seed=rows * 1000 + K)
        want_vq = ref.int8_vectorwise_quant(A, threshold)
        want_dq = ref.int8_double_quant(A, threshold)
        for name in ISAS:
            with isa(name):
                got_vq = ops.int8_vectorwise_quant(A, threshold)
                got_dq = ops.int8_double_quant(A, threshold)
            for g, w, what in zip(got_vq, want_vq, ("codes", "stats", "cols"), strict=True):
                assert_same(g, w, f"vectorwise {what} {name} {rows}x{K}")
            for g, w, what in zip(got_dq, want_dq, ("row codes", "col codes", "row", "col", "cols"), strict=True):
                assert_same(g, w, f"double {what} {name} {rows}x{K}")


def test_threshold_is_compared_in_the_input_dtype():
    # 0.7 is not a float32 (fp32(0.7) < 0.7), 6.099 not a float16/bfloat16: torch compares after rounding.
    for dtype, thr in [(torch.float32, 0.7), (torch.float16, 6.099), (torch.bfloat16, 6.099)]:
        A = torch.tensor([[thr, 0.1], [0.2, 0.3]]).to(dtype)
        for got, want in zip(ops.int8_double_quant(A, thr), ref.int8_double_quant(A, thr), strict=True):
            assert_same(got, want, str(dtype))
        assert ops.int8_vectorwise_quant(A, thr)[2].tolist() == [0]


def test_dequant_kernels_match_reference_at_every_isa():
    g = torch.Generator().manual_seed(1)
    for rows, K in [(1, 1), (3, 15), (5, 17), (9, 65), (0, 3), (3, 0)]:
        q = torch.randint(-128, 128, (rows, K), generator=g, dtype=torch.int8)
        st = torch.rand(rows, generator=g) * 5
        acc = torch.randint(-(2**31), 2**31 - 1, (rows, K), generator=g, dtype=torch.int32)
        rs, cs = torch.rand(rows, generator=g) * 3, torch.rand(K, generator=g) * 3
        biases = [None] + [torch.randn(K, generator=g).to(d) for d in DTYPES]
        want_vd = ref.int8_vectorwise_dequant(q, st)
        want_md = {(d, i): ref.int8_mm_dequant(acc, rs, cs, d, b) for d in DTYPES for i, b in enumerate(biases)}
        for name in ISAS:
            with isa(name):
                assert_same(ops.int8_vectorwise_dequant(q, st), want_vd, f"vectorwise_dequant {name}")
                for (d, i), want in want_md.items():
                    assert_same(ops.int8_mm_dequant(acc, rs, cs, d, biases[i]), want, f"mm_dequant {name} {d} {i}")


GEMM_SHAPES = [
    (1, 1, 1),
    (1, 5, 63),
    (2, 3, 64),
    (3, 4, 65),
    (5, 7, 127),
    (6, 9, 129),
    (33, 17, 300),
    (0, 3, 4),
    (3, 0, 4),
    (3, 4, 0),
]


@pytest.mark.parametrize(("name", "vnni"), GEMM_PATHS, ids=lambda p: str(p))
def test_gemm_matches_reference(name, vnni):
    g = torch.Generator().manual_seed(2)
    for M, N, K in GEMM_SHAPES:
        A = torch.randint(-128, 128, (M, K), generator=g, dtype=torch.int8)  # -128 too: any int8 is accepted
        B = torch.randint(-128, 128, (N, K), generator=g, dtype=torch.int8)
        want = ref.int8_linear_matmul(A, B)
        rs, cs = torch.rand(M, generator=g), torch.rand(N, generator=g)
        with isa(name):
            for threads in (1, 2, 3):
                out = torch.full((M, N), 7, dtype=torch.int32)
                _C.int8_linear_matmul(A, B, out, threads, vnni)
                assert_same(out, want, f"matmul {M}x{N}x{K} threads={threads}")
            for d in DTYPES:
                bias = torch.randn(N, generator=g).to(d)
                out = torch.empty(M, N, dtype=d)
                _C.int8_scaled_mm(A, B, rs, cs, bias, out, 2, vnni)
                assert_same(out, ref.int8_scaled_mm(A, B, rs, cs, bias, d), f"scaled_mm {M}x{N}x{K} {d}")


@pytest.mark.parametrize(("name", "vnni"), GEMM_PATHS, ids=lambda p: str(p))
def test_gemm_wraps_modulo_2_32_like_the_reference(name, vnni):
    # K > 131072 with extreme values: the exact sum leaves int32; reference and kernel both wrap.
    for M, N, K, a, b in [(2, 5, 140_001, -128, -128), (3, 2, 70_000, -128, 127), (1, 3, 2048, 127, 127)]:
        A = torch.full((M, K), a, dtype=torch.int8)
        B = torch.full((N, K), b, dtype=torch.int8)
        B[0, -1] = 3
        out = torch.empty(M, N, dtype=torch.int32)
        with isa(name):
            _C.int8_linear_matmul(A, B, out, 2, vnni)
        assert_same(out, (A.long() @ B.long().T).to(torch.int32), f"{M}x{N}x{K}")
        if K < 100_000:
            assert_same(out, ref.int8_linear_matmul(A, B), f"{M}x{N}x{K} vs reference")


def test_results_do_not_depend_on_thread_count():
    A = activations(70, 300, torch.bfloat16, seed=3)
    CA, SCA, _ = ref.int8_vectorwise_quant(A, 0.0)
    W = torch.randint(-127, 128, (37, 300), dtype=torch.int8)
    results = []
    for threads in (1, 2, 4):
        torch.set_num_threads(threads)
        try:
            results.append(
                (
                    *ops.int8_double_quant(A, 6.0),
                    ops.int8_linear_matmul(CA, W),
                    ops.int8_scaled_mm(CA, W, SCA, torch.rand(37, generator=torch.Generator().manual_seed(0))),
                )
            )
        finally:
            torch.set_num_threads(2)
    for r in results[1:]:
        for a, b in zip(r, results[0], strict=True):
            assert_same(a, b, "thread count")


def test_public_ops_on_batched_and_noncontiguous_inputs():
    g = torch.Generator().manual_seed(4)
    A = torch.randn(2, 3, 40, generator=g, dtype=torch.float16)[..., ::2]  # [2, 3, 20], non-contiguous
    A[1, 2, 5] = 9.0
    CA, SCA, cols = ops.int8_vectorwise_quant(A, 6.0)
    for g_, w in zip((CA, SCA, cols), ref.int8_vectorwise_quant(A, 6.0), strict=True):
        assert_same(g_, w)
    W = torch.randn(7, 20, generator=g)
    CB, SCB, _ = ops.int8_vectorwise_quant(W, 0.0)
    out = torch.full((2, 3, 7), -1, dtype=torch.int32)
    ops.int8_linear_matmul.out(CA, CB, out)
    assert_same(out, ref.int8_linear_matmul(CA, CB))
    bias = torch.randn(7, generator=g, dtype=torch.float16)
    got, subA = ops.int8_mixed_scaled_mm(A, CA, CB, SCA, SCB, cols, bias)
    want, want_subA = ref.int8_mixed_scaled_mm(A, CA, CB, SCA, SCB, cols, bias)
    assert_same(subA, want_subA)
    torch.testing.assert_close(got, want, rtol=2e-3, atol=2e-3)
    got, _ = ops.int8_mixed_scaled_mm(A, CA, CB, SCA, SCB, None, bias)  # no outliers: one fused kernel
    assert_same(got, ref.int8_mixed_scaled_mm(A, CA, CB, SCA, SCB, None, bias)[0])


def test_cpp_rechecks_sizes():
    A = torch.zeros(4, 8, dtype=torch.int8)
    B = torch.zeros(3, 8, dtype=torch.int8)
    with pytest.raises(ValueError, match="out must have 12 elements"):
        _C.int8_linear_matmul(A, B, torch.empty(4, 2, dtype=torch.int32), 1)
    with pytest.raises(ValueError, match="B must be"):
        _C.int8_linear_matmul(A, torch.zeros(3, 7, dtype=torch.int8), torch.empty(4, 3, dtype=torch.int32), 1)
    with pytest.raises(ValueError, match="unexpected element type"):
        _C.int8_linear_matmul(A, B, torch.empty(4, 3, dtype=torch.int64), 1)
    with pytest.raises(ValueError, match="row_stats must have 4 elements"):
        _C.int8_scaled_mm(A, B, torch.ones(3), torch.ones(3), None, torch.empty(4, 3), 1)
    with pytest.raises(ValueError, match="bias must have 3 elements"):
        _C.int8_scaled_mm(A, B, torch.ones(4), torch.ones(3), torch.ones(2), torch.empty(4, 3), 1)
    X = torch.randn(4, 8)
    with pytest.raises(ValueError, match="stats must have 4 elements"):
        _C.int8_vectorwise_quant(X, 0.0, torch.empty(4, 8, dtype=torch.int8), torch.empty(3), None, 1)
    with pytest.raises(ValueError, match="cols must have 8 elements"):
        _C.int8_vectorwise_quant(
            X, 1.0, torch.empty(4, 8, dtype=torch.int8), torch.empty(4), torch.empty(7, dtype=torch.int64), 1
        )
    with pytest.raises(ValueError, match="stats must have 8 elements"):
        _C.int8_colwise_quant(X, False, 0.0, torch.empty(4, 8, dtype=torch.int8), torch.empty(4), 1)
    with pytest.raises(ValueError, match="out must have 32 elements"):
        _C.int8_vectorwise_dequant(A, torch.ones(4), torch.empty(31), 1)
    with pytest.raises(ValueError, match="col_stats must have 8 elements"):
        _C.int8_mm_dequant(
            torch.zeros(4, 8, dtype=torch.int32), torch.ones(4), torch.ones(7), None, torch.empty(4, 8), 1
        )


# The many-row route through torch._int_mm (ops.int8.INT_MM, taken by default where the CPU has AMX): forced
# here on any CPU, since only its speed needs AMX. Exact int32 sums, so the bytes must equal our kernel's.
INT_MM_SHAPES = [(16, 1, 1), (16, 5, 63), (17, 33, 300), (40, 7, 129), (64, 130, 1000)]


@pytest.fixture
def int_mm(monkeypatch):
    from bitsandbytes_cpu.ops import int8 as int8_ops

    monkeypatch.setattr(int8_ops, "INT_MM", True)
    calls = []
    real = torch._int_mm
    monkeypatch.setattr(torch, "_int_mm", lambda *a, **k: calls.append(a[0].shape) or real(*a, **k))
    return int8_ops, calls


def test_int_mm_route_gives_the_kernels_bytes(int_mm):
    int8_ops, calls = int_mm
    g = torch.Generator().manual_seed(7)
    for M, N, K in INT_MM_SHAPES:
        A = torch.randint(-128, 128, (2, M // 2 + M % 2, K), generator=g, dtype=torch.int8)[:, : M // 2]
        B = torch.randint(-128, 128, (N, K), generator=g, dtype=torch.int8)
        if A.shape[0] * A.shape[1] < int8_ops.INT_MM_MIN_ROWS:
            continue
        want = ref.int8_linear_matmul(A, B)
        calls.clear()
        assert_same(ops.int8_linear_matmul(A, B), want, f"{M}x{N}x{K}")
        out = torch.full(want.shape, 5, dtype=torch.int32)
        ops.int8_linear_matmul.out(A, B, out)
        assert_same(out, want, f".out {M}x{N}x{K}")
        rs, cs = torch.rand(A.shape[:-1], generator=g), torch.rand(N, generator=g)
        for d in DTYPES:
            bias = torch.randn(N, generator=g).to(d)
            assert_same(ops.int8_scaled_mm(A, B, rs, cs, bias, d), ref.int8_scaled_mm(A, B, rs, cs, bias, d), f"{d}")
        assert len(calls) == 2 + len(DTYPES), f"torch._int_mm took {len(calls)} of the calls at {M}x{N}x{K}"


def test_int_mm_route_wraps_modulo_2_32_like_the_reference(int_mm):
    _, calls = int_mm
    M, N, K = 16, 3, 140_001
    A = torch.full((M, K), -128, dtype=torch.int8)
    B = torch.full((N, K), -128, dtype=torch.int8)
    B[0, -1] = 3
    assert_same(ops.int8_linear_matmul(A, B), (A.long() @ B.long().T).to(torch.int32))
    assert calls


def test_int_mm_route_is_not_taken_for_few_rows_or_empty_sizes(int_mm):
    int8_ops, calls = int_mm
    few = int8_ops.INT_MM_MIN_ROWS - 1
    for M, N, K in [(few, 4, 8), (16, 0, 8), (16, 4, 0), (0, 4, 8)]:
        A, B = torch.ones(M, K, dtype=torch.int8), torch.ones(N, K, dtype=torch.int8)
        assert_same(ops.int8_linear_matmul(A, B), ref.int8_linear_matmul(A, B))
    assert not calls


def test_int_mm_route_follows_the_cpu_feature(monkeypatch):
    from bitsandbytes_cpu.ops import int8 as int8_ops

    monkeypatch.setattr(int8_ops, "INT_MM", None)
    assert int8_ops._int_mm_route(64, 8, 8) == (torch.cpu._is_amx_tile_supported() and torch.__version__ >= (2, 6))
    # torch's oneDNN switch off: _int_mm falls back to a kernel ~100x slower (docs in ops/_features.py), so
    # the route is not taken whatever the CPU; it comes back with the switch.
    monkeypatch.setattr(int8_ops, "amx_tiles", lambda: True)
    with onednn_off():
        assert not int8_ops._int_mm_route(64, 8, 8)
    assert int8_ops._int_mm_route(64, 8, 8) == (torch.backends.mkldnn.is_available() and torch.__version__ >= (2, 6))
