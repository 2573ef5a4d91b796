"""gemv_4bit / gemm_4bit for device cuda, on the standard packed 4-bit layout (no repacking).

Three routes by the rows of A (``matmul_route``):
- ``gemv``: up to 8 rows (decoding), and up to ``fused_max_rows(device)`` where the tensor-core kernel
  does not apply (fp32 A, no tensor cores for the dtype, K % 32 != 0, unaligned A or B): the fused SIMT
  kernel, specialized on the tile of rows (1, 2, 4 or 8 rows of A per block; more rows are more tiles,
  whose blocks are adjacent in the grid so that the weight comes from DRAM once and from L2 for the
  other tiles), fp32 FMAs on CUDA cores.
- ``tc``: 9 to ``tc_max_rows(device, dtype, N)`` rows of fp16/bf16 A on a device with tensor cores for that dtype:
  the fused tensor-core kernel (WMMA), every row in one block so each weight byte is read once,
  optionally splitting K over the grid (fp32 partial sums, added in a fixed order by a second kernel).
- ``dense``: more rows: the weight is dequantized to A's dtype by a kernel (exactly the reference's
  rounded weight) and multiplied by torch's GEMM (cuBLAS, tensor cores).
Double-quantized block scales (gemm_4bit's absmax_8bit / absmax_code / absmax_offset) are decoded by
every kernel where it loads a scale: no pass over the scales, no extra launch.
"""

from __future__ import annotations

import functools

import torch

from bitsandbytes import _formats
from bitsandbytes._ops import check_gemm_4bit
from bitsandbytes.backends import kit

from ..launch import launch
from ..tables.matmul_4bit import (
    DEQUANT_PER_THREAD,
    GEMV_PATHS,
    GEMV_WARP_FEATURES,
    GEMV_WARPS,
    TC_CHUNK,
    TC_FEATURES,
    TC_REDUCE_THREADS,
    TC_ROWS,
    TC_WARPS,
)
from ._common import suffix

__all__ = ["OPS", "fused_max_rows", "gemm_4bit", "gemv_4bit", "gemv_4bit_out", "matmul_route", "tc_max_rows"]

# Rows of A up to which the fused kernel runs, per compute capability; above, dequantize + cuBLAS.
# UNMEASURED (no GPU here): chosen by reasoning. The fused kernel's time is about
# rows * N * K / (0.5 * fp32 FMA rate), the dense path's about 4.5 * N * K bytes / DRAM bandwidth
# (write and read the fp16 weight, read the packed one; its GEMM is small next to that), so the crossover is
# rows ~ 2.25 * FMA rate / bandwidth: A100 ~11, H100 ~22, H200 ~16, B200 ~11, RTX 3090 ~42, RTX 4090 and
# L4 ~90+, T4 ~28. Rounded to tiles of 8 and clipped to [8, 64]: the fused path never loses at <= 8 rows
# (the dense path's weight pass alone costs more than the fused kernel's whole traffic).
FUSED_MAX_ROWS = {
    (7, 5): 32,  # T4
    (8, 0): 16,  # A100, A30
    (8, 6): 40,  # RTX 30xx, A10, A40
    (8, 7): 32,  # Jetson Orin
    (8, 9): 64,  # RTX 40xx, L4, L40
    (9, 0): 24,  # H100, H200 (H200's bandwidth says ~16)
    (10, 0): 16,  # B200
    (10, 3): 16,  # B300
    (12, 0): 64,  # RTX 50xx
    (12, 1): 64,  # DGX Spark
}
FUSED_MAX_ROWS_DEFAULT = 16  # an unknown capability, or a device that is not cuda (the emulator)

# Rows of fp16/bf16 A up to which the tensor-core kernel runs (from TC_MIN_ROWS; where the dtype has
# tensor cores, TC_DTYPE_CAPABILITY), per compute capability and by how many blocks of TC_FEATURES output
# features the weight gives per SM ("waves": >= 3, >= 2, >= 1, >= 1/2, less); above, SIMT up to
# fused_max_rows, then dequantize + cuBLAS. 0: that cell never takes the tensor-core kernel.
# UNMEASURED for this kernel (no GPU here; bench/bench_cuda.py times the three routes at 16/32/64 rows).
# Bytes moved say the fused kernel should win everywhere: it reads 0.5 byte per weight (+ its scale,
# 4 / blocksize) once whatever the rows; the dense path reads 0.5, writes 2 and rereads 2 (4.5 bytes),
# then runs the same 2 * rows flops per weight on the same tensor cores; at 64 rows that is ~256 flops
# per byte of weight, above every listed part's ridge point even at a third of tensor-core peak. But
# upstream measured its own fused mma.sync kernel (blocks of 64 features, as here) against dequantize +
# cuBLAS on each arch (bitsandbytes/backends/cuda/ops.py, _gemm_4bit_use_custom): cuBLAS's WGMMA path on
# sm_90 and sm_100 beats a warp-level MMA kernel unless the grid fills the GPU several times, and a
# weight that gives few blocks per SM loses on every arch (cuBLAS tiles K; our split of K, tc_splits, is
# meant to answer that, unmeasured). So the cells follow upstream's measured crossovers, capped at this
# kernel's largest tile (64); the bench replaces them with this kernel's own. At 8 rows or fewer the
# SIMT kernel reads the weight once too, with no shared-memory staging: the tensor-core kernel starts at 9.
TC_MIN_ROWS = 9
TC_WAVES = (3.0, 2.0, 1.0, 0.5, 0.0)
TC_MAX_ROWS: dict[tuple[int, int], tuple[int, int, int, int, int]] = {
    (7, 5): (64, 64, 64, 64, 32),  # T4 (fp16 only): GDDR6, dequantizing is dear
    (8, 0): (64, 64, 32, 16, 16),  # A100, A30
    (8, 6): (64, 64, 64, 64, 16),  # RTX 30xx, A10, A40
    (8, 9): (64, 64, 64, 32, 16),  # RTX 40xx, L4, L40
    (9, 0): (64, 48, 32, 16, 0),  # H100, H200: cuBLAS's WGMMA path is fast
    (10, 0): (32, 0, 0, 0, 0),  # B200
    (10, 3): (32, 0, 0, 0, 0),  # B300
    (12, 0): (64, 64, 64, 32, 8),  # RTX 50xx
}
TC_MAX_ROWS_DEFAULT = (64, 48, 32, 16, 0)  # an unknown capability: as cautious as sm_90
TC_MAX_ROWS_EMULATED = (64, 64, 64, 64, 64)  # the emulator: every row count the kernel serves
# WMMA exists for fp16 from sm_70 and for bf16 from sm_80 (the library's images start at sm_75).
TC_DTYPE_CAPABILITY = {torch.float16: (7, 0), torch.bfloat16: (8, 0)}
# Capability assumed for a device that is not cuda: the emulator, whose <mma.h> runs every WMMA kernel.
EMULATED_CAPABILITY = None
# Blocks per SM the split of K aims for (the kernel's kTcMinBlocks): a block keeps one chunk of loads in
# flight, so the bytes in flight per SM, hence the bandwidth, grow with the resident blocks. UNMEASURED.
TC_BLOCKS_PER_SM = 4
EMULATED_SMS = 1
DEQUANT_THREADS = 256
# The fused kernel walks a row of W with 32-bit offsets (k + 32 lanes * 32 weights must not overflow).
MAX_FUSED_K = 2**31 - 1 - 32 * 32

# Per device: (SIMT rows, tensor-core rows by waves, dtypes with tensor cores, SMs), looked up once.
_DEVICES: dict[torch.device, tuple[int, tuple, frozenset, int]] = {}


def _capability(device: torch.device) -> tuple[int, int] | None:
    return torch.cuda.get_device_capability(device) if device.type == "cuda" else EMULATED_CAPABILITY


def _sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else EMULATED_SMS


def _device(device: torch.device) -> tuple[int, tuple, frozenset, int]:
    d = _DEVICES.get(device)
    if d is None:
        cap = _capability(device)
        if cap is None and device.type == "cuda":
            raise RuntimeError(f"no compute capability for {device}")
        tc = frozenset(dt for dt, need in TC_DTYPE_CAPABILITY.items() if cap is None or cap >= need)
        d = _DEVICES[device] = (
            FUSED_MAX_ROWS.get(cap, FUSED_MAX_ROWS_DEFAULT),
            TC_MAX_ROWS_EMULATED if cap is None else TC_MAX_ROWS.get(cap, TC_MAX_ROWS_DEFAULT),
            tc,
            _sms(device),
        )
    return d


def fused_max_rows(device: torch.device) -> int:
    """Rows of A up to which ``device`` runs the SIMT kernel where the tensor-core one does not apply."""
    return _device(device)[0]


def tc_max_rows(device: torch.device, dtype: torch.dtype, N: int) -> int:
    """Rows of ``dtype`` A up to which ``device`` runs the tensor-core kernel for N output features (0: never)."""
    _, by_waves, dtypes, sms = _device(device)
    if dtype not in dtypes:
        return 0
    waves = -(-N // TC_FEATURES) / sms
    return next(rows for rows, w in zip(by_waves, TC_WAVES, strict=True) if waves >= w)


def matmul_route(A: torch.Tensor, Bb: torch.Tensor, M: int, N: int, K: int) -> str:
    """``gemv`` (the SIMT kernel), ``tc`` (the tensor-core kernel) or ``dense`` (dequantize + torch.mm)."""
    if (
        TC_MIN_ROWS <= M <= tc_max_rows(A.device, A.dtype, N)
        and K % 32 == 0
        and A.data_ptr() % 16 == 0
        and Bb.data_ptr() % 16 == 0
    ):
        return "tc"
    return "gemv" if M <= fused_max_rows(A.device) else "dense"


def tc_splits(groups: int, chunks: int, M: int, K: int, sms: int) -> tuple[int, int]:
    """(splits of K over the grid, chunks of K per split) for ``groups`` blocks of features.

    Enough blocks for TC_BLOCKS_PER_SM per SM, no more splits than chunks, and fp32 partial sums
    (4 * M * N bytes per split, written and read back) at most half the packed weight's N * K / 2 bytes.
    """
    want = -(-TC_BLOCKS_PER_SM * sms // groups)
    splits = max(1, min(want, chunks, K // (16 * M)))
    per = -(-chunks // splits)
    return -(-chunks // per), per


@functools.cache
def _table(quant_type: str, device: torch.device) -> torch.Tensor:
    return _formats.code_table(quant_type, device).float().contiguous()  # made once per device, off the hot path


def _bytes(B: torch.Tensor) -> torch.Tensor:
    """The packed codes as flat uint8, whatever quant_storage holds them (no copy if contiguous)."""
    return B.contiguous().reshape(-1).view(torch.uint8)


def gemv_tile(M: int) -> int:
    """Rows of A per block for M rows: the smallest instantiated tile that holds them, else 8 (several tiles)."""
    return next((t for t in (1, 2, 4) if M <= t), 8)


def gemv_path(A: torch.Tensor, Bb: torch.Tensor, K: int) -> str:
    """``v16``/``v4`` when K and the alignment of A and B allow those loads, else ``any`` (tables/matmul_4bit.py)."""
    if A.data_ptr() % 16 == 0:
        if K % 32 == 0 and Bb.data_ptr() % 16 == 0:
            return "v16"
        if K % 8 == 0 and Bb.data_ptr() % 4 == 0:
            return "v4"
    return "any"


def _gemv_into(A, Bb, M, N, K, scales, code, blocksize, bias, out) -> None:
    path = gemv_path(A, Bb, K)
    tile = gemv_tile(M)
    if tile not in GEMV_PATHS[path][1]:
        tile = 8
    per_block = GEMV_WARPS * GEMV_WARP_FEATURES[tile]
    grid = -(-N // per_block) * -(-M // tile)
    launch(
        f"gemv_4bit_{suffix(A.dtype)}_{path}_m{tile}",
        grid,
        GEMV_WARPS * 32,
        0,
        A,
        Bb,
        *scales,
        code,
        bias,
        out,
        M,
        N,
        K,
        blocksize,
    )


def _tc_into(A, Bb, M, N, K, scales, code, blocksize, bias, out) -> None:
    rows = next(r for r in TC_ROWS if M <= r)
    groups, chunks = -(-N // TC_FEATURES), -(-K // TC_CHUNK)
    splits, per = tc_splits(groups, chunks, M, K, _device(A.device)[3])
    dt = suffix(A.dtype)
    partial = torch.empty((splits, M, N), dtype=torch.float32, device=A.device) if splits > 1 else None
    args = (A, Bb, *scales, code, bias, out, partial, M, N, K, blocksize, per)
    launch(f"gemm_4bit_tc_{dt}_m{rows}", (groups, splits), TC_WARPS * 32, 0, *args)
    if partial is not None:
        grid = -(-M * N // TC_REDUCE_THREADS)
        launch(f"gemm_4bit_tc_reduce_{dt}", grid, TC_REDUCE_THREADS, 0, partial, bias, out, M, N, splits)


def _scales(absmax, absmax_8bit=None, absmax_code=None, absmax_offset=None) -> tuple:
    """The kernels' four scale arguments: plain fp32 absmax and three nulls, or the nested state."""
    if absmax_8bit is None:
        return (absmax.contiguous(), None, None, None)
    # absmax_offset may be fp16/bf16 (the contract says "used as float32"); .float() is free when it is fp32.
    offset = absmax_offset.reshape(1).float().contiguous()
    return (absmax.contiguous(), absmax_8bit.contiguous().reshape(-1), absmax_code.contiguous(), offset)


def dequantize_weight(Bb, N, K, scales, code, blocksize, dtype) -> torch.Tensor:
    """The [N, K] weight in ``dtype``: ``code[c] * scale[block]`` in fp32, rounded once."""
    W = torch.empty((N, K), dtype=dtype, device=Bb.device)
    n = N * K
    if n:
        grid = -(-n // (DEQUANT_THREADS * DEQUANT_PER_THREAD))
        launch(f"dequantize_4bit_weight_{suffix(dtype)}", grid, DEQUANT_THREADS, 0, Bb, *scales, code, W, n, blocksize)
    return W


def _matmul_into(A, B, N, K, scales, code, blocksize, bias, out) -> None:
    """out[..., N] = A[..., K] @ W.T (+ bias) in A.dtype, fp32 accumulation."""
    if out.numel() == 0:  # no rows or no columns
        return
    if K == 0:  # every entry an empty sum: the bias, or zero
        out.zero_() if bias is None else out.copy_(bias.expand_as(out))
        return
    M = A.numel() // K
    A = A.contiguous()
    Bb = _bytes(B)
    bias = bias.contiguous() if bias is not None else None
    route = matmul_route(A, Bb, M, N, K)
    if route == "tc":
        _tc_into(A, Bb, M, N, K, scales, code, blocksize, bias, out)
    elif route == "gemv":
        if K > MAX_FUSED_K:
            raise ValueError(f"A's last dimension K={K} exceeds {MAX_FUSED_K}, the most the fused kernel indexes")
        _gemv_into(A, Bb, M, N, K, scales, code, blocksize, bias, out)
    else:
        W = dequantize_weight(Bb, N, K, scales, code, blocksize, A.dtype)
        A2, out2 = A.reshape(M, K), out.view(M, N)  # out is contiguous (checked or fresh)
        if bias is None:
            torch.mm(A2, W.T, out=out2)
        else:
            torch.addmm(bias, A2, W.T, out=out2)


def _gemv_4bit_into(A, B, shapeB, absmax, code, blocksize, out) -> None:
    # Checked by the caller (kit.out_pair): out is [..., N], and A's last dimension is K.
    _matmul_into(A, B, out.shape[-1], A.shape[-1], _scales(absmax), code.contiguous(), blocksize, None, out)


# The functional op and its .out: the core's checks, then the kernels.
_GEMV = kit.out_pair("gemv_4bit", _gemv_4bit_into)
gemv_4bit = _GEMV["gemv_4bit"]
gemv_4bit_out = _GEMV["gemv_4bit.out"]


def gemm_4bit(
    A, B, shapeB, absmax, blocksize, quant_type, bias=None, absmax_8bit=None, absmax_code=None, absmax_offset=None
) -> torch.Tensor:
    N, K = check_gemm_4bit(A, B, shapeB, absmax, blocksize, quant_type, bias, absmax_8bit, absmax_code, absmax_offset)
    scales = _scales(absmax, absmax_8bit, absmax_code, absmax_offset)
    out = torch.empty((*A.shape[:-1], N), dtype=A.dtype, device=A.device)
    _matmul_into(A, B, N, K, scales, _table(quant_type, A.device), blocksize, bias, out)
    return out


OPS = {**_GEMV, "gemm_4bit": gemm_4bit}
