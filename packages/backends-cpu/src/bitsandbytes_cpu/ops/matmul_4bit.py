"""gemv_4bit / gemm_4bit on the cpu, on the standard packed 4-bit layout (no repacking).

Few rows of A: a fused kernel decodes each weight once (16-entry table scaled per block, looked up 16 or
32 codes at a time) and multiplies it into every row with fp32 accumulation (AVX512-BF16 dot products
for bf16 A where the CPU has them; for bf16 up to BF16_TILE_MAX_ROWS rows, a register-blocked GEMM on
weight tiles decoded on the fly). Many rows: the weight is decoded one tile of output features at a
time into a reused buffer still in cache when torch's GEMM (oneDNN / MKL) reads it: fp32 values
rounded as the reference rounds the weight for A's dtype, multiplied in fp32 (the reference's own
arithmetic but for the order of the sums), or bf16 slabs and torch's bf16 GEMM for bf16 A where that
GEMM is fast (_fast_bf16_gemm). The crossover is a row count measured per dtype (FUSED_MAX_ROWS).
Where the CPU has AMX, bf16 A from AMX_GEMM_MIN_ROWS rows takes our own GEMM on AMX tiles instead, which
decodes the weight into the tiles as it multiplies (kernels/matmul_4bit_amx.cpp)."""

from __future__ import annotations

import threading

import torch

from bitsandbytes import _formats
from bitsandbytes._ops import check_gemm_4bit
from bitsandbytes.backends import kit

from ._capsules import native as _C
from ._features import amx_tiles, bf16_gemm_hardware, onednn_enabled
from ._threads import threads

# Rows of A up to which the fused kernel is used; above it, dequantize + torch GEMM. Measured on
# AVX-512 (+BF16): the fused kernel's cost grows linearly in rows, torch's GEMM stays nearly flat, and
# they cross between 8 and 16 rows for bf16, around 16 for fp32 and fp16.
FUSED_MAX_ROWS = {torch.bfloat16: 8, torch.float32: 16, torch.float16: 16}
# bf16 A on AVX512-BF16: above FUSED_MAX_ROWS and up to this many rows, the native kernel's register-blocked
# GEMM (weights decoded tile by tile into registers' worth of bf16, never a dequantized slab) beats
# dequantize + torch GEMM (measured on Zen 4: 1.5x at 32 rows, even at 64, slower from 128 on).
BF16_TILE_MAX_ROWS = 64
# bf16 A where the many-row route is the fp32 tiles (no fast bf16 GEMM): rows up to which the fused kernel
# is used instead. Measured on Zen 3 (AVX2, 2 threads, 4096 x 4096, the machine oversubscribed, load ~10):
# fused 40 ms against tiles 236 at 16 rows; from 32 rows the tiles beat dense bf16 on a quiet machine
# (torch's fp32 GEMM 23 ms there against its bf16 54, the fused kernel 76).
BF16_FUSED_MAX_ROWS_FP32_TILES = 16
# dtype the GEMM route multiplies in: fp32 for every A (see _fp32_tiles_into), except bf16 A where
# torch's bf16 GEMM is fast (FAST_BF16_GEMM).
GEMM_DTYPE = {torch.bfloat16: torch.float32, torch.float32: torch.float32, torch.float16: torch.float32}
# Bytes of fp32 weight per tile on the fp32 route (the buffer, reused, whatever N): within the last-level
# cache (32 MiB on the Zen 3 measured) when the GEMM reads it, and few GEMM calls per weight: each call
# ends at an OpenMP barrier, which on an oversubscribed machine waits a scheduler time slice (measured
# there at M = 32, 4096 x 4096, 2 threads: 4 MiB tiles 455 ms, 8 MiB 270, 16 MiB 224, one fp32 F.linear 166).
TILE_BYTES = 16 << 20
# Bytes of bf16 weight per slab on the bf16 route (measured on AVX-512: 2-4 MiB best).
SLAB_BYTES = 4 << 20
# Whether bf16 A takes torch's bf16 GEMM (bf16 slabs) rather than the fp32 tiles; None: by CPU feature
# (_fast_bf16_gemm). Tests set it to run either route here.
FAST_BF16_GEMM: bool | None = None
# bf16 A where torch's bf16 GEMM runs on AMX tiles (oneDNN): from this many rows on, bf16 slabs into it beat
# both native kernels, and the slabs are larger. Measured on an AMX Xeon (2 threads, 4096 x 4096, nf4; medians,
# ms): the fused kernel 1.89 / 2.38 / 2.88 at 8 / 12 / 16 rows against slabs 2.58 / 2.65 / 2.74; at 32 rows
# slabs 2.7 against the register-blocked AVX512-BF16 GEMM's 5.3, at 512 rows 9.0 against 17.4; slabs of
# 4 / 8 / 16 / 32 MiB: 3.5 / 3.1 / 2.7 / 2.7 ms at 32 rows, 17.7 / 9.3 / 9.0 / 9.0 at 512 (oneDNN is slow on
# 512-feature calls there). Dense bf16 F.linear in the same runs: 1.3 and 8.1 ms.
AMX_BF16_FUSED_MAX_ROWS = 12
AMX_SLAB_BYTES = 16 << 20
# Whether bf16 A takes the AMX routing above; None: by CPU feature (amx_tiles). Tests set it: the route is
# torch's bf16 GEMM on bf16 slabs, correct on every CPU, only its speed needs AMX.
AMX_BF16: bool | None = None
# bf16 A from this many rows on: our own GEMM on AMX tiles (matmul_4bit_amx.cpp), which decodes the 4-bit
# weight into the tiles as it multiplies, where the CPU and the OS allow it (_C.amx_bf16_unavailable()). It
# reads a quarter of dense bf16's bytes and needs no dequantized slab. Measured on an AMX Xeon (2 threads,
# [M, 4096] x [4096, 4096], ms): 2 rows 0.90 against the fused kernel's 0.85, 3 rows 0.93 against 1.03,
# 8 rows 0.70 against 2.2, 512 rows 9.5 against the slabs' 12.8 (dense bf16 9.7); docs/pages/cpu.md.
AMX_GEMM_MIN_ROWS = 3
# False turns the kernel above off (tests compare it with the other routes); None: wherever it runs.
AMX_GEMM: bool | None = None
# Bytes of A (as the kernel lays it out) per call of the AMX kernel; more rows are taken in blocks.
AMX_WORK_BYTES = 16 << 20


def _fast_bf16_gemm() -> bool:
    """Without AVX512-BF16 (or AMX) torch's CPU bf16 GEMM converts to fp32 inside its kernel and runs at
    a fraction of its fp32 GEMM (AVX2 Zen 3, 2 threads, [M, 4096] x [4096, 4096]: 20 GFLOP/s against 46
    at M = 32 and 100 at M = 512), so the fp32 tiles win there. With them its bf16 GEMM does two
    multiply-adds per fp32 lane (vdpbf16ps) or tiles (AMX) and reads half the bytes: the bf16 slabs,
    the route measured on Zen 4 when FUSED_MAX_ROWS and BF16_TILE_MAX_ROWS were set, stay there."""
    if FAST_BF16_GEMM is not None:
        return FAST_BF16_GEMM
    # oneDNN off (a user's switch): torch's bf16 GEMM is about 9x slower, and the fp32 tiles take the rows.
    return bf16_gemm_hardware() and onednn_enabled()


def _amx_bf16() -> bool:
    return amx_tiles() if AMX_BF16 is None else AMX_BF16


_TABLES: dict[str, torch.Tensor] = {}
# One slab buffer per Python thread (kernels release the GIL, so threads must not share it), kept between
# calls: a fresh multi-MiB allocation is fresh pages from the OS, and their first-touch faults cost
# about as much as dequantizing into them.
_LOCAL = threading.local()


def _slab_buffer(numel: int, dtype: torch.dtype, slab_bytes: int | None = None) -> torch.Tensor:
    buf = getattr(_LOCAL, "slab", None)
    nbytes = numel * dtype.itemsize
    if buf is None or buf.numel() < nbytes:
        buf = _LOCAL.slab = torch.empty(
            max(nbytes, SLAB_BYTES if slab_bytes is None else slab_bytes), dtype=torch.uint8
        )
    return buf[:nbytes].view(dtype)


def _table(quant_type: str) -> torch.Tensor:
    t = _TABLES.get(quant_type)
    if t is None:
        t = _TABLES[quant_type] = _formats.code_table(quant_type, "cpu").float().contiguous()
    return t


def _bytes(B: torch.Tensor) -> torch.Tensor:
    """The packed codes as a flat uint8 tensor, whatever quant_storage holds them (no copy if contiguous)."""
    return B.contiguous().reshape(-1).view(torch.uint8)


def _amx_gemm(K: int, blocksize: int) -> bool:
    """Whether bf16 A of this shape takes our AMX kernel: it reads 64 values of k per step (so K % 64 == 0
    and blocks of at least 64), and runs where the probe found AMX usable (CPU, Linux permission, a self-test)."""
    if AMX_GEMM is False or K % 64 or blocksize < 64:
        return False
    return _C.amx_bf16_unavailable() == ""


def _bf16_tiles(K: int, blocksize: int) -> bool:
    """Whether the native kernel's register-blocked AVX512-BF16 GEMM takes bf16 A of any row count."""
    return K % 64 == 0 and blocksize >= 64 and _C.gemv_4bit_bf16_dot()


def _matmul_into(A, B, N, K, absmax, code, blocksize, bias, out, nested=None) -> None:
    """out[..., N] = A[..., K] @ W.T (+ bias) in A.dtype, fp32 accumulation. ``nested``: the double
    quantization's (absmax_8bit, absmax_code, absmax_offset), absmax then being its absmax2."""
    M = A.numel() // K if K else out.numel() // max(N, 1)
    if M == 0 or N == 0:
        return
    if K == 0:
        out.copy_(bias.expand_as(out) if bias is not None else torch.zeros_like(out))
        return
    A = A.contiguous()
    Bb = _bytes(B)
    absmax = absmax.contiguous()
    bias = bias.contiguous() if bias is not None else None
    bf16 = A.dtype == torch.bfloat16
    if bf16 and M >= AMX_GEMM_MIN_ROWS and _amx_gemm(K, blocksize):
        _amx_into(A.reshape(M, K), Bb, N, K, absmax, code, blocksize, bias, out.view(M, N), nested)
        return
    fast_bf16 = bf16 and _fast_bf16_gemm()
    amx = fast_bf16 and _amx_bf16()
    fused_max = FUSED_MAX_ROWS.get(A.dtype, 8)
    if amx:
        fused_max = AMX_BF16_FUSED_MAX_ROWS
    elif bf16 and not fast_bf16:
        fused_max = BF16_FUSED_MAX_ROWS_FP32_TILES
    if M <= fused_max or (bf16 and not amx and M <= BF16_TILE_MAX_ROWS and _bf16_tiles(K, blocksize)):
        # Nested scales are expanded inside the kernel as its rows read them (no separate pass).
        _C.gemv_4bit(A, Bb, M, N, K, absmax, code, blocksize, bias, out, threads(), *(nested or ()))
        return
    if fast_bf16:
        slab_bytes = AMX_SLAB_BYTES if amx else SLAB_BYTES
        _bf16_slabs_into(A, Bb, M, N, K, absmax, code, blocksize, bias, out, nested, slab_bytes)
    else:
        _fp32_tiles_into(A, Bb, M, N, K, absmax, code, blocksize, bias, out, nested)


def _amx_into(A2, Bb, N, K, absmax, code, blocksize, bias, out2, nested) -> None:
    """Our AMX kernel on row blocks whose x, laid out as tiles (the kernel's workspace, kept per thread), takes
    at most AMX_WORK_BYTES: a row's sums do not depend on the rows beside it, and the kernel decodes the
    weight once per 128 rows anyway, so the blocks cost nothing and the memory kept stays bounded."""
    M = A2.shape[0]
    rows = max(128, AMX_WORK_BYTES // (2 * K) // 128 * 128)
    work = _slab_buffer(_C.amx_workspace_bytes(min(M, rows), K), torch.uint8)
    for m0 in range(0, M, rows):
        m1 = min(M, m0 + rows)
        _C.gemm_4bit_amx_bf16(
            A2[m0:m1], Bb, m1 - m0, N, K, absmax, code, blocksize, bias, out2[m0:m1], work, threads(), *(nested or ())
        )


def _fp32_tiles_into(A, Bb, M, N, K, absmax, code, blocksize, bias, out, nested) -> None:
    """The reference's product (A and W rounded to A's dtype, fp32 products and sums, + bias in fp32,
    one rounding) on torch's fp32 GEMM, one tile of output features at a time: the tile's weights are
    decoded to fp32 already rounded to A's dtype, so only the order of the fp32 sums differs. The tile
    buffer (TILE_BYTES, reused) and a [M, tile] fp32 result are all the memory it takes beside A in fp32."""
    rows = min(N, max(16, TILE_BYTES // (4 * K)))
    W = _slab_buffer(rows * K, torch.float32)
    A32 = A.reshape(M, K).float()
    bias32 = None if bias is None else bias.float()
    res = torch.empty(M * rows, dtype=torch.float32)
    out2 = out.view(M, N)
    rd = str(A.dtype).removeprefix("torch.")
    for n0 in range(0, N, rows):
        n1 = min(N, n0 + rows)
        Wt = W[: (n1 - n0) * K]
        _C.dequantize_4bit_tile_f32(Bb, absmax, code, blocksize, n0 * K, n1 * K, rd, Wt, threads(), *(nested or ()))
        r = torch.mm(A32, Wt.view(n1 - n0, K).t(), out=res[: M * (n1 - n0)].view(M, n1 - n0))
        # Written straight into out's columns: the bias sum (fp32) and the cast to A's dtype in one pass.
        if bias32 is None:
            out2[:, n0:n1].copy_(r)
        else:
            torch.add(r, bias32[n0:n1], out=out2[:, n0:n1])


def _bf16_slabs_into(A, Bb, M, N, K, absmax, code, blocksize, bias, out, nested, slab_bytes) -> None:
    """bf16 A where torch's bf16 GEMM is fast: bf16 slabs of the weight into torch's bf16 GEMM."""
    if nested is not None:
        absmax = _effective_absmax(absmax, *nested)
    A2 = A.reshape(M, K)
    out2 = out.view(M, N)
    slab = min(N, max(64, slab_bytes // (K * 2)))
    W = _slab_buffer(slab * K, torch.bfloat16, slab_bytes).view(slab, K)
    for n0 in range(0, N, slab):
        n1 = min(N, n0 + slab)
        Wt = W[: n1 - n0]
        _C.dequantize_4bit_range(Bb, absmax, code, blocksize, n0 * K, n1 * K, Wt, threads())
        out2[:, n0:n1] = torch.nn.functional.linear(A2, Wt, None if bias is None else bias[n0:n1])


def _gemv_into(A, B, shapeB, absmax, code, blocksize, out) -> None:
    N, K = shapeB
    _matmul_into(A, B, N, K, absmax, code.contiguous(), blocksize, None, out)


_GEMV = kit.out_pair("gemv_4bit", _gemv_into)
gemv_4bit, gemv_4bit_out = _GEMV.values()


def _effective_absmax(absmax, absmax_8bit, absmax_code, absmax_offset) -> torch.Tensor:
    """Double-quantized block scales back to fp32, exactly as the reference computes them."""
    if absmax_8bit is None:
        return absmax
    out = torch.empty(absmax_8bit.numel(), dtype=torch.float32)
    if out.numel():
        _C.expand_nested_absmax(
            absmax_8bit.contiguous().reshape(-1),
            absmax.contiguous(),
            absmax_code.contiguous(),
            absmax_offset.float().contiguous(),  # the contract allows fp16/bf16; the kernel reads fp32
            out,
            threads(),
        )
    return out


def gemm_4bit(
    A, B, shapeB, absmax, blocksize, quant_type, bias=None, absmax_8bit=None, absmax_code=None, absmax_offset=None
) -> torch.Tensor:
    N, K = check_gemm_4bit(A, B, shapeB, absmax, blocksize, quant_type, bias, absmax_8bit, absmax_code, absmax_offset)
    nested = None
    if absmax_8bit is not None:
        nested = (
            absmax_8bit.contiguous().reshape(-1),
            absmax_code.contiguous(),
            absmax_offset.float().contiguous().reshape(-1),  # the contract allows fp16/bf16; the kernel reads fp32
        )
    out = torch.empty((*A.shape[:-1], N), dtype=A.dtype)
    _matmul_into(A, B, N, K, absmax, _table(quant_type), blocksize, bias, out, nested)
    return out


OPS = {**_GEMV, "gemm_4bit": gemm_4bit}
