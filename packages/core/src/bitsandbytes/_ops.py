"""Every op of bitsandbytes, declared once: schema, argument contract and fake (meta) kernel.

Names and schemas are identical to upstream bitsandbytes 0.50, so code and compiled graphs that call
``torch.ops.bitsandbytes.*`` work unchanged. Each op has a ``check_*`` function holding its contract;
the fake kernel, the reference kernel and every backend call it, so a wrong call raises the same
``TypeError``/``ValueError`` on every device and under ``torch.compile``. Reference kernels live in
``bitsandbytes._reference`` and are registered as each op's default (CompositeExplicitAutograd).
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

import torch

from . import _checks as c
from ._formats import OPTIMIZER_BLOCKSIZE, packed_4bit_shape

LIB = "bitsandbytes"

SCHEMAS: dict[str, str] = {
    # 8-bit blockwise (dynamic map) quantization.
    "quantize_blockwise": "(Tensor A, Tensor code, int blocksize) -> (Tensor, Tensor)",
    "dequantize_blockwise": "(Tensor A, Tensor absmax, Tensor code, int blocksize, ScalarType dtype) -> Tensor",
    "dequantize_blockwise.out": (
        "(Tensor A, Tensor absmax, Tensor code, int blocksize, ScalarType dtype, Tensor! out) -> ()"
    ),
    # 4-bit (NF4 / FP4) quantization and matmuls on the packed format.
    "quantize_4bit": "(Tensor A, int blocksize, str quant_type, ScalarType quant_storage) -> (Tensor, Tensor)",
    "dequantize_4bit": (
        "(Tensor A, Tensor absmax, int blocksize, str quant_type, int[] shape, ScalarType dtype) -> Tensor"
    ),
    "dequantize_4bit.out": (
        "(Tensor A, Tensor absmax, int blocksize, str quant_type, int[] shape, ScalarType dtype, Tensor! out) -> ()"
    ),
    "gemv_4bit": "(Tensor A, Tensor B, int[] shapeB, Tensor absmax, Tensor code, int blocksize) -> Tensor",
    "gemv_4bit.out": (
        "(Tensor A, Tensor B, int[] shapeB, Tensor absmax, Tensor code, int blocksize, Tensor! out) -> ()"
    ),
    "gemm_4bit": (
        "(Tensor A, Tensor B, int[] shapeB, Tensor absmax, int blocksize, str quant_type, "
        "Tensor? bias=None, Tensor? absmax_8bit=None, Tensor? absmax_code=None, Tensor? absmax_offset=None) -> Tensor"
    ),
    # LLM.int8(): row/column-wise int8 quantization, int8 GEMM and dequantization.
    "int8_vectorwise_quant": "(Tensor A, float threshold=0.0) -> (Tensor, Tensor, Tensor?)",
    "int8_vectorwise_dequant": "(Tensor A, Tensor stats) -> Tensor",
    "int8_linear_matmul": "(Tensor A, Tensor B) -> Tensor",
    "int8_linear_matmul.out": "(Tensor A, Tensor B, Tensor! out) -> ()",
    "int8_mm_dequant": (
        "(Tensor A, Tensor row_stats, Tensor col_stats, ScalarType? dtype=None, Tensor? bias=None) -> Tensor"
    ),
    "int8_scaled_mm": (
        "(Tensor A, Tensor B, Tensor row_stats, Tensor col_stats, Tensor? bias=None, ScalarType? dtype=None) -> Tensor"
    ),
    "int8_mixed_scaled_mm": (
        "(Tensor A, Tensor CA, Tensor CB, Tensor SCA, Tensor SCB, Tensor? outlier_cols=None, Tensor? bias=None) "
        "-> (Tensor, Tensor?)"
    ),
    "int8_double_quant": "(Tensor A, float threshold=0.0) -> (Tensor, Tensor, Tensor, Tensor, Tensor?)",
    # Optimizer steps, in place on g/p/state.
    "optimizer_update_32bit": (
        "(str optimizer_name, Tensor(a0!) g, Tensor(a1!) p, Tensor(a2!) state1, Tensor(a3!)? state2, "
        "Tensor(a4!)? unorm_vec, float max_unorm, float param_norm, float beta1, float beta2, float beta3, "
        "float alpha, float eps, float weight_decay, int step, float lr, float gnorm_scale, "
        "bool skip_zeros=False) -> ()"
    ),
    "optimizer_update_8bit_blockwise": (
        "(str optimizer_name, Tensor(a0!) g, Tensor(a1!) p, Tensor(a2!) state1, Tensor(a3!)? state2, "
        "float beta1, float beta2, float beta3, float alpha, float eps, int step, float lr, Tensor(a4!) qmap1, "
        "Tensor(a5!)? qmap2, Tensor(a6!) absmax1, Tensor(a7!)? absmax2, float weight_decay, float gnorm_scale, "
        "bool skip_zeros=False) -> ()"
    ),
}

for _name, _schema in SCHEMAS.items():
    torch.library.define(f"{LIB}::{_name}", _schema)


def qualname(op: str) -> str:
    return f"{LIB}::{op}"


def fake(op: str):
    return torch.library.register_fake(qualname(op))


# ---------------------------------------------------------------------------------------------------
# 8-bit blockwise


def check_quantize_blockwise(A: torch.Tensor, code: torch.Tensor, blocksize: int) -> None:
    c.dtype("A", A, c.FLOAT_DTYPES)
    c.dtype("code", code, (torch.float32,))
    c.same_device("A", A, code=code)
    c.numel("code", code, 256, "one value per 8-bit code")
    c.any_blocksize(blocksize)


def check_dequantize_blockwise(
    A: torch.Tensor, absmax: torch.Tensor, code: torch.Tensor, blocksize: int, dtype: torch.dtype
) -> None:
    c.dtype("A", A, (torch.uint8,))
    c.dtype("absmax", absmax, (torch.float32,))
    c.dtype("code", code, (torch.float32,))
    c.same_device("A", A, absmax=absmax, code=code)
    c.numel("code", code, 256, "one value per 8-bit code")
    c.any_blocksize(blocksize)
    c.dtype_arg("dtype", dtype, c.FLOAT_DTYPES)
    c.numel("absmax", absmax, c.n_blocks(A.numel(), blocksize), f"one per block of {blocksize} elements of A")


@fake("quantize_blockwise")
def _(A, code, blocksize):
    check_quantize_blockwise(A, code, blocksize)
    absmax = A.new_empty((c.n_blocks(A.numel(), blocksize),), dtype=torch.float32)
    return torch.empty_like(A, dtype=torch.uint8, memory_format=torch.contiguous_format), absmax


@fake("dequantize_blockwise")
def _(A, absmax, code, blocksize, dtype):
    check_dequantize_blockwise(A, absmax, code, blocksize, dtype)
    return torch.empty_like(A, dtype=dtype, memory_format=torch.contiguous_format)


@fake("dequantize_blockwise.out")
def _(A, absmax, code, blocksize, dtype, out):
    check_dequantize_blockwise(A, absmax, code, blocksize, dtype)
    c.out_tensor(out, A.shape, dtype, A.device, reads={"A": A, "absmax": absmax, "code": code})


# ---------------------------------------------------------------------------------------------------
# 4-bit


def check_quantize_4bit(A: torch.Tensor, blocksize: int, quant_type: str, quant_storage: torch.dtype) -> None:
    c.dtype("A", A, c.FLOAT_DTYPES)
    c.blocksize(blocksize)
    c.quant_type(quant_type)
    c.dtype_arg("quant_storage", quant_storage, c.QUANT_STORAGE_DTYPES)
    need = c.packed_4bit_bytes(A.numel())
    if need % quant_storage.itemsize:
        # Upstream silently truncates here; we refuse rather than drop values.
        raise ValueError(
            f"A has {A.numel()} elements, which pack into {need} bytes, not a whole number of "
            f"quant_storage={quant_storage} elements ({quant_storage.itemsize} bytes); use quant_storage=torch.uint8"
        )


def check_dequantize_4bit(
    A: torch.Tensor, absmax: torch.Tensor, blocksize: int, quant_type: str, shape: Sequence[int], dtype: torch.dtype
) -> tuple[int, ...]:
    c.dtype("A", A, c.QUANT_STORAGE_DTYPES)
    c.dtype("absmax", absmax, (torch.float32,))
    c.same_device("A", A, absmax=absmax)
    c.blocksize(blocksize)
    c.quant_type(quant_type)
    dims = c.shape_arg("shape", shape)
    c.dtype_arg("dtype", dtype, c.FLOAT_DTYPES)
    n = prod(dims)
    have = A.numel() * A.element_size()
    if have != c.packed_4bit_bytes(n):
        # More bytes than the shape needs is as wrong as fewer: e.g. a float32 tensor of values passed
        # where the packed codes belong would otherwise dequantize to garbage.
        raise ValueError(
            f"A holds {have} bytes of packed 4-bit codes; shape {list(dims)} needs exactly {c.packed_4bit_bytes(n)}"
        )
    c.numel("absmax", absmax, c.n_blocks(n, blocksize), f"one per block of {blocksize} elements of shape {list(dims)}")
    return dims


@fake("quantize_4bit")
def _(A, blocksize, quant_type, quant_storage):
    check_quantize_4bit(A, blocksize, quant_type, quant_storage)
    n = A.numel()
    out = A.new_empty(packed_4bit_shape(n, quant_storage), dtype=quant_storage)
    return out, A.new_empty((c.n_blocks(n, blocksize),), dtype=torch.float32)


@fake("dequantize_4bit")
def _(A, absmax, blocksize, quant_type, shape, dtype):
    dims = check_dequantize_4bit(A, absmax, blocksize, quant_type, shape, dtype)
    return A.new_empty(dims, dtype=dtype)


@fake("dequantize_4bit.out")
def _(A, absmax, blocksize, quant_type, shape, dtype, out):
    dims = check_dequantize_4bit(A, absmax, blocksize, quant_type, shape, dtype)
    c.out_tensor(out, dims, dtype, A.device, reads={"A": A, "absmax": absmax})


def _check_4bit_matmul_operands(A: torch.Tensor, B: torch.Tensor, shapeB: Sequence[int]) -> tuple[int, int]:
    c.dtype("A", A, c.FLOAT_DTYPES)
    c.dtype("B", B, c.QUANT_STORAGE_DTYPES)
    c.same_device("A", A, B=B)
    dims = c.shape_arg("shapeB", shapeB)
    if len(dims) != 2:
        raise ValueError(f"shapeB must be the 2-D shape [N, K] of the quantized weight; got {list(dims)}")
    N, K = dims
    if A.dim() == 0 or A.shape[-1] != K:
        raise ValueError(f"A's last dimension must equal K={K} (shapeB[1]); got A of shape {tuple(A.shape)}")
    have = B.numel() * B.element_size()
    need = c.packed_4bit_bytes(N * K)
    if have != need:
        # As dequantize_4bit: more bytes than shapeB needs is as wrong as fewer (the float weight itself,
        # or another layer's codes, passed as B would otherwise multiply as garbage). The packed weight
        # and its [1, bytes] transpose hold exactly this many; FSDP hands over unpadded parameters.
        raise ValueError(f"B holds {have} bytes of packed 4-bit codes; shapeB {[N, K]} needs exactly {need}")
    return N, K


def check_gemv_4bit(
    A: torch.Tensor, B: torch.Tensor, shapeB: Sequence[int], absmax: torch.Tensor, code: torch.Tensor, blocksize: int
) -> tuple[int, int]:
    N, K = _check_4bit_matmul_operands(A, B, shapeB)
    c.dtype("absmax", absmax, (torch.float32,))
    c.dtype("code", code, (torch.float32,))
    c.same_device("A", A, absmax=absmax, code=code)
    c.numel("code", code, 16, "one value per 4-bit code")
    c.blocksize(blocksize)
    c.numel("absmax", absmax, c.n_blocks(N * K, blocksize), f"one per block of {blocksize} weights")
    return N, K


@fake("gemv_4bit")
def _(A, B, shapeB, absmax, code, blocksize):
    N, _ = check_gemv_4bit(A, B, shapeB, absmax, code, blocksize)
    return A.new_empty((*A.shape[:-1], N))


@fake("gemv_4bit.out")
def _(A, B, shapeB, absmax, code, blocksize, out):
    N, _ = check_gemv_4bit(A, B, shapeB, absmax, code, blocksize)
    c.out_tensor(out, (*A.shape[:-1], N), A.dtype, A.device, reads={"A": A, "B": B, "absmax": absmax, "code": code})


def check_gemm_4bit(
    A, B, shapeB, absmax, blocksize, quant_type, bias=None, absmax_8bit=None, absmax_code=None, absmax_offset=None
) -> tuple[int, int]:
    N, K = _check_4bit_matmul_operands(A, B, shapeB)
    c.blocksize(blocksize)
    c.quant_type(quant_type)
    c.dtype("absmax", absmax, (torch.float32,))
    c.same_device("A", A, absmax=absmax, bias=bias, absmax_8bit=absmax_8bit)
    n_absmax = c.n_blocks(N * K, blocksize)
    if absmax_8bit is None:
        if absmax_code is not None or absmax_offset is not None:
            raise ValueError("absmax_code and absmax_offset are only accepted together with absmax_8bit")
        c.numel("absmax", absmax, n_absmax, f"one per block of {blocksize} weights")
    else:
        # Double quantization: absmax_8bit holds the block scales as 8-bit codes, absmax their fp32
        # scales per block of 256, absmax_code the signed dynamic map and absmax_offset the mean.
        c.dtype("absmax_8bit", absmax_8bit, (torch.uint8,))
        c.numel("absmax_8bit", absmax_8bit, n_absmax, f"one per block of {blocksize} weights")
        if absmax_code is None or absmax_offset is None:
            raise ValueError("absmax_code and absmax_offset are required when absmax_8bit is given")
        c.dtype("absmax_code", absmax_code, (torch.float32,))
        c.numel("absmax_code", absmax_code, 256, "one value per 8-bit code")
        c.dtype("absmax_offset", absmax_offset, c.FLOAT_DTYPES)  # used as float32, as upstream casts it
        c.numel("absmax_offset", absmax_offset, 1, "the scalar mean subtracted before double quantization")
        c.same_device("A", A, absmax_code=absmax_code, absmax_offset=absmax_offset)
        c.numel("absmax", absmax, c.n_blocks(n_absmax, 256), "one per block of 256 8-bit absmax codes")
    if bias is not None:
        c.dtype("bias", bias, (A.dtype,))
        if bias.dim() != 1 or bias.shape[0] != N:
            raise ValueError(f"bias must be 1-D of length N={N}; got shape {tuple(bias.shape)}")
    return N, K


@fake("gemm_4bit")
def _(A, B, shapeB, absmax, blocksize, quant_type, bias=None, absmax_8bit=None, absmax_code=None, absmax_offset=None):
    N, _ = check_gemm_4bit(A, B, shapeB, absmax, blocksize, quant_type, bias, absmax_8bit, absmax_code, absmax_offset)
    return A.new_empty((*A.shape[:-1], N))


# ---------------------------------------------------------------------------------------------------
# int8 (LLM.int8())


def _rows(A: torch.Tensor) -> int:
    return A.numel() // A.shape[-1] if A.shape[-1] else prod(A.shape[:-1])


def check_int8_vectorwise_quant(A: torch.Tensor, threshold: float) -> None:
    c.dtype("A", A, c.FLOAT_DTYPES)
    if A.dim() < 1:
        raise ValueError("A must have at least one dimension (rows x columns)")
    c.finite_scalar("threshold", threshold)
    if threshold < 0:
        raise ValueError(f"threshold must be >= 0 (0 disables outlier extraction); got {threshold}")


@fake("int8_vectorwise_quant")
def _(A, threshold=0.0):
    check_int8_vectorwise_quant(A, threshold)
    out = torch.empty_like(A, dtype=torch.int8, memory_format=torch.contiguous_format)
    stats = A.new_empty((_rows(A),), dtype=torch.float32)
    if threshold == 0.0:
        return out, stats, None
    n_outliers = torch.library.get_ctx().new_dynamic_size()
    return out, stats, A.new_empty((n_outliers,), dtype=torch.int64)


def check_int8_vectorwise_dequant(A: torch.Tensor, stats: torch.Tensor) -> None:
    c.dtype("A", A, (torch.int8,))
    c.dtype("stats", stats, (torch.float32,))
    c.same_device("A", A, stats=stats)
    if A.dim() < 1:
        raise ValueError("A must have at least one dimension (rows x columns)")
    c.numel("stats", stats, _rows(A), "one scale per row of A")


@fake("int8_vectorwise_dequant")
def _(A, stats):
    check_int8_vectorwise_dequant(A, stats)
    return torch.empty_like(A, dtype=torch.float32, memory_format=torch.contiguous_format)


def check_int8_linear_matmul(A: torch.Tensor, B: torch.Tensor, names: tuple[str, str] = ("A", "B")) -> tuple[int, ...]:
    a, b = names  # the ops that wrap this one call their operands CA and CB
    c.dtype(a, A, (torch.int8,))
    c.dtype(b, B, (torch.int8,))
    c.same_device(a, A, **{b: B})
    if A.dim() < 1 or B.dim() != 2:
        raise ValueError(f"{a} must be [..., K] and {b} [N, K]; got {a} {tuple(A.shape)} and {b} {tuple(B.shape)}")
    if A.shape[-1] != B.shape[1]:
        raise ValueError(f"{a}'s last dimension ({A.shape[-1]}) must equal {b}.shape[1] ({B.shape[1]})")
    return (*A.shape[:-1], B.shape[0])


@fake("int8_linear_matmul")
def _(A, B):
    return A.new_empty(check_int8_linear_matmul(A, B), dtype=torch.int32)


@fake("int8_linear_matmul.out")
def _(A, B, out):
    c.out_tensor(out, check_int8_linear_matmul(A, B), torch.int32, A.device, reads={"A": A, "B": B})


def check_int8_mm_dequant(A, row_stats, col_stats, dtype=None, bias=None) -> torch.dtype:
    c.dtype("A", A, (torch.int32,))
    c.dtype("row_stats", row_stats, (torch.float32,))
    c.dtype("col_stats", col_stats, (torch.float32,))
    c.same_device("A", A, row_stats=row_stats, col_stats=col_stats, bias=bias)
    if A.dim() < 1:
        raise ValueError("A must have at least one dimension (rows x columns)")
    c.numel("row_stats", row_stats, _rows(A), "one scale per row of A")
    c.numel("col_stats", col_stats, A.shape[-1], "one scale per column of A")
    out_dtype = dtype or torch.float16
    c.dtype_arg("dtype", out_dtype, c.FLOAT_DTYPES)
    if bias is not None:
        c.dtype("bias", bias, c.FLOAT_DTYPES)
        c.numel("bias", bias, A.shape[-1], "one value per output column")
    return out_dtype


@fake("int8_mm_dequant")
def _(A, row_stats, col_stats, dtype=None, bias=None):
    out_dtype = check_int8_mm_dequant(A, row_stats, col_stats, dtype, bias)
    return torch.empty_like(A, dtype=out_dtype, memory_format=torch.contiguous_format)


def check_int8_scaled_mm(A, B, row_stats, col_stats, bias=None, dtype=None) -> tuple[tuple[int, ...], torch.dtype]:
    shape = check_int8_linear_matmul(A, B)
    c.dtype("row_stats", row_stats, (torch.float32,))
    c.dtype("col_stats", col_stats, (torch.float32,))
    c.same_device("A", A, row_stats=row_stats, col_stats=col_stats, bias=bias)
    c.numel("row_stats", row_stats, _rows(A), "one scale per row of A")
    c.numel("col_stats", col_stats, B.shape[0], "one scale per row of B")
    out_dtype = dtype or torch.float16
    c.dtype_arg("dtype", out_dtype, c.FLOAT_DTYPES)
    if bias is not None:
        c.dtype("bias", bias, c.FLOAT_DTYPES)
        c.numel("bias", bias, B.shape[0], "one value per output column")
    return shape, out_dtype


@fake("int8_scaled_mm")
def _(A, B, row_stats, col_stats, bias=None, dtype=None):
    shape, out_dtype = check_int8_scaled_mm(A, B, row_stats, col_stats, bias, dtype)
    return A.new_empty(shape, dtype=out_dtype)


def check_int8_mixed_scaled_mm(
    A, CA, CB, SCA, SCB, outlier_cols=None, bias=None, *, values: bool = True
) -> tuple[int, ...]:
    """The contract of int8_mixed_scaled_mm; ``values=False`` (the fake kernel) skips the one check that
    reads data: every entry of ``outlier_cols`` must be a column of A."""
    c.dtype("A", A, c.FLOAT_DTYPES)
    shape = check_int8_linear_matmul(CA, CB, names=("CA", "CB"))
    if tuple(A.shape) != tuple(CA.shape):
        raise ValueError(f"A and CA must have the same shape; got {tuple(A.shape)} and {tuple(CA.shape)}")
    c.dtype("SCA", SCA, (torch.float32,))
    c.dtype("SCB", SCB, (torch.float32,))
    c.same_device("A", A, CA=CA, CB=CB, SCA=SCA, SCB=SCB, outlier_cols=outlier_cols, bias=bias)
    c.numel("SCA", SCA, _rows(CA), "one scale per row of CA")
    c.numel("SCB", SCB, CB.shape[0], "one scale per row of CB")
    if outlier_cols is not None:
        c.dtype("outlier_cols", outlier_cols, (torch.int64, torch.int32))
        c.ndim("outlier_cols", outlier_cols, 1)
        if values:
            c.index_values("outlier_cols", outlier_cols, A.shape[-1], "columns of A")
    if bias is not None:
        c.dtype("bias", bias, c.FLOAT_DTYPES)
        c.numel("bias", bias, CB.shape[0], "one value per output column")
    return shape


@fake("int8_mixed_scaled_mm")
def _(A, CA, CB, SCA, SCB, outlier_cols=None, bias=None):
    shape = check_int8_mixed_scaled_mm(A, CA, CB, SCA, SCB, outlier_cols, bias, values=False)
    # subA: A's outlier columns, [..., n_outliers]; upstream's fake says int64 of dynamic length, but the
    # kernel returns A[:, outlier_cols], whose shape outlier_cols fixes.
    n_outliers = 0 if outlier_cols is None else outlier_cols.shape[0]
    return A.new_empty(shape), A.new_empty((*A.shape[:-1], n_outliers))


def check_int8_double_quant(A: torch.Tensor, threshold: float) -> None:
    check_int8_vectorwise_quant(A, threshold)


@fake("int8_double_quant")
def _(A, threshold=0.0):
    check_int8_double_quant(A, threshold)
    out_row = torch.empty_like(A, dtype=torch.int8, memory_format=torch.contiguous_format)
    out_col = torch.empty_like(A, dtype=torch.int8, memory_format=torch.contiguous_format)
    row_stats = A.new_empty((_rows(A),), dtype=torch.float32)
    col_stats = A.new_empty((A.shape[-1],), dtype=torch.float32)
    if threshold == 0.0:
        return out_row, out_col, row_stats, col_stats, None
    n_outliers = torch.library.get_ctx().new_dynamic_size()
    return out_row, out_col, row_stats, col_stats, A.new_empty((n_outliers,), dtype=torch.int64)


# ---------------------------------------------------------------------------------------------------
# Optimizers

# Optimizers that keep a second state tensor (and so need state2 / qmap2 / absmax2).
TWO_STATE_OPTIMIZERS = ("adam", "ademamix", "lamb")


def _check_optimizer_common(optimizer_name, g, p, state1, state2) -> None:
    if optimizer_name not in c.OPTIMIZER_NAMES:
        raise ValueError(f"optimizer_name must be one of {', '.join(c.OPTIMIZER_NAMES)}; got {optimizer_name!r}")
    c.dtype("g", g, c.FLOAT_DTYPES)
    c.dtype("p", p, (g.dtype,))
    c.same_device("p", p, g=g, state1=state1, state2=state2)
    if g.numel() != p.numel():
        raise ValueError(f"g must have as many elements as p ({p.numel()}); got {g.numel()}")
    for name, t in (("g", g), ("p", p), ("state1", state1), ("state2", state2)):
        if t is not None:
            c.contiguous(name, t)
    needs_state2 = optimizer_name in TWO_STATE_OPTIMIZERS
    if needs_state2 and state2 is None:
        raise ValueError(f"optimizer {optimizer_name!r} keeps two states; state2 must be given")


def _state_numel(optimizer_name: str, n: int, name: str, t: torch.Tensor) -> None:
    # AdEMAMix keeps its two first-moment EMAs stacked in state1 ([2, *p.shape]).
    want = 2 * n if optimizer_name == "ademamix" and name == "state1" else n
    c.numel(name, t, want, "one per parameter element" + (", two EMAs stacked" if want != n else ""))


def _numbers(**values: object) -> None:
    # torch.ops' schema hands the kernels Python floats (symbolic ones to the fake kernels under
    # torch.compile); a kernel function called directly (a backend's, or the reference) gets what the caller
    # passed, and a tensor or a string must not reach a launcher.
    for name, v in values.items():
        if isinstance(v, bool) or not isinstance(v, (int, float, torch.SymInt, torch.SymFloat)):
            raise TypeError(f"{name} must be a Python int or float; got {type(v).__name__}")


def check_optimizer_update_32bit(
    optimizer_name, g, p, state1, state2, unorm_vec, max_unorm, param_norm, beta1, beta2, beta3, alpha, eps,
    weight_decay, step, lr, gnorm_scale, skip_zeros=False,
) -> None:  # fmt: skip
    _check_optimizer_common(optimizer_name, g, p, state1, state2)
    _numbers(max_unorm=max_unorm, param_norm=param_norm, beta1=beta1, beta2=beta2, beta3=beta3, alpha=alpha, eps=eps,
             weight_decay=weight_decay, lr=lr, gnorm_scale=gnorm_scale)  # fmt: skip
    c.dtype("state1", state1, (torch.float32,))
    _state_numel(optimizer_name, p.numel(), "state1", state1)
    if state2 is not None:
        c.dtype("state2", state2, (torch.float32,))
        _state_numel(optimizer_name, p.numel(), "state2", state2)
    if max_unorm > 0:
        if unorm_vec is None:
            raise ValueError("unorm_vec (a 1-element float32 tensor) is required when max_unorm > 0")
    if unorm_vec is not None:
        c.dtype("unorm_vec", unorm_vec, (torch.float32,))
        c.numel("unorm_vec", unorm_vec, 1, "the update norm")
        c.same_device("p", p, unorm_vec=unorm_vec)
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise ValueError(f"step must be an int >= 1; got {step!r}")


@fake("optimizer_update_32bit")
def _(
    optimizer_name, g, p, state1, state2, unorm_vec, max_unorm, param_norm, beta1, beta2, beta3, alpha, eps,
    weight_decay, step, lr, gnorm_scale, skip_zeros=False,
):  # fmt: skip
    check_optimizer_update_32bit(
        optimizer_name, g, p, state1, state2, unorm_vec, max_unorm, param_norm, beta1, beta2, beta3, alpha, eps,
        weight_decay, step, lr, gnorm_scale, skip_zeros,
    )  # fmt: skip


def check_optimizer_update_8bit_blockwise(
    optimizer_name, g, p, state1, state2, beta1, beta2, beta3, alpha, eps, step, lr, qmap1, qmap2, absmax1,
    absmax2, weight_decay, gnorm_scale, skip_zeros=False,
) -> None:  # fmt: skip
    _check_optimizer_common(optimizer_name, g, p, state1, state2)
    _numbers(beta1=beta1, beta2=beta2, beta3=beta3, alpha=alpha, eps=eps, lr=lr, weight_decay=weight_decay,
             gnorm_scale=gnorm_scale)  # fmt: skip
    n = p.numel()
    c.dtype("state1", state1, (torch.uint8,))
    _state_numel(optimizer_name, n, "state1", state1)
    c.dtype("qmap1", qmap1, (torch.float32,))
    c.numel("qmap1", qmap1, 256, "one value per 8-bit code")
    c.dtype("absmax1", absmax1, (torch.float32,))
    c.same_device("p", p, qmap1=qmap1, absmax1=absmax1, qmap2=qmap2, absmax2=absmax2)
    # AdEMAMix quantizes each of its two stacked EMAs on its own: absmax1 is [2, blocks].
    n_ema = 2 if optimizer_name == "ademamix" else 1
    c.numel("absmax1", absmax1, n_ema * c.n_blocks(n, OPTIMIZER_BLOCKSIZE), "one per block of 256 states")
    if state2 is not None:
        c.dtype("state2", state2, (torch.uint8,))
        _state_numel(optimizer_name, n, "state2", state2)
        if qmap2 is None or absmax2 is None:
            raise ValueError("qmap2 and absmax2 are required when state2 is given")
        c.dtype("qmap2", qmap2, (torch.float32,))
        c.numel("qmap2", qmap2, 256, "one value per 8-bit code")
        c.dtype("absmax2", absmax2, (torch.float32,))
        c.numel("absmax2", absmax2, c.n_blocks(n, OPTIMIZER_BLOCKSIZE), "one per block of 256 states")
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise ValueError(f"step must be an int >= 1; got {step!r}")


@fake("optimizer_update_8bit_blockwise")
def _(
    optimizer_name, g, p, state1, state2, beta1, beta2, beta3, alpha, eps, step, lr, qmap1, qmap2, absmax1,
    absmax2, weight_decay, gnorm_scale, skip_zeros=False,
):  # fmt: skip
    check_optimizer_update_8bit_blockwise(
        optimizer_name, g, p, state1, state2, beta1, beta2, beta3, alpha, eps, step, lr, qmap1, qmap2, absmax1,
        absmax2, weight_decay, gnorm_scale, skip_zeros,
    )  # fmt: skip


OPS: tuple[str, ...] = tuple(SCHEMAS)


# ---------------------------------------------------------------------------------------------------
# Results of the ops with an ``.out`` overload: what the functional op allocates is what ``out=`` must be.


def _output_of_dequantize_blockwise(A, absmax, code, blocksize, dtype):
    check_dequantize_blockwise(A, absmax, code, blocksize, dtype)
    return tuple(A.shape), dtype


def _output_of_dequantize_4bit(A, absmax, blocksize, quant_type, shape, dtype):
    return tuple(check_dequantize_4bit(A, absmax, blocksize, quant_type, shape, dtype)), dtype


def _output_of_gemv_4bit(A, B, shapeB, absmax, code, blocksize):
    N, _ = check_gemv_4bit(A, B, shapeB, absmax, code, blocksize)
    return (*A.shape[:-1], N), A.dtype


def _output_of_int8_linear_matmul(A, B):
    return tuple(check_int8_linear_matmul(A, B)), torch.int32


# op -> f(*the op's arguments) -> (shape, dtype) of its result, after running the op's check. The result
# is on the device of the op's first argument.
OUTPUTS = {
    "dequantize_blockwise": _output_of_dequantize_blockwise,
    "dequantize_4bit": _output_of_dequantize_4bit,
    "gemv_4bit": _output_of_gemv_4bit,
    "int8_linear_matmul": _output_of_int8_linear_matmul,
}


def _argument_names(op: str) -> tuple[str, ...]:
    name, _, overload = op.partition(".")
    schema = getattr(getattr(torch.ops, LIB), name)
    return tuple(a.name for a in getattr(schema, overload or "default")._schema.arguments)


# op -> its functional arguments' names, the names ``out=`` errors give the inputs it overlaps.
_INPUT_NAMES = {op: _argument_names(op) for op in OUTPUTS}


def check_out(op: str, args: Sequence, out: torch.Tensor) -> tuple[tuple[int, ...], torch.dtype]:
    """The contract of ``<op>.out(*args, out)``: the op's check, then ``out`` of its result's shape, dtype and
    device, contiguous, sharing no memory with an input. Returns the (shape, dtype) checked."""
    shape, dtype = OUTPUTS[op](*args)
    reads = {n: a for n, a in zip(_INPUT_NAMES[op], args, strict=False) if isinstance(a, torch.Tensor)}
    c.out_tensor(out, shape, dtype, args[0].device, reads=reads)
    return shape, dtype
