"""The many-row gemm_4bit route (rows above the fused kernel's): the weight decoded tile by tile to fp32
values rounded as the reference rounds them for A's dtype, multiplied by torch's fp32 GEMM, rounded once.

The claims tested: the decoded tiles are bit-identical to the reference's dequantized weight in A's
dtype (so only the order of the fp32 sums differs from the reference); the route's result is the
correctly rounded exact product for all but a few elements, and those are one unit in the last place
off; the thread count changes no bit; the tiles stay within TILE_BYTES whatever N; gradients still
come from the dequantized weight.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from native_helpers import isa, num_threads, onednn_off

import bitsandbytes
from bitsandbytes import _formats
from bitsandbytes._reference import REFERENCE
from bitsandbytes.testing.cases import randn
from bitsandbytes.testing.conformance.test_fourbit import matmul_tolerance
from bitsandbytes_cpu import _C
from bitsandbytes_cpu.ops import matmul_4bit as mm

ISAS = _C.supported_isas()
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
ops = torch.ops.bitsandbytes


@pytest.fixture(autouse=True)
def _not_the_amx_kernel(monkeypatch):
    """These are the routes of CPUs without our AMX kernel (test_amx_gemm.py tests that one): on an AMX
    machine it would take every bf16 shape here."""
    monkeypatch.setattr(mm, "AMX_GEMM", False)


@contextlib.contextmanager
def setting(name, value):
    before = getattr(mm, name)
    setattr(mm, name, value)
    try:
        yield
    finally:
        setattr(mm, name, before)


def weight(N, K, blocksize, quant_type="nf4", nested=False, seed=0):
    """Packed weight, the gemm_4bit keyword arguments for its scales, and the fp32 scales they stand for."""
    W = randn((N, K), torch.float32, seed, spread=False)
    q, absmax = REFERENCE["quantize_4bit"](W, blocksize, quant_type, torch.uint8)
    if not nested:
        return q, absmax, {}, absmax
    dyn = bitsandbytes.functional.create_dynamic_map(signed=True).float()
    offset = absmax.mean().reshape(1)
    absmax_8bit, absmax2 = REFERENCE["quantize_blockwise"](absmax - offset, dyn, 256)
    expanded = REFERENCE["dequantize_blockwise"](absmax_8bit, absmax2, dyn, 256, torch.float32) + offset
    return q, absmax2, {"absmax_8bit": absmax_8bit, "absmax_code": dyn, "absmax_offset": offset}, expanded


def decode(q, absmax, kw, quant_type, blocksize, i0, i1, dtype):
    out = torch.full((i1 - i0,), float("nan"))
    nested = () if not kw else (kw["absmax_8bit"], kw["absmax_code"], kw["absmax_offset"])
    table = _formats.code_table(quant_type, "cpu").float()
    name = str(dtype).removeprefix("torch.")
    qb = q.view(torch.uint8).reshape(-1)
    _C.dequantize_4bit_tile_f32(qb, absmax, table, blocksize, i0, i1, name, out, 2, *nested)
    return out


# Tiles at any flat offset: on and off block and byte boundaries (odd i0: a row of odd K starting
# mid-byte), shorter than one vector step, across many blocks; blocks larger than a row.
RANGES = [(0, 4096), (7, 999), (64, 65), (1, 33), (33, 4096), (2048, 4095)]


@pytest.mark.parametrize("level", ISAS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
@pytest.mark.parametrize("nested", [False, True], ids=["plain", "nested"])
@pytest.mark.parametrize("blocksize", [32, 64, 256, 4096])
def test_tiles_are_the_reference_weights_in_a_dtype(level, dtype, quant_type, nested, blocksize):
    N, K = 64, 64  # 4096 weights
    q, absmax, kw, expanded = weight(N, K, blocksize, quant_type, nested, seed=blocksize)
    ref = REFERENCE["dequantize_4bit"](q, expanded, blocksize, quant_type, [N, K], dtype).float().reshape(-1)
    with isa(level):
        for i0, i1 in RANGES:
            got = decode(q, absmax, kw, quant_type, blocksize, i0, i1, dtype)
            assert torch.equal(got, ref[i0:i1]), f"[{i0}, {i1}) at {level}"


def test_tile_decoder_rejects_bad_arguments():
    q, absmax, _, _ = weight(8, 64, 64)
    qb, table = q.view(torch.uint8).reshape(-1), _formats.code_table("nf4", "cpu").float()
    with pytest.raises(ValueError, match="round_to"):
        _C.dequantize_4bit_tile_f32(qb, absmax, table, 64, 0, 512, "float64", torch.empty(512), 1)
    with pytest.raises(ValueError, match="B must have at least 257"):
        _C.dequantize_4bit_tile_f32(qb, absmax, table, 64, 0, 513, "float32", torch.empty(513), 1)
    with pytest.raises(ValueError, match="absmax"):
        _C.dequantize_4bit_tile_f32(qb, absmax[:7], table, 64, 0, 512, "float32", torch.empty(512), 1)
    with pytest.raises(ValueError, match="out"):
        _C.dequantize_4bit_tile_f32(qb, absmax, table, 64, 0, 512, "float32", torch.empty(511), 1)
    with pytest.raises(ValueError, match="i1"):
        _C.dequantize_4bit_tile_f32(qb, absmax, table, 64, 9, 8, "float32", torch.empty(1), 1)
    with pytest.raises(ValueError, match="absmax_code"):
        _C.dequantize_4bit_tile_f32(qb, absmax, table, 64, 0, 512, "float32", torch.empty(512), 1, qb)
    with pytest.raises(ValueError, match="absmax_8bit must have at least 8"):
        _C.dequantize_4bit_tile_f32(
            qb, absmax, table, 64, 0, 512, "float32", torch.empty(512), 1, qb[:7], table.repeat(16), absmax[:1]
        )


def exact(A, q, expanded, blocksize, quant_type, N, K, bias):
    """float64 A @ W.T + bias with W the reference's weight in A's dtype: what an fp32 sum approximates."""
    W = REFERENCE["dequantize_4bit"](q, expanded, blocksize, quant_type, [N, K], A.dtype)
    r = A.double().reshape(-1, K) @ W.double().T
    if bias is not None:
        r = r + bias.double()
    return r.reshape(*A.shape[:-1], N)


def check_correctly_rounded(out, A, q, expanded, blocksize, quant_type, N, K, bias):
    """fp32 sums in any order land within a few fp32 ulps of the exact sum; rounded to bf16 / fp16 that
    is the correctly rounded value but for the rare sums near a rounding midpoint. A weight not rounded
    as the reference rounds it moves far more elements off it (test_unrounded_weights_are_caught)."""
    e = exact(A, q, expanded, blocksize, quant_type, N, K, bias)
    S = (
        A.double().abs().reshape(-1, K)
        @ REFERENCE["dequantize_4bit"](q, expanded, blocksize, quant_type, [N, K], A.dtype).double().abs().T
    )
    if bias is not None:
        S = S + bias.double().abs()
    S = S.reshape(e.shape)
    accum = 2 * K**0.5 * torch.finfo(torch.float32).eps * S
    if A.dtype == torch.float32:
        assert ((out.double() - e).abs() <= accum).all()
        return
    rounded = e.to(A.dtype)
    off = out != rounded
    # The fp32 sum within `accum` of the exact value, then rounded once (eps * |x| bounds the ulp at x).
    fi = torch.finfo(A.dtype)
    ulp = fi.eps * torch.maximum(out.double().abs(), e.abs()) + fi.eps * fi.tiny
    assert ((out.double() - e).abs() <= ulp / 2 + accum).all()
    assert off.float().mean() < 0.02, f"{int(off.sum())} of {off.numel()} not correctly rounded"


# (M, N, K, blocksize): rows above every FUSED_MAX_ROWS, N not a multiple of the tile (TILE_BYTES made
# small), odd K (rows starting mid-byte), blocks straddling rows, a block larger than a row, 3-D A.
SHAPES = [(40, 100, 256, 64), (33, 45, 77, 32), (70, 61, 320, 128), (65, 9, 64, 4096), ((2, 40), 50, 130, 64)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
@pytest.mark.parametrize(("M", "N", "K", "blocksize"), SHAPES, ids=str)
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("nested", [False, True], ids=["plain", "nested"])
def test_fp32_tiles_route(dtype, quant_type, M, N, K, blocksize, bias, nested):
    rows = M if isinstance(M, tuple) else (M,)
    q, absmax, kw, expanded = weight(N, K, blocksize, quant_type, nested, seed=K + N)
    A = randn((*rows, K), dtype, seed=N, spread=False)
    b = randn((N,), dtype, seed=3, spread=False) if bias else None
    with setting("FAST_BF16_GEMM", False), setting("TILE_BYTES", 4 * K * 16):
        out = ops.gemm_4bit(A, q, [N, K], absmax, blocksize, quant_type, bias=b, **kw)
    ref = REFERENCE["gemm_4bit"](A, q, [N, K], absmax, blocksize, quant_type, bias=b, **kw)
    assert out.shape == ref.shape and out.dtype == dtype
    check_correctly_rounded(out, A, q, expanded, blocksize, quant_type, N, K, b)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_route_results_do_not_depend_on_the_thread_count(dtype):
    M, N, K, blocksize = 64, 300, 512, 64
    q, absmax, kw, _ = weight(N, K, blocksize, nested=True, seed=1)
    A = randn((M, K), dtype, seed=2, spread=False)
    b = randn((N,), dtype, seed=4, spread=False)
    outs = []
    with setting("FAST_BF16_GEMM", False), setting("TILE_BYTES", 4 * K * 48):
        for n in (1, 2, 3):
            with num_threads(n):
                outs.append(ops.gemm_4bit(A, q, [N, K], absmax, blocksize, "nf4", bias=b, **kw))
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


class Recorder:
    """Stands in for the extension module and records the tiles the route decodes."""

    def __init__(self):
        self.tiles = []

    def __getattr__(self, name):
        fn = getattr(_C, name)
        if name != "dequantize_4bit_tile_f32":
            return fn

        def wrapped(B, absmax, code, blocksize, i0, i1, rd, out, threads, *nested):
            self.tiles.append((i0, i1, out.data_ptr()))
            return fn(B, absmax, code, blocksize, i0, i1, rd, out, threads, *nested)

        return wrapped


@pytest.mark.parametrize("N", [1000, 5000])
def test_tiles_stay_within_tile_bytes_whatever_n(monkeypatch, N):
    M, K, blocksize = 40, 256, 64
    q, absmax, _, _ = weight(N, K, blocksize, seed=5)
    A = randn((M, K), torch.float32, seed=6, spread=False)
    rec = Recorder()
    monkeypatch.setattr(mm, "_C", rec)
    with setting("TILE_BYTES", 256 << 10):
        ops.gemm_4bit(A, q, [N, K], absmax, blocksize, "nf4")
    sizes = [i1 - i0 for i0, i1, _ in rec.tiles]
    assert rec.tiles[0][0] == 0 and rec.tiles[-1][1] == N * K
    ends, starts = [t[1] for t in rec.tiles[:-1]], [t[0] for t in rec.tiles[1:]]
    assert ends == starts, "tiles cover the weight once, in order"
    assert max(sizes) * 4 <= 256 << 10 and len(rec.tiles) == -(-N * K * 4 // (256 << 10))
    assert len({p for _, _, p in rec.tiles}) == 1, "one buffer, reused for every tile"


@pytest.mark.parametrize("fast", [False, True], ids=["fp32-tiles", "bf16-slabs"])
def test_bf16_routes_stay_within_the_conformance_tolerance(fast):
    M, N, K, blocksize = 48, 200, 192, 64
    q, absmax, kw, expanded = weight(N, K, blocksize, "fp4", nested=True, seed=8)
    A = randn((M, K), torch.bfloat16, seed=9, spread=False)
    with setting("FAST_BF16_GEMM", fast):
        out = ops.gemm_4bit(A, q, [N, K], absmax, blocksize, "fp4", **kw)
    ref = REFERENCE["gemm_4bit"](A, q, [N, K], absmax, blocksize, "fp4", **kw)
    W32 = REFERENCE["dequantize_4bit"](q, expanded, blocksize, "fp4", [N, K], torch.float32)
    assert ((out.double() - ref.double()).abs() <= matmul_tolerance(A, W32, ref)).all()


def test_fast_bf16_gemm_follows_the_cpu_feature_and_torchs_onednn_switch(monkeypatch):
    with setting("FAST_BF16_GEMM", None):
        hardware = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
        assert mm._fast_bf16_gemm() == (hardware and torch.backends.mkldnn.is_available())
        # oneDNN switched off by the user: torch's bf16 GEMM is then ~9x slower, the fp32 tiles take the rows.
        monkeypatch.setattr(mm, "bf16_gemm_hardware", lambda: True)
        with onednn_off():
            assert not mm._fast_bf16_gemm()
        assert mm._fast_bf16_gemm() == torch.backends.mkldnn.is_available()


def test_onednn_off_sends_bf16_rows_to_the_fp32_tiles(monkeypatch):
    N, K, blocksize = 40, 256, 64
    q, absmax, _, _ = weight(N, K, blocksize, seed=23)
    M = mm.BF16_TILE_MAX_ROWS + 1  # above every fused kernel's rows, whatever the route
    A = randn((M, K), torch.bfloat16, seed=24, spread=False)
    used = []

    class Spy(Recorder):
        def __getattr__(self, name):
            fn = getattr(_C, name)
            if name not in ("dequantize_4bit_tile_f32", "dequantize_4bit_range"):
                return fn
            return lambda *a, **k: (used.append(name), fn(*a, **k))[1]

    monkeypatch.setattr(mm, "_C", Spy())
    monkeypatch.setattr(mm, "bf16_gemm_hardware", lambda: True)
    with setting("FAST_BF16_GEMM", None), setting("AMX_BF16", None):
        with onednn_off():
            off = ops.gemm_4bit(A, q, [N, K], absmax, blocksize, "nf4")
        assert used and set(used) == {"dequantize_4bit_tile_f32"}, used
        with setting("FAST_BF16_GEMM", False):
            assert torch.equal(ops.gemm_4bit(A, q, [N, K], absmax, blocksize, "nf4"), off)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_linear4bit_training_gradients_come_from_the_dequantized_weight(dtype):
    torch.manual_seed(0)
    layer = bitsandbytes.nn.Linear4bit(128, 96, bias=True, compute_dtype=dtype, quant_type="nf4")
    layer = layer.to("cpu").to(dtype)  # the move quantizes the weight; the dtype moves only the bias
    x = randn((40, 128), dtype, seed=12, spread=False).requires_grad_(True)
    with torch.no_grad():
        eval_out = layer(x)
    out = layer(x)
    assert torch.equal(out, eval_out), "the training forward is the same kernel"
    g = randn(out.shape, dtype, seed=13, spread=False)
    out.backward(g)
    W = bitsandbytes.functional.dequantize_4bit(layer.weight.data, layer.weight.quant_state).to(dtype)
    assert torch.equal(x.grad, g @ W)
    assert torch.equal(layer.bias.grad, g.sum(0, dtype=layer.bias.dtype))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_unrounded_weights_are_caught(monkeypatch, dtype):
    """check_correctly_rounded can fail: the same route on the fp32 weights (not rounded to A's dtype)."""
    # Above every fused crossover, so the fp32 tiles run even where AVX512-BF16 keeps bf16 A up to
    # BF16_TILE_MAX_ROWS rows in the native kernel.
    M = max(mm.BF16_TILE_MAX_ROWS, mm.BF16_FUSED_MAX_ROWS_FP32_TILES, *mm.FUSED_MAX_ROWS.values()) + 8
    N, K, blocksize = 100, 256, 64
    q, absmax, _, expanded = weight(N, K, blocksize, seed=K + N)
    A = randn((M, K), dtype, seed=N, spread=False)

    class Unrounded(Recorder):
        def __getattr__(self, name):
            fn = getattr(_C, name)
            if name != "dequantize_4bit_tile_f32":
                return fn
            return lambda B, am, code, bs, i0, i1, rd, out, *rest: fn(B, am, code, bs, i0, i1, "float32", out, *rest)

    monkeypatch.setattr(mm, "_C", Unrounded())
    with setting("FAST_BF16_GEMM", False):
        out = ops.gemm_4bit(A, q, [N, K], absmax, blocksize, "nf4")
    with pytest.raises(AssertionError):
        check_correctly_rounded(out, A, q, expanded, blocksize, "nf4", N, K, None)


@pytest.mark.parametrize(
    ("fast", "amx", "dtype"),
    [
        (False, False, torch.bfloat16),
        (True, False, torch.bfloat16),
        (True, True, torch.bfloat16),
        (False, False, torch.float32),
    ],
)
def test_rows_above_the_crossover_take_the_gemm_route(monkeypatch, fast, amx, dtype):
    """The crossover of bf16 A follows the route above it (BF16_FUSED_MAX_ROWS_FP32_TILES on the fp32 tiles,
    AMX_BF16_FUSED_MAX_ROWS where torch's bf16 GEMM runs on AMX, with no register-blocked GEMM between)."""
    N, K, blocksize = 40, 256, 64
    q, absmax, _, _ = weight(N, K, blocksize, seed=14)
    used = []

    class Spy(Recorder):
        def __getattr__(self, name):
            fn = getattr(_C, name)
            if name not in ("gemv_4bit", "dequantize_4bit_tile_f32", "dequantize_4bit_range"):
                return fn
            return lambda *a, **k: (used.append(name), fn(*a, **k))[1]

    monkeypatch.setattr(mm, "_C", Spy())
    with setting("FAST_BF16_GEMM", fast), setting("AMX_BF16", amx):
        if amx:
            limit = mm.AMX_BF16_FUSED_MAX_ROWS
        elif dtype == torch.bfloat16 and not fast:
            limit = mm.BF16_FUSED_MAX_ROWS_FP32_TILES
        else:
            limit = mm.FUSED_MAX_ROWS[dtype]
        gemm = "dequantize_4bit_range" if fast and dtype == torch.bfloat16 else "dequantize_4bit_tile_f32"
        for M, expected in ((limit, "gemv_4bit"), (limit + 1, gemm)):
            used.clear()
            A = randn((M, K), dtype, seed=M, spread=False)
            ops.gemm_4bit(A, q, [N, K], absmax, blocksize, "nf4")
            tiles = not amx and M <= mm.BF16_TILE_MAX_ROWS and mm._bf16_tiles(K, blocksize)
            if dtype == torch.bfloat16 and tiles:
                expected = "gemv_4bit"  # the register-blocked AVX512-BF16 GEMM takes these rows
            assert expected in used and set(used) <= {expected, "gemv_4bit_bf16_dot"}, (M, used)


def test_amx_follows_the_cpu_feature_and_yields_to_fast_bf16_gemm_off():
    with setting("AMX_BF16", None):
        assert mm._amx_bf16() == torch.cpu._is_amx_tile_supported()
    # FAST_BF16_GEMM off means no bf16 GEMM of torch's at all, AMX or not: the fp32 tiles run.
    N, K, M = 40, 256, mm.AMX_BF16_FUSED_MAX_ROWS + 1
    q, absmax, _, _ = weight(N, K, 64, seed=21)
    A = randn((M, K), torch.bfloat16, seed=22, spread=False)
    with setting("FAST_BF16_GEMM", False), setting("AMX_BF16", True):
        fp32_tiles = ops.gemm_4bit(A, q, [N, K], absmax, 64, "nf4")
    with setting("FAST_BF16_GEMM", False), setting("AMX_BF16", False):
        assert torch.equal(ops.gemm_4bit(A, q, [N, K], absmax, 64, "nf4"), fp32_tiles)


@pytest.mark.parametrize("M", [13, 64, 300])
def test_amx_route_in_large_slabs_stays_within_the_conformance_tolerance(M):
    """The AMX route's slabs (AMX_SLAB_BYTES, here shrunk so that N spans several): the reference's bf16
    weights into torch's bf16 GEMM, nested scales, bias, any thread count bit-identical."""
    N, K, blocksize = 300, 256, 64
    q, absmax, kw, expanded = weight(N, K, blocksize, "nf4", nested=True, seed=M)
    A = randn((M, K), torch.bfloat16, seed=M + 1, spread=False)
    bias = randn((N,), torch.bfloat16, seed=M + 2, spread=False)
    outs = []
    with setting("FAST_BF16_GEMM", True), setting("AMX_BF16", True), setting("AMX_SLAB_BYTES", 128 * K * 2):
        for n in (1, 2):
            with num_threads(n):
                mm._LOCAL.slab = None
                outs.append(ops.gemm_4bit(A, q, [N, K], absmax, blocksize, "nf4", bias=bias, **kw))
    assert torch.equal(outs[0], outs[1])
    ref = REFERENCE["gemm_4bit"](A, q, [N, K], absmax, blocksize, "nf4", bias=bias, **kw)
    W32 = REFERENCE["dequantize_4bit"](q, expanded, blocksize, "nf4", [N, K], torch.float32)
    tol = matmul_tolerance(A, W32, ref) + 2 * torch.finfo(torch.bfloat16).eps * bias.double().abs()
    assert ((outs[0].double() - ref.double()).abs() <= tol).all()


def test_compiled_linear4bit_on_the_gemm_route_equals_eager():
    """Inductor sees gemm_4bit as one opaque op: compiled and eager forwards are the same bits."""
    torch.manual_seed(1)
    layer = bitsandbytes.nn.Linear4bit(128, 96, bias=True, compute_dtype=torch.bfloat16, quant_type="fp4")
    layer = layer.to("cpu").to(torch.bfloat16)
    x = randn((2, 20, 128), torch.bfloat16, seed=15, spread=False)
    with setting("FAST_BF16_GEMM", False), torch.no_grad():
        eager = layer(x)
        compiled = torch.compile(layer, fullgraph=True)(x)
    assert torch.equal(compiled, eager)
