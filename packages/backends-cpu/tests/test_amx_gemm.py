"""gemm_4bit for bf16 A on AMX tiles (kernels/matmul_4bit_amx.cpp), the route of bf16 rows from
AMX_GEMM_MIN_ROWS on where the CPU and the OS allow it.

The claims tested: the probe agrees with torch's own AMX check and says why not where it cannot run; the
result is the reference's weights (bf16(code * absmax), nested scales included) times bf16 A summed in
fp32 and rounded once, correctly rounded but for the rare sums near a rounding midpoint, across tails of
every tile dimension and the kernel's passes over rows and over k; the thread count and the batch a row
is in change no bit; a thread's tile configuration is as it was after our kernel ran on it, and torch's
AMX ops around ours give the same bits; bad arguments are refused before any tile is touched.
"""

from __future__ import annotations

import multiprocessing
import platform
import sys

import pytest
import torch
import torch.nn.functional as F
from native_helpers import isa, num_threads
from test_gemm_route import check_correctly_rounded, setting, weight

import bitsandbytes
from bitsandbytes import _formats
from bitsandbytes._reference import REFERENCE
from bitsandbytes.testing.cases import randn
from bitsandbytes_cpu import _C
from bitsandbytes_cpu.ops import matmul_4bit as mm

ops = torch.ops.bitsandbytes
WHY_NOT = _C.amx_bf16_unavailable()
needs_amx = pytest.mark.skipif(
    WHY_NOT != "", reason=f"needs AMX-BF16 tiles (Intel Xeon 4th generation or later) on Linux: {WHY_NOT}"
)


def test_probe_agrees_with_torch():
    """torch asks the CPU and Linux the same questions (CPUID, arch_prctl) for oneDNN's AMX kernels."""
    torch_has_amx = sys.platform == "linux" and torch.cpu._is_amx_tile_supported() and _C.isa() == "avx512"
    assert (WHY_NOT == "") == torch_has_amx, WHY_NOT
    x86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")
    expected = "the AMX kernel runs at the avx512 level only" if x86 else "AMX tiles are an x86-64 feature"
    for level in _C.supported_isas():
        if level != "avx512":
            with isa(level):
                assert _C.amx_bf16_unavailable() == expected
                assert not mm._amx_gemm(4096, 64)


def test_route_needs_whole_64_groups_and_the_probe(monkeypatch):
    assert not mm._amx_gemm(4096 + 32, 64) and not mm._amx_gemm(4096, 32)
    with setting("AMX_GEMM", False):
        assert not mm._amx_gemm(4096, 64)

    class Unavailable:
        def __getattr__(self, name):
            return (lambda: "no AMX here") if name == "amx_bf16_unavailable" else getattr(_C, name)

    monkeypatch.setattr(mm, "_C", Unavailable())
    assert not mm._amx_gemm(4096, 64)
    # ...and the rows still get the right answer from the routes of CPUs without AMX.
    q, absmax, _, expanded = weight(40, 128, 64, seed=3)
    A = randn((8, 128), torch.bfloat16, seed=4, spread=False)
    out = ops.gemm_4bit(A, q, [40, 128], absmax, 64, "nf4")
    check_correctly_rounded(out, A, q, expanded, 64, "nf4", 40, 128, None)


def amx_calls(monkeypatch):
    calls = []
    real = _C.gemm_4bit_amx_bf16

    class Spy:
        def __getattr__(self, name):
            if name != "gemm_4bit_amx_bf16":
                return getattr(_C, name)
            return lambda *a, **k: (calls.append(a[2]), real(*a, **k))[1]

    monkeypatch.setattr(mm, "_C", Spy())
    return calls


# (M, N, K, blocksize): x tiles of 16 rows with tails (M % 16) and an odd tile count (the one-tile step),
# weight panels of 32 rows with tails (N % 32, N % 16), k slices with a tail (K % 256), several passes over
# the rows (M > 128) and over k (M = 300 at K = 4160: passes of 4096 values; one pair of x tiles at K =
# 16448: passes of 16384, the C tiles kept in registers within a pass), blocks of a row and more, 3-D A.
SHAPES = [
    (3, 1, 64, 64),
    (16, 32, 128, 64),
    (17, 33, 192, 128),
    (40, 100, 256, 64),
    (33, 45, 64, 4096),
    (300, 40, 4160, 64),
    (20, 40, 16448, 128),
    (130, 70, 512, 256),
    ((2, 9), 50, 320, 64),
]


@needs_amx
@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
@pytest.mark.parametrize(("M", "N", "K", "blocksize"), SHAPES, ids=str)
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("nested", [False, True], ids=["plain", "nested"])
def test_amx_gemm_is_the_correctly_rounded_product(monkeypatch, quant_type, M, N, K, blocksize, bias, nested):
    rows = M if isinstance(M, tuple) else (M,)
    q, absmax, kw, expanded = weight(N, K, blocksize, quant_type, nested, seed=K + N)
    A = randn((*rows, K), torch.bfloat16, seed=N, spread=False)
    b = randn((N,), torch.bfloat16, seed=3, spread=False) if bias else None
    calls = amx_calls(monkeypatch)
    out = ops.gemm_4bit(A, q, [N, K], absmax, blocksize, quant_type, bias=b, **kw)
    assert calls, "the AMX kernel took these rows"
    ref = REFERENCE["gemm_4bit"](A, q, [N, K], absmax, blocksize, quant_type, bias=b, **kw)
    assert out.shape == ref.shape and out.dtype == torch.bfloat16
    check_correctly_rounded(out, A, q, expanded, blocksize, quant_type, N, K, b)


@needs_amx
def test_many_rows_run_in_blocks_of_bounded_workspace(monkeypatch):
    """Rows beyond AMX_WORK_BYTES of laid-out x go through the kernel in blocks (multiples of 128 rows), each
    with the same workspace: the same bits as one call, and the workspace kept does not grow with M."""
    M, N, K = 700, 40, 256
    q, absmax, kw, _ = weight(N, K, 64, nested=True, seed=16)
    A = randn((M, K), torch.bfloat16, seed=17, spread=False)
    whole = ops.gemm_4bit(A, q, [N, K], absmax, 64, "nf4", **kw)
    calls = amx_calls(monkeypatch)
    monkeypatch.setattr(mm, "AMX_WORK_BYTES", 256 * K * 2)
    mm._LOCAL.slab = None
    blocks = ops.gemm_4bit(A, q, [N, K], absmax, 64, "nf4", **kw)
    assert calls == [256, 256, 188] and torch.equal(blocks, whole)
    assert mm._LOCAL.slab.numel() <= max(mm.SLAB_BYTES, _C.amx_workspace_bytes(256, K))


@needs_amx
def test_a_weight_not_rounded_as_the_reference_is_caught():
    """check_correctly_rounded can fail here: the same kernel on the fp32 scales times 1.001 (each weight
    bf16(code * absmax * 1.001), most of them a different bf16 value)."""
    N, K = 64, 256
    q, absmax, _, expanded = weight(N, K, 64, seed=5)
    A = randn((40, K), torch.bfloat16, seed=6, spread=False)
    out = ops.gemm_4bit(A, q, [N, K], absmax * 1.001, 64, "nf4")
    with pytest.raises(AssertionError):
        check_correctly_rounded(out, A, q, expanded, 64, "nf4", N, K, None)


@needs_amx
def test_threads_and_batch_change_no_bit():
    M, N, K = 300, 70, 4160
    q, absmax, kw, _ = weight(N, K, 64, nested=True, seed=7)
    A = randn((M, K), torch.bfloat16, seed=8, spread=False)
    b = randn((N,), torch.bfloat16, seed=9, spread=False)
    outs = []
    for n in (1, 2, 3):
        with num_threads(n):
            outs.append(ops.gemm_4bit(A, q, [N, K], absmax, 64, "nf4", bias=b, **kw))
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])
    # A row's sums do not depend on the rows beside it (tile, pass or padding).
    for lo, hi in ((0, 3), (5, 21), (250, 300)):
        assert torch.equal(ops.gemm_4bit(A[lo:hi], q, [N, K], absmax, 64, "nf4", bias=b, **kw), outs[0][lo:hi])


def tile_config(palette: int, shapes: list[tuple[int, int]]) -> bytes:
    """A 64-byte AMX tile configuration: palette, then bytes per row and rows of each tile."""
    colsb = b"".join(c.to_bytes(2, "little") for c, _ in shapes).ljust(32, b"\0")
    return bytes([palette, 0]) + bytes(14) + colsb + bytes(r for _, r in shapes).ljust(16, b"\0")


@needs_amx
def test_the_threads_tile_configuration_is_put_back():
    """A thread's configuration is as it was after our kernel ran on it (threads=1: on the caller): code
    that keeps one loaded between its calls (torch's cpublas brgemm does until brgemm_release) must not
    find ours; a thread that had none has none again."""
    N, K, M = 64, 256, 20
    q, absmax, _, _ = weight(N, K, 64, seed=13)
    A = randn((M, K), torch.bfloat16, seed=14, spread=False)
    table = _formats.code_table("nf4", "cpu").float()
    out = torch.empty(M, N, dtype=torch.bfloat16)
    work = torch.empty(_C.amx_workspace_bytes(M, K), dtype=torch.uint8)
    qb = q.view(torch.uint8).reshape(-1)
    theirs = tile_config(1, [(32, 8), (64, 16), (16, 4)])
    none = bytes(64)
    before = _C.amx_tile_config(theirs)
    try:
        for expected in (theirs, none):
            _C.amx_tile_config(expected)
            _C.gemm_4bit_amx_bf16(A, qb, M, N, K, absmax, table, 64, None, out, work, 1)
            assert _C.amx_tile_config() == expected
    finally:
        _C.amx_tile_config(before)
    ref = REFERENCE["gemm_4bit"](A, q, [N, K], absmax, 64, "nf4")
    assert (out.float() - ref.float()).abs().max() <= 0.05 * ref.float().abs().max()


@needs_amx
def test_torchs_amx_ops_around_ours_give_the_same_bits():
    """torch's bf16 SDPA (cpublas brgemm on AMX) and F.linear (oneDNN) before and after calls of ours."""
    torch.manual_seed(0)
    q_, k_, v_ = (torch.randn(2, 4, 128, 64, dtype=torch.bfloat16) for _ in range(3))
    x, w = torch.randn(64, 512, dtype=torch.bfloat16), torch.randn(256, 512, dtype=torch.bfloat16)
    qw, absmax, _, _ = weight(256, 512, 64, seed=10)
    A = randn((64, 512), torch.bfloat16, seed=11, spread=False)
    for n in (1, 2):
        with num_threads(n):
            attn, lin = F.scaled_dot_product_attention(q_, k_, v_), F.linear(x, w)
            ours = ops.gemm_4bit(A, qw, [256, 512], absmax, 64, "nf4")
            for _ in range(3):
                assert torch.equal(F.scaled_dot_product_attention(q_, k_, v_), attn)
                assert torch.equal(ops.gemm_4bit(A, qw, [256, 512], absmax, 64, "nf4"), ours)
                assert torch.equal(F.linear(x, w), lin)


@needs_amx
def test_bad_arguments_are_refused():
    M, N, K = 4, 32, 128
    q, absmax, _, _ = weight(N, K, 64, seed=12)
    qb = q.view(torch.uint8).reshape(-1)
    table = _formats.code_table("nf4", "cpu").float()
    A = torch.zeros(M, K, dtype=torch.bfloat16)
    out = torch.empty(M, N, dtype=torch.bfloat16)
    work = torch.empty(_C.amx_workspace_bytes(M, K), dtype=torch.uint8)

    def call(**change):
        args = dict(A=A, B=qb, M=M, N=N, K=K, absmax=absmax, code=table, blocksize=64, bias=None, out=out)
        args.update(work=work, threads=1)
        args.update(change)
        _C.gemm_4bit_amx_bf16(**args)

    call()
    with pytest.raises(ValueError, match="K must be a multiple of 64"):
        call(K=96)
    with pytest.raises(ValueError, match="blocksize must be >= 64"):
        call(blocksize=32)
    with pytest.raises(ValueError, match="work must have at least"):
        call(work=work[:-1])
    with pytest.raises(ValueError, match="A: dtype mismatch"):
        call(A=A.float())
    with pytest.raises(ValueError, match="out must be contiguous"):
        call(out=torch.empty(N, M, dtype=torch.bfloat16).t())
    with pytest.raises(ValueError, match="B must have at least"):
        call(B=qb[:-1])
    with pytest.raises(ValueError, match="absmax must have at least"):
        call(absmax=absmax[:-1])
    with pytest.raises(ValueError, match="M, N and K must be >= 0"):
        call(M=-1)


@needs_amx
def test_compiled_linear4bit_on_the_amx_kernel_equals_eager(monkeypatch):
    """Inductor sees gemm_4bit as one opaque op: compiled and eager forwards take our kernel, the same bits."""
    torch.manual_seed(1)
    layer = bitsandbytes.nn.Linear4bit(128, 96, bias=True, compute_dtype=torch.bfloat16, quant_type="nf4")
    layer = layer.to("cpu").to(torch.bfloat16)
    x = randn((2, 20, 128), torch.bfloat16, seed=15, spread=False)
    calls = amx_calls(monkeypatch)
    with torch.no_grad():
        eager = layer(x)
        compiled = torch.compile(layer, fullgraph=True)(x)
    assert len(calls) >= 2 and torch.equal(compiled, eager)


def _forked_child(queue, A, q, absmax, expected) -> None:
    # torch's OpenMP team cannot run in a forked child; ours runs on its pool there, 2 threads.
    torch.set_num_threads(1)
    out = torch.empty(expected.shape, dtype=torch.bfloat16)
    work = torch.empty(_C.amx_workspace_bytes(A.shape[0], A.shape[1]), dtype=torch.uint8)
    table = _formats.code_table("nf4", "cpu").float()
    qb = q.view(torch.uint8).reshape(-1)
    _C.gemm_4bit_amx_bf16(A, qb, A.shape[0], out.shape[1], A.shape[1], absmax, table, 64, None, out, work, 2)
    queue.put(bool(torch.equal(out, expected)))


@needs_amx
def test_a_forked_child_keeps_the_permission_and_the_bits():
    """Linux hands the tile-data permission (arch_prctl) down to a forked child, as DataLoader workers are:
    the kernel runs there (a tile instruction without it would be SIGILL) and gives the same bits."""
    N, K, M = 64, 512, 40
    q, absmax, _, _ = weight(N, K, 64, seed=18)
    A = randn((M, K), torch.bfloat16, seed=19, spread=False)
    with num_threads(2):
        expected = ops.gemm_4bit(A, q, [N, K], absmax, 64, "nf4")
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_forked_child, args=(queue, A, q, absmax, expected))
    child.start()
    child.join(timeout=120)
    if child.exitcode is None:
        child.kill()
    assert child.exitcode == 0 and queue.get(timeout=5) is True
