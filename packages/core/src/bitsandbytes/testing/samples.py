"""Representative arguments for every op and overload, on a given device.

``samples(op, device)`` returns a few small ``(args, kwargs)`` pairs for ``torch.ops.bitsandbytes.<op>``:
valid calls that exercise tails, several dtypes, optional arguments given and omitted. The core uses them
for ``torch.library.opcheck``; a backend can reuse them for its own opcheck or smoke tests.
Values are seeded, so every call returns the same samples.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterator
from math import prod

import torch

from .._checks import OPTIMIZER_NAMES, n_blocks
from .._ops import OPS, OPTIMIZER_BLOCKSIZE, TWO_STATE_OPTIMIZERS, packed_4bit_shape

__all__ = [
    "CLIPPED_OPTIMIZERS",
    "OPCHECK_UTILS",
    "OPTIMIZER_HYPERPARAMETERS",
    "SAMPLES",
    "Sample",
    "op_overload",
    "opcheck_failures",
    "samples",
]

Sample = tuple[tuple, dict]


def op_overload(op: str) -> torch._ops.OpOverload:
    """``"gemv_4bit.out"`` -> ``torch.ops.bitsandbytes.gemv_4bit.out``; ``"gemv_4bit"`` -> its ``.default``."""
    name, _, overload = op.partition(".")
    return getattr(getattr(torch.ops.bitsandbytes, name), overload or "default")


class _Maker:
    """Seeded random tensors, made on the CPU and moved to ``device``."""

    def __init__(self, device, seed: int = 1234):
        self.device = torch.device(device)
        self.g = torch.Generator().manual_seed(seed)

    def randn(self, *shape, dtype=torch.float32, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(shape, generator=self.g) * scale).to(dtype).to(self.device)

    def uint8(self, *shape) -> torch.Tensor:
        return torch.randint(0, 256, shape, generator=self.g, dtype=torch.uint8).to(self.device)

    def int8(self, *shape) -> torch.Tensor:
        return torch.randint(-127, 128, shape, generator=self.g, dtype=torch.int8).to(self.device)

    def int32(self, *shape, bound: int = 2**20) -> torch.Tensor:
        return torch.randint(-bound, bound, shape, generator=self.g, dtype=torch.int32).to(self.device)

    def scales(self, n: int) -> torch.Tensor:
        return (torch.rand(n, generator=self.g) * 4 + 0.05).to(self.device)

    def packed(self, n: int, storage=torch.uint8) -> torch.Tensor:
        rows = packed_4bit_shape(n, storage)[0]
        return self.uint8(rows * storage.itemsize).view(storage).view(rows, 1)


def _dynamic_map(device, signed: bool = True) -> torch.Tensor:
    from .. import functional

    return functional.create_dynamic_map(signed=signed).to(device)


def _code_4bit(quant_type: str, device) -> torch.Tensor:
    from .. import functional

    return functional.get_4bit_type(quant_type, device=device)


def _quantize_blockwise(device) -> list[Sample]:
    m, code = _Maker(device), _dynamic_map(device)
    return [
        ((m.randn(300), code, 64), {}),
        ((m.randn(2, 130, dtype=torch.bfloat16), code, 256), {}),
        ((m.randn(3, 5, dtype=torch.float16), code, 4096), {}),
    ]


def _dequantize_blockwise(device, out: bool = False) -> list[Sample]:
    m, code = _Maker(device), _dynamic_map(device)
    cases = [((300,), 64, torch.float16), ((2, 130), 256, torch.float32), ((7,), 32, torch.bfloat16)]
    result = []
    for shape, blocksize, dtype in cases:
        args = (m.uint8(*shape), m.scales(n_blocks(prod(shape), blocksize)), code, blocksize, dtype)
        if out:
            args = (*args, torch.empty(shape, dtype=dtype, device=m.device))
        result.append((args, {}))
    return result


def _quantize_4bit(device) -> list[Sample]:
    m = _Maker(device)
    return [
        ((m.randn(300), 64, "nf4", torch.uint8), {}),
        ((m.randn(65, dtype=torch.float16), 32, "fp4", torch.uint8), {}),
        # With a float quant_storage the packed words must not be NaN bit patterns: opcheck compares
        # outputs with assert_close, where NaN != NaN although the bytes are equal. Positive values give
        # FP4 codes 0..7 and negative values NF4 codes 0..7, so every byte stays at or below 0x77.
        ((m.randn(4, 64, dtype=torch.bfloat16).abs(), 128, "fp4", torch.bfloat16), {}),
        ((-m.randn(8, 16).abs(), 64, "nf4", torch.float32), {}),
    ]


def _dequantize_4bit(device, out: bool = False) -> list[Sample]:
    m = _Maker(device)
    cases = [
        ([300], 64, "nf4", torch.float16, torch.uint8),
        ([5, 13], 32, "fp4", torch.float32, torch.uint8),
        ([4, 64], 128, "nf4", torch.bfloat16, torch.bfloat16),
    ]
    result = []
    for shape, blocksize, quant_type, dtype, storage in cases:
        n = prod(shape)
        args = (m.packed(n, storage), m.scales(n_blocks(n, blocksize)), blocksize, quant_type, shape, dtype)
        if out:
            args = (*args, torch.empty(shape, dtype=dtype, device=m.device))
        result.append((args, {}))
    return result


def _gemv_4bit(device, out: bool = False) -> list[Sample]:
    m = _Maker(device)
    cases = [
        ((1, 1, 64), 10, 64, "nf4", torch.float16),
        ((1, 96), 7, 32, "fp4", torch.bfloat16),
        ((96,), 3, 128, "nf4", torch.float32),
    ]
    result = []
    for a_shape, N, blocksize, quant_type, dtype in cases:
        K = a_shape[-1]
        A = m.randn(*a_shape, dtype=dtype)
        args = (
            A,
            m.packed(N * K),
            [N, K],
            m.scales(n_blocks(N * K, blocksize)),
            _code_4bit(quant_type, m.device),
            blocksize,
        )
        if out:
            args = (*args, torch.empty((*a_shape[:-1], N), dtype=dtype, device=m.device))
        result.append((args, {}))
    return result


def _gemm_4bit(device) -> list[Sample]:
    m = _Maker(device)
    N, K = 10, 64
    plain = (m.randn(3, K), m.packed(N * K), [N, K], m.scales(n_blocks(N * K, 64)), 64, "nf4")
    with_bias = (
        m.randn(2, 5, K, dtype=torch.float16),
        m.packed(N * K),
        [N, K],
        m.scales(n_blocks(N * K, 32)),
        32,
        "fp4",
    )
    n_absmax = n_blocks(N * K, 32)
    nested = {
        "absmax_8bit": m.uint8(n_absmax),
        "absmax_code": _dynamic_map(m.device),
        "absmax_offset": torch.tensor(0.25, device=m.device),
    }
    nested_args = (
        m.randn(4, K, dtype=torch.bfloat16),
        m.packed(N * K),
        [N, K],
        m.scales(n_blocks(n_absmax, 256)),
        32,
        "nf4",
    )
    return [
        (plain, {}),
        (with_bias, {"bias": m.randn(N, dtype=torch.float16)}),
        (nested_args, nested),
    ]


def _with_outliers(m: _Maker, *shape, dtype=torch.float16) -> torch.Tensor:
    A = m.randn(*shape, dtype=dtype)
    A[..., 3] = 9.0  # a whole outlier column
    A.view(-1, shape[-1])[0, 17] = -12.0  # a single outlier value
    return A


def _int8_vectorwise_quant(device) -> list[Sample]:
    m = _Maker(device)
    return [
        ((m.randn(5, 40, dtype=torch.float16),), {}),
        ((_with_outliers(m, 5, 40),), {"threshold": 6.0}),
        ((m.randn(2, 3, 17, dtype=torch.bfloat16), 0.0), {}),
        ((m.randn(4, 33), 100.0), {}),  # a threshold with no outliers
    ]


def _int8_vectorwise_dequant(device) -> list[Sample]:
    m = _Maker(device)
    return [((m.int8(5, 40), m.scales(5)), {}), ((m.int8(2, 3, 17), m.scales(6)), {})]


def _int8_linear_matmul(device, out: bool = False) -> list[Sample]:
    m = _Maker(device)
    result = []
    for a_shape, b_shape in (((5, 40), (7, 40)), ((2, 3, 33), (4, 33))):
        args = (m.int8(*a_shape), m.int8(*b_shape))
        if out:
            args = (*args, torch.empty((*a_shape[:-1], b_shape[0]), dtype=torch.int32, device=m.device))
        result.append((args, {}))
    return result


def _int8_mm_dequant(device) -> list[Sample]:
    m = _Maker(device)
    return [
        ((m.int32(5, 7), m.scales(5), m.scales(7)), {}),
        ((m.int32(2, 3, 7), m.scales(6), m.scales(7), torch.bfloat16, m.randn(7, dtype=torch.bfloat16)), {}),
        ((m.int32(4, 9), m.scales(4), m.scales(9)), {"dtype": torch.float32, "bias": m.randn(9, dtype=torch.float16)}),
    ]


def _int8_scaled_mm(device) -> list[Sample]:
    m = _Maker(device)
    return [
        ((m.int8(5, 40), m.int8(7, 40), m.scales(5), m.scales(7)), {}),
        ((m.int8(2, 3, 33), m.int8(4, 33), m.scales(6), m.scales(4)), {"bias": m.randn(4), "dtype": torch.float32}),
    ]


def _int8_mixed_scaled_mm(device) -> list[Sample]:
    m = _Maker(device)
    N, K = 7, 40
    A = _with_outliers(m, 5, K)
    outliers = torch.tensor([3, 17], dtype=torch.int64, device=m.device)
    CA = m.int8(5, K)
    CA[:, outliers] = 0
    B = (m.int8(N, K), m.scales(N))
    return [
        ((A, CA, B[0], m.scales(5), B[1], outliers, m.randn(N, dtype=torch.float16)), {}),
        ((m.randn(5, K, dtype=torch.bfloat16), m.int8(5, K), B[0], m.scales(5), B[1]), {}),
        ((A, CA, B[0], m.scales(5), B[1]), {"outlier_cols": outliers[:0]}),
    ]


def _int8_double_quant(device) -> list[Sample]:
    m = _Maker(device)
    return [
        ((m.randn(5, 40, dtype=torch.float16),), {}),
        ((_with_outliers(m, 6, 40),), {"threshold": 6.0}),
        ((m.randn(3, 17), 0.0), {}),
    ]


# (beta1, beta2, beta3, alpha, eps, weight_decay, lr): typical hyperparameters for each optimizer.
OPTIMIZER_HYPERPARAMETERS = {
    "adam": (0.9, 0.999, 0.0, 0.0, 1e-8, 0.01, 1e-3),
    "momentum": (0.9, 0.0, 0.0, 0.0, 1e-8, 0.01, 1e-2),
    "rmsprop": (0.99, 0.0, 0.0, 0.0, 1e-8, 0.01, 1e-2),
    "lion": (0.9, 0.99, 0.0, 0.0, 0.0, 0.01, 1e-4),
    "adagrad": (0.0, 0.0, 0.0, 0.0, 1e-10, 0.01, 1e-2),
    "ademamix": (0.9, 0.999, 0.9999, 5.0, 1e-8, 0.01, 1e-3),
    "lamb": (0.9, 0.999, 0.0, 0.0, 1e-8, 0.01, 1e-3),
    "lars": (0.9, 0.0, 0.0, 0.0, 1e-8, 0.01, 1e-2),
}

# The optimizers that upstream runs with an update-norm clip (max_unorm > 0).
CLIPPED_OPTIMIZERS = ("lamb", "lars")


def _optimizer_update_32bit(device) -> list[Sample]:
    m = _Maker(device)
    result = []
    for i, name in enumerate(OPTIMIZER_NAMES):
        dtype = (torch.float32, torch.float16, torch.bfloat16)[i % 3]
        n = 300
        beta1, beta2, beta3, alpha, eps, wd, lr = OPTIMIZER_HYPERPARAMETERS[name]
        state1 = m.randn(2, n, scale=0.1) if name == "ademamix" else m.randn(n, scale=0.1).abs()
        state2 = m.randn(n, scale=0.01).abs() if name in TWO_STATE_OPTIMIZERS else None
        max_unorm = 1.0 if name in CLIPPED_OPTIMIZERS else 0.0
        unorm_vec = torch.zeros(1, device=m.device) if max_unorm else None
        args = (
            name, m.randn(n, dtype=dtype), m.randn(n, dtype=dtype), state1, state2, unorm_vec, max_unorm, 2.0,
            beta1, beta2, beta3, alpha, eps, wd, 3, lr, 1.0, name == "adam",
        )  # fmt: skip
        result.append((args, {}))
    return result


def _optimizer_update_8bit_blockwise(device) -> list[Sample]:
    m = _Maker(device)
    signed, unsigned = _dynamic_map(m.device, True), _dynamic_map(m.device, False)
    result = []
    for i, name in enumerate(OPTIMIZER_NAMES):
        dtype = (torch.float32, torch.float16, torch.bfloat16)[i % 3]
        n = 300
        blocks = n_blocks(n, OPTIMIZER_BLOCKSIZE)
        beta1, beta2, beta3, alpha, eps, wd, lr = OPTIMIZER_HYPERPARAMETERS[name]
        two = name in TWO_STATE_OPTIMIZERS
        if name == "ademamix":
            state1, absmax1 = m.uint8(2, n), m.scales(2 * blocks).view(2, blocks)
        else:
            state1, absmax1 = m.uint8(n), m.scales(blocks)
        state2, qmap2, absmax2 = (m.uint8(n), unsigned, m.scales(blocks) * 0.01) if two else (None, None, None)
        args = (
            name, m.randn(n, dtype=dtype), m.randn(n, dtype=dtype), state1, state2, beta1, beta2, beta3, alpha, eps,
            3, lr, signed, qmap2, absmax1, absmax2, wd, 1.0,
        )  # fmt: skip
        result.append((args, {"skip_zeros": name == "adam"}))
    return result


SAMPLES: dict[str, Callable[[torch.device | str], list[Sample]]] = {
    "quantize_blockwise": _quantize_blockwise,
    "dequantize_blockwise": _dequantize_blockwise,
    "dequantize_blockwise.out": lambda d: _dequantize_blockwise(d, out=True),
    "quantize_4bit": _quantize_4bit,
    "dequantize_4bit": _dequantize_4bit,
    "dequantize_4bit.out": lambda d: _dequantize_4bit(d, out=True),
    "gemv_4bit": _gemv_4bit,
    "gemv_4bit.out": lambda d: _gemv_4bit(d, out=True),
    "gemm_4bit": _gemm_4bit,
    "int8_vectorwise_quant": _int8_vectorwise_quant,
    "int8_vectorwise_dequant": _int8_vectorwise_dequant,
    "int8_linear_matmul": _int8_linear_matmul,
    "int8_linear_matmul.out": lambda d: _int8_linear_matmul(d, out=True),
    "int8_mm_dequant": _int8_mm_dequant,
    "int8_scaled_mm": _int8_scaled_mm,
    "int8_mixed_scaled_mm": _int8_mixed_scaled_mm,
    "int8_double_quant": _int8_double_quant,
    "optimizer_update_32bit": _optimizer_update_32bit,
    "optimizer_update_8bit_blockwise": _optimizer_update_8bit_blockwise,
}

if set(SAMPLES) != set(OPS):
    raise RuntimeError(f"samples.py is out of date with _ops.OPS: {sorted(set(OPS) ^ set(SAMPLES))}")


def samples(op: str, device: torch.device | str = "cpu") -> list[Sample]:
    """A few valid ``(args, kwargs)`` for ``torch.ops.bitsandbytes.<op>`` on ``device``."""
    if op not in SAMPLES:
        raise KeyError(f"unknown op {op!r}; known: {', '.join(SAMPLES)}")
    return SAMPLES[op](device)


# torch.library.opcheck's checks: the schema's mutation/alias annotations, the autograd registration, the
# fake kernel against the real one, and tracing through AOTAutograd with dynamic shapes (torch.compile).
OPCHECK_UTILS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


def opcheck_failures(op: str, device: torch.device | str = "cpu") -> list[str]:
    """``torch.library.opcheck`` of every sample of ``op`` on ``device``, with whatever kernel the
    dispatcher holds for it there (the reference, a backend's, or an emulated one): one line per failed
    check, empty when all pass."""
    failures = []
    for i, (args, kwargs) in enumerate(samples(op, device)):
        result = torch.library.opcheck(op_overload(op), args, kwargs, test_utils=OPCHECK_UTILS, raise_exception=False)
        failures += [f"{op} sample {i}: {check}: {got}" for check, got in result.items() if got != "SUCCESS"]
    return failures


def impl_over(lib: torch.library.Library, op: str, fn: Callable, dispatch_key: str) -> None:
    """``lib.impl``, in front of a kernel registered from Python before (the CPU backend's, the reference)
    for as long as ``lib`` lives. torch 2.13 allows that by default; 2.9 refuses it unless
    ``allow_override=True``; releases without the flag take the plain call."""
    try:
        lib.impl(op, fn, dispatch_key, allow_override=True)
    except TypeError:
        lib.impl(op, fn, dispatch_key)


@contextlib.contextmanager
def served_as_cpu_kernels(kernels: dict[str, Callable]) -> Iterator[Counter]:
    """Serve ``kernels`` (op name -> function, e.g. a GPU backend's kernels run in the emulator) as the
    ``CPU`` kernels of their ops while the block runs, through a ``torch.library.Library`` that is
    destroyed afterwards. Yields the calls per op, so a test can check that opcheck on CPU tensors ran
    these kernels and not whatever else the dispatcher holds."""
    calls: Counter = Counter()

    def counted(op: str, fn: Callable) -> Callable:
        def kernel(*args, **kwargs):
            calls[op] += 1
            return fn(*args, **kwargs)

        return kernel

    lib = torch.library.Library("bitsandbytes", "IMPL")
    try:
        for op, fn in kernels.items():
            impl_over(lib, op, counted(op, fn), "CPU")
        yield calls
    finally:
        lib._destroy()
