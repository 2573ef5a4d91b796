"""The bad-input matrix: every case is one bad call and what must happen.

Either a clear exception (type, and a message naming the argument or key) or the documented result
(NaN/Inf policy of docs/pages/formats.md: nothing raises, a non-finite value turns its whole block / row
non-finite). The conformance suite's ``test_bad_inputs`` runs every case on the device under test: the
cases make their tensors with the default device (``_device()``), which it sets with ``with device:``.
A backend's own tests can also run the cases that reach one of its ops with its functions registered
as the ``cpu`` kernels (``registered_for_cpu``, ``backend_params``, ``run_on_backend``), and call them
directly (``direct``). ``bad_input_table`` prints every row.
"""

from __future__ import annotations

import contextlib
import json
import re
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pytest
import torch

import bitsandbytes as bnb
import bitsandbytes.functional as F
from bitsandbytes._ops import SCHEMAS

from .samples import impl_over

META = torch.device("meta")
OP_NAMES = frozenset(s.split(".")[0] for s in SCHEMAS)


@dataclass(frozen=True)
class Raises:
    exc: type[BaseException] | tuple[type[BaseException], ...]
    pattern: str  # must name the argument / key


@dataclass(frozen=True)
class Gives:
    check: Callable[[Any], bool]
    what: str

    def describe(self) -> str:
        return f"result: {self.what}"


class _Direct:
    """One op of a backend's implementation table, called as ``ops.<name>(...)`` / ``ops.<name>.out(...)``."""

    def __init__(self, impls: Mapping[str, Callable], name: str):
        self._impls, self._name = impls, name

    def _get(self, key: str) -> Callable:
        if key not in self._impls:
            raise LookupError(f"the backend under test does not implement {key}")
        return self._impls[key]

    def __call__(self, *args, **kwargs):
        return self._get(self._name)(*args, **kwargs)

    @property
    def default(self) -> Callable:
        return self._get(self._name)

    @property
    def out(self) -> Callable:
        return self._get(f"{self._name}.out")


class _Ops:
    """``ops`` in the cases: ``torch.ops.bitsandbytes``, or inside ``direct(impls)`` a backend's functions
    themselves, as a third-party caller reaching them past torch's dispatcher would call them."""

    def __init__(self) -> None:
        self.impls: Mapping[str, Callable] | None = None

    def __getattr__(self, name: str):
        if self.impls is None:
            return getattr(torch.ops.bitsandbytes, name)
        return _Direct(self.impls, name)


ops = _Ops()


@contextlib.contextmanager
def direct(impls: Mapping[str, Callable]) -> Iterator[None]:
    """Route the cases' ``ops.<name>`` calls to ``impls`` (op name -> function) for the block."""
    old, ops.impls = ops.impls, impls
    try:
        yield
    finally:
        ops.impls = old


@contextlib.contextmanager
def registered_for_cpu(impls: Mapping[str, Callable]) -> Iterator[set[str]]:
    """Register ``impls`` as the ``cpu`` kernels of their ops for the block, then restore the previous
    kernels (the reference, or the CPU backend's). Yields the set of ops whose kernel was called."""
    reached: set[str] = set()

    def tracked(op: str, fn: Callable) -> Callable:
        def kernel(*args, **kwargs):
            reached.add(op.split(".")[0])
            return fn(*args, **kwargs)

        return kernel

    lib = torch.library.Library("bitsandbytes", "FRAGMENT")
    try:
        with warnings.catch_warnings():
            # Replacing the CPU backend's kernel for the block is the point; torch warns about it.
            warnings.filterwarnings("ignore", message=".*[Oo]verrid")
            for op, fn in impls.items():
                impl_over(lib, op, tracked(op, fn), "CPU")
        yield reached
    finally:
        lib._destroy()


@dataclass(frozen=True)
class Case:
    group: str
    name: str
    fn: Callable[[], Any]
    expect: Raises | Gives
    ops: frozenset[str]  # the ops whose kernels the call reaches (or would, were the arguments good)
    calls_ops: bool  # calls ``ops.<name>`` (so ``direct`` hands it to a backend's function)
    on_device: bool  # False where the tensors are on meta: torch sends those to the fake kernels
    direct: Raises | Gives | None  # what a direct call must do where torch.ops' schema converts the argument

    @property
    def id(self) -> str:
        return f"{self.group}::{self.name}"


CASES: list[Case] = []
# Facade functions named after an op other than their own name.
_FACADE_OPS = {
    "quantize_nf4": "quantize_4bit",
    "quantize_fp4": "quantize_4bit",
    "dequantize_nf4": "dequantize_4bit",
    "dequantize_fp4": "dequantize_4bit",
}


def reaches(*op_names: str, calls_ops: bool = True):
    """Mark a helper that the cases call as reaching ``op_names``."""

    def deco(fn):
        fn.reaches, fn.calls_ops = frozenset(op_names), calls_ops
        return fn

    return deco


def case(
    group: str,
    name: str,
    expect: Raises | Gives,
    via: tuple[str, ...] = (),
    on_device: bool = True,
    direct: Raises | Gives | None = None,
):
    """Add a case. Which ops it reaches is read from the names its function uses (``ops.X``, ``F.X`` for an
    op X, helpers marked with ``reaches``), plus ``via`` for a module whose forward calls the op."""

    def deco(fn):
        names = fn.__code__.co_names
        helpers = [h for h in (globals().get(n) for n in names) if hasattr(h, "reaches")]
        found = {n for n in names if n in OP_NAMES} | {_FACADE_OPS[n] for n in names if n in _FACADE_OPS}
        found |= set(via).union(*(h.reaches for h in helpers))
        calls_ops = "ops" in names or any(h.calls_ops for h in helpers)
        CASES.append(Case(group, name, fn, expect, frozenset(found), calls_ops, on_device, direct))
        return fn

    return deco


Errors = tuple[type[BaseException], ...]


def run(c: Case, expect: Raises | Gives | None = None, *, harness_errors: Errors = ()) -> str:
    """Run one case and check its expectation (``c.expect`` unless given); returns the row's outcome.
    ``harness_errors``: what the backend's test harness raises when a kernel misbehaves (the emulator's
    EmulationError: an out-of-bounds access, a deadlock, ...). Never an expected outcome, even where it
    subclasses the expected type (EmulationError is a RuntimeError); the backends' tests pass it, so the
    core's matrix does not depend on the emulator."""
    expect = expect or c.expect
    if isinstance(expect, Raises):
        try:
            c.fn()
        except harness_errors:
            raise
        except expect.exc as e:
            message = str(e)
            assert re.search(expect.pattern, message), f"message does not name {expect.pattern!r}: {message}"
            return f"raises: {type(e).__name__}"
        raise AssertionError(f"{c.id}: expected {expect.exc}, nothing was raised")
    result = c.fn()
    assert expect.check(result), f"{c.id}: expected {expect.what}"
    return expect.describe()


def local_case(group: str, name: str, fn: Callable[[], Any], expect: Raises | Gives) -> Case:
    """A case of one backend's own (not in CASES), for ``run``."""
    return Case(group, name, fn, expect, frozenset(), False, True, None)


def for_backend(impls: Mapping[str, Callable]) -> list[Case]:
    """The cases that reach an op ``impls`` implements on a device (those are the backend's rows)."""
    implemented = {op.split(".")[0] for op in impls}
    return [c for c in CASES if c.on_device and c.ops & implemented]


# How a backend's rows call it: through torch.ops.bitsandbytes with its functions registered as the kernels
# (the facade's checks in front, as users call it), and its functions called directly (no dispatcher: as a
# third-party caller reaching them would, with nothing in front of the backend's own checks).
MODES = ("torch.ops", "direct")


def backend_params(impls: Mapping[str, Callable]) -> list:
    return [
        pytest.param(c, mode, id=f"{mode}::{c.id}")
        for c in for_backend(impls)
        for mode in MODES
        if mode == "torch.ops" or c.calls_ops
    ]


def run_on_backend(
    c: Case, mode: str, impls: Mapping[str, Callable], reached: set[str], *, harness_errors: Errors = ()
) -> str:
    """``run`` with ``impls`` as the kernels (``registered_for_cpu`` active, its set is ``reached``)."""
    if mode == "direct":
        with direct(impls):
            return run(c, c.direct, harness_errors=harness_errors)
    reached.clear()
    outcome = run(c, harness_errors=harness_errors)
    # A result is only evidence about the backend if its kernels computed it.
    assert not isinstance(c.expect, Gives) or reached & c.ops, f"{c.id}: no kernel of the backend was called"
    return outcome


def _device() -> torch.device:
    """Where the cases make their tensors and modules: the default device (cpu unless a ``with device:``)."""
    return torch.get_default_device()


def _x(*shape, dtype=torch.float32):
    # Drawn on the CPU, so every device sees the same values.
    g = torch.Generator().manual_seed(0)
    return torch.randn(*shape, generator=g, device=_device()).to(dtype).to(_device())


def _q4(quant_type="nf4", blocksize=64, shape=(8, 64), dtype=torch.float32):
    return F.quantize_4bit(_x(*shape, dtype=dtype), blocksize=blocksize, quant_type=quant_type)


def _q8(shape=(4, 64)):
    return F.quantize_blockwise(_x(*shape), blocksize=64)


def _code():
    return F.create_dynamic_map(signed=True)


def _qs_dict(**changes):
    _, qs = _q4()
    d = qs.as_dict(packed=True)
    for k, v in changes.items():
        if v is _DROP:
            d.pop(k)
        else:
            d[k] = v
    return d


_DROP = object()
_PACKED = "quant_state.bitsandbytes__nf4"


def _blob(obj_or_bytes) -> torch.Tensor:
    raw = obj_or_bytes if isinstance(obj_or_bytes, bytes) else json.dumps(obj_or_bytes).encode()
    return torch.tensor(list(raw), dtype=torch.uint8)


def _packed_items():
    _, qs = _q4()
    d = qs.as_dict(packed=True)
    return json.loads(bytes(d[_PACKED].tolist()).decode())


def _all_nonfinite_block(out: torch.Tensor, blocksize: int, block: int) -> bool:
    flat = out.reshape(-1).float()
    inside = flat[block * blocksize : (block + 1) * blocksize]
    others = torch.cat([flat[: block * blocksize], flat[(block + 1) * blocksize :]])
    return bool((~torch.isfinite(inside)).all() and torch.isfinite(others).all())


@reaches("quantize_4bit", "dequantize_4bit", calls_ops=False)
def _nan_roundtrip_4bit(value: float, quant_type: str) -> torch.Tensor:
    A = _x(4, 64)
    A[1, 3] = value  # block 1 of 4 at blocksize 64
    q, qs = F.quantize_4bit(A, blocksize=64, quant_type=quant_type)
    return F.dequantize_4bit(q, qs)


@reaches("quantize_blockwise", "dequantize_blockwise", calls_ops=False)
def _nan_roundtrip_8bit(value: float) -> torch.Tensor:
    A = _x(4, 64)
    A[2, 5] = value
    q, qs = F.quantize_blockwise(A, blocksize=64)
    return F.dequantize_blockwise(q, qs)


@reaches("int8_vectorwise_quant", calls_ops=False)
def _int8_row_nonfinite(value: float) -> bool:
    A = _x(4, 16, dtype=torch.float16)
    A[1, 2] = value
    _, stats, _ = F.int8_vectorwise_quant(A)
    ok_rows = torch.isfinite(stats[[0, 2, 3]]).all()
    return bool(ok_rows and not torch.isfinite(stats[1]))


def _opt_args(name="adam", n=64, dtype=torch.float32, **kw):
    g, p = _x(n, dtype=dtype), _x(n, dtype=dtype)
    s1, s2 = torch.zeros(n), torch.zeros(n)
    args = dict(optimizer_name=name, g=g, p=p, state1=s1, beta1=0.9, eps=1e-8, step=1, lr=1e-3, state2=s2, beta2=0.999)
    args.update(kw)
    return args


def _opt8_args(name="adam", n=256, **kw):
    g, p = _x(n), _x(n)
    s1, s2 = torch.zeros(n, dtype=torch.uint8), torch.zeros(n, dtype=torch.uint8)
    args = dict(
        optimizer_name=name, g=g, p=p, state1=s1, state2=s2, beta1=0.9, beta2=0.999, beta3=0.0, alpha=0.0,
        eps=1e-8, step=1, lr=1e-3, qmap1=F.create_dynamic_map(True), qmap2=F.create_dynamic_map(False),
        absmax1=torch.zeros(1), absmax2=torch.zeros(1),
    )  # fmt: skip
    args.update(kw)
    return args


def _overlapping(n=64):
    # 8 rows that all alias the same 64 elements: not contiguous, overlapping memory.
    return _x(n).as_strided((8, n), (0, 1))


# ---- quantize_4bit / dequantize_4bit (functional and op) -------------------------------------------------
case("quantize_4bit", "int dtype", Raises(TypeError, r"\bA\b"))(
    lambda: F.quantize_4bit(torch.ones(64, dtype=torch.int32))
)
case("quantize_4bit", "float64 dtype", Raises(TypeError, r"\bA\b"))(lambda: F.quantize_4bit(_x(64).double()))
case("quantize_4bit", "not a tensor", Raises(TypeError, r"\bA\b"))(lambda: F.quantize_4bit([1.0] * 64))
case("quantize_4bit", "blocksize 100", Raises(ValueError, "blocksize"))(lambda: F.quantize_4bit(_x(64), blocksize=100))
case("quantize_4bit", "blocksize 0", Raises(ValueError, "blocksize"))(lambda: F.quantize_4bit(_x(64), blocksize=0))
case("quantize_4bit", "blocksize True", Raises(ValueError, "blocksize"))(
    lambda: F.quantize_4bit(_x(64), blocksize=True)
)
case("quantize_4bit", "quant_type int4", Raises(ValueError, "quant_type"))(
    lambda: F.quantize_4bit(_x(64), quant_type="int4")
)
case("quantize_4bit", "quant_type NF4 (case)", Raises(ValueError, "quant_type"))(
    lambda: F.quantize_4bit(_x(64), quant_type="NF4")
)
case("quantize_4bit", "quant_storage int64", Raises(TypeError, "quant_storage"))(
    lambda: F.quantize_4bit(_x(64), quant_storage=torch.int64)
)
case("quantize_4bit", "absmax out wrong length", Raises(ValueError, "absmax"))(
    lambda: F.quantize_4bit(_x(128), blocksize=64, absmax=torch.empty(3))
)
case("op quantize_4bit", "int dtype", Raises(TypeError, r"\bA\b"))(
    lambda: ops.quantize_4bit(torch.ones(64, dtype=torch.int32), 64, "nf4", torch.uint8)
)
case("op quantize_4bit", "blocksize 48", Raises(ValueError, "blocksize"))(
    lambda: ops.quantize_4bit(_x(64), 48, "nf4", torch.uint8)
)
case("op quantize_4bit", "quant_type xx", Raises(ValueError, "quant_type"))(
    lambda: ops.quantize_4bit(_x(64), 64, "xx", torch.uint8)
)
case("op quantize_4bit", "zero-size", Gives(lambda r: r[0].numel() == 0 and r[1].numel() == 0, "empty codes+absmax"))(
    lambda: ops.quantize_4bit(torch.empty(0), 64, "nf4", torch.uint8)
)
case(
    "quantize_4bit",
    "non-contiguous view",
    Gives(
        lambda r: torch.equal(F.dequantize_4bit(*r), F.dequantize_4bit(*F.quantize_4bit(_x(64, 8).t().contiguous()))),
        "same as contiguous copy",
    ),
)(lambda: F.quantize_4bit(_x(64, 8).t()))
case(
    "quantize_4bit",
    "overlapping view",
    Gives(
        lambda r: torch.equal(F.dequantize_4bit(*r), F.dequantize_4bit(*F.quantize_4bit(_overlapping().contiguous()))),
        "same as contiguous copy",
    ),
)(lambda: F.quantize_4bit(_overlapping()))
for _qt in ("nf4", "fp4"):
    case(
        "NaN/Inf policy",
        f"4bit {_qt} NaN -> block non-finite",
        Gives(lambda out: _all_nonfinite_block(out, 64, 1), "block NaN, others finite"),
    )(lambda _qt=_qt: _nan_roundtrip_4bit(float("nan"), _qt))
    case(
        "NaN/Inf policy",
        f"4bit {_qt} +Inf -> block non-finite",
        Gives(lambda out: _all_nonfinite_block(out, 64, 1), "block non-finite, others finite"),
    )(lambda _qt=_qt: _nan_roundtrip_4bit(float("inf"), _qt))
case(
    "NaN/Inf policy",
    "8bit NaN -> block non-finite",
    Gives(lambda out: _all_nonfinite_block(out, 64, 2), "block NaN, others finite"),
)(lambda: _nan_roundtrip_8bit(float("nan")))
case(
    "NaN/Inf policy",
    "8bit -Inf -> block non-finite",
    Gives(lambda out: _all_nonfinite_block(out, 64, 2), "block non-finite, others finite"),
)(lambda: _nan_roundtrip_8bit(float("-inf")))
case("NaN/Inf policy", "int8 row NaN -> row stats non-finite", Gives(bool, "row stat NaN, others finite"))(
    lambda: _int8_row_nonfinite(float("nan"))
)
case("NaN/Inf policy", "int8 row Inf -> row stats non-finite", Gives(bool, "row stat Inf, others finite"))(
    lambda: _int8_row_nonfinite(float("inf"))
)

case("dequantize_4bit", "absmax too short", Raises(ValueError, "absmax"))(
    lambda: ops.dequantize_4bit(_q4()[0], torch.ones(3), 64, "nf4", [8, 64], torch.float32)
)
case("dequantize_4bit", "absmax float16", Raises(TypeError, "absmax"))(
    lambda: ops.dequantize_4bit(_q4()[0], _q4()[1].absmax.half(), 64, "nf4", [8, 64], torch.float32)
)
case("dequantize_4bit", "codes shorter than shape", Raises(ValueError, r"\bA\b"))(
    lambda: ops.dequantize_4bit(_q4()[0][:10], _q4()[1].absmax, 64, "nf4", [8, 64], torch.float32)
)
case("dequantize_4bit", "absmax on meta", Raises(ValueError, "absmax"))(
    lambda: ops.dequantize_4bit(_q4()[0], _q4()[1].absmax.to(META), 64, "nf4", [8, 64], torch.float32)
)
case("dequantize_4bit", "dtype int8", Raises(TypeError, "dtype"))(
    lambda: ops.dequantize_4bit(_q4()[0], _q4()[1].absmax, 64, "nf4", [8, 64], torch.int8)
)
case("dequantize_4bit", "negative shape", Raises(ValueError, "shape"))(
    lambda: ops.dequantize_4bit(_q4()[0], _q4()[1].absmax, 64, "nf4", [-8, 64], torch.float32)
)
case("dequantize_4bit", "out wrong shape", Raises(ValueError, "out"))(
    lambda: F.dequantize_4bit(_q4()[0], _q4()[1], out=torch.empty(3, 3))
)
case("dequantize_4bit", "out wrong dtype", Raises((TypeError, ValueError), "out"))(
    lambda: F.dequantize_4bit(_q4()[0], _q4()[1], out=torch.empty(8, 64, dtype=torch.int32))
)
case("dequantize_4bit", "quant_state not a QuantState", Raises(TypeError, "quant_state"))(
    lambda: F.dequantize_4bit(_q4()[0], quant_state={"absmax": 1})
)
case("dequantize_4bit", "no quant_state and no absmax", Raises((TypeError, ValueError), "absmax|quant_state"))(
    lambda: F.dequantize_4bit(_q4()[0])
)

# ---- blockwise 8-bit -------------------------------------------------------------------------------
case("quantize_blockwise", "int dtype", Raises(TypeError, r"\bA\b"))(
    lambda: F.quantize_blockwise(torch.ones(64, dtype=torch.int64))
)
# Any positive block size is valid for the 8-bit blockwise ops (as upstream's CPU path); 0 is not.
case("quantize_blockwise", "blocksize 0", Raises(ValueError, "blocksize"))(
    lambda: F.quantize_blockwise(_x(64), blocksize=0)
)
case("quantize_blockwise", "code wrong length", Raises(ValueError, "code"))(
    lambda: ops.quantize_blockwise(_x(64), torch.linspace(-1, 1, 10), 64)
)
case("quantize_blockwise", "code float16", Raises(TypeError, "code"))(
    lambda: ops.quantize_blockwise(_x(64), _code().half(), 64)
)
case("quantize_blockwise", "code on meta", Raises(ValueError, "code"))(
    lambda: ops.quantize_blockwise(_x(64), _code().to(META), 64)
)
case("dequantize_blockwise", "codes int8", Raises(TypeError, r"\bA\b"))(
    lambda: ops.dequantize_blockwise(_q8()[0].to(torch.int8), _q8()[1].absmax, _code(), 64, torch.float32)
)
case("dequantize_blockwise", "absmax too short", Raises(ValueError, "absmax"))(
    lambda: ops.dequantize_blockwise(_q8()[0], torch.ones(1), _code(), 64, torch.float32)
)
case("dequantize_blockwise", "absmax int32", Raises(TypeError, "absmax"))(
    lambda: ops.dequantize_blockwise(_q8()[0], torch.ones(4, dtype=torch.int32), _code(), 64, torch.float32)
)
case("dequantize_blockwise", "absmax on meta", Raises(ValueError, "absmax"))(
    lambda: ops.dequantize_blockwise(_q8()[0], _q8()[1].absmax.to(META), _code(), 64, torch.float32)
)
case(
    "dequantize_blockwise",
    "non-contiguous codes",
    Gives(
        lambda r: torch.equal(
            r, ops.dequantize_blockwise(_q8()[0].t().contiguous(), _q8()[1].absmax, _code(), 64, torch.float32)
        ),
        "same as contiguous copy",
    ),
)(lambda: ops.dequantize_blockwise(_q8()[0].t(), _q8()[1].absmax, _code(), 64, torch.float32))
case("dequantize_blockwise", "zero-size", Gives(lambda r: r.numel() == 0, "empty"))(
    lambda: ops.dequantize_blockwise(torch.empty(0, dtype=torch.uint8), torch.empty(0), _code(), 64, torch.float32)
)


# ---- gemv / gemm 4-bit --------------------------------------------------------------------------------
@reaches("gemv_4bit")
def _gemv(**kw):
    B, qs = _q4(shape=(16, 64))
    args = dict(A=_x(1, 64), B=B, shapeB=[16, 64], absmax=qs.absmax, code=qs.code, blocksize=64)
    args.update(kw)
    return ops.gemv_4bit(**args)


case("op gemv_4bit", "A int32", Raises(TypeError, r"\bA\b"))(lambda: _gemv(A=torch.ones(1, 64, dtype=torch.int32)))
case("op gemv_4bit", "A inner dim mismatch", Raises(ValueError, r"\bA\b|shapeB"))(lambda: _gemv(A=_x(1, 32)))
case("op gemv_4bit", "A on meta", Raises(ValueError, r"\bA\b|device"))(lambda: _gemv(A=_x(1, 64).to(META)))
case("op gemv_4bit", "absmax too short", Raises(ValueError, "absmax"))(lambda: _gemv(absmax=torch.ones(2)))
case("op gemv_4bit", "code wrong length", Raises(ValueError, "code"))(lambda: _gemv(code=torch.ones(5)))
case("op gemv_4bit", "blocksize 7", Raises(ValueError, "blocksize"))(lambda: _gemv(blocksize=7))
case("op gemv_4bit", "B shorter than shapeB", Raises(ValueError, r"\bB\b"))(lambda: _gemv(B=_q4(shape=(16, 64))[0][:5]))
case("op gemv_4bit", "B longer than shapeB", Raises(ValueError, r"\bB holds 513 bytes.*exactly 512"))(
    lambda: _gemv(B=torch.cat([_q4(shape=(16, 64))[0], _q4(shape=(16, 64))[0][:1]]))
)
case("gemv_4bit", "quant_state missing", Raises((TypeError, ValueError), "state"))(
    lambda: F.gemv_4bit(_x(1, 64), _q4()[0], state=None)
)


@reaches("gemm_4bit")
def _gemm(**kw):
    B, qs = _q4(shape=(16, 64))
    args = dict(A=_x(2, 64), B=B, shapeB=[16, 64], absmax=qs.absmax, blocksize=64, quant_type="nf4")
    args.update(kw)
    return ops.gemm_4bit(**args)


case("op gemm_4bit", "A float64", Raises(TypeError, r"\bA\b"))(lambda: _gemm(A=_x(2, 64).double()))
case("op gemm_4bit", "quant_type bad", Raises(ValueError, "quant_type"))(lambda: _gemm(quant_type="nf5"))
case("op gemm_4bit", "bias wrong length", Raises(ValueError, "bias"))(lambda: _gemm(bias=torch.ones(3)))
case("op gemm_4bit", "absmax too long", Raises(ValueError, "absmax"))(lambda: _gemm(absmax=torch.ones(99)))
case("op gemm_4bit", "B the float weight, not its codes", Raises(ValueError, r"\bB holds 4096 bytes.*exactly 512"))(
    lambda: _gemm(B=_x(16, 64))
)

# ---- int8 -------------------------------------------------------------------------------------------
case("int8_vectorwise_quant", "int dtype", Raises(TypeError, r"\bA\b"))(
    lambda: F.int8_vectorwise_quant(torch.ones(4, 4, dtype=torch.int8))
)
case("int8_vectorwise_quant", "negative threshold", Raises(ValueError, "threshold"))(
    lambda: F.int8_vectorwise_quant(_x(4, 4).half(), threshold=-1.0)
)
case("int8_vectorwise_quant", "zero-size rows", Gives(lambda r: r[0].shape == (0, 4) and r[1].numel() == 0, "empty"))(
    lambda: F.int8_vectorwise_quant(torch.empty(0, 4, dtype=torch.float16))
)
case("int8_vectorwise_dequant", "stats wrong length", Raises(ValueError, "stats"))(
    lambda: F.int8_vectorwise_dequant(torch.ones(4, 4, dtype=torch.int8), torch.ones(3))
)
case("int8_vectorwise_dequant", "A float", Raises(TypeError, r"\bA\b"))(
    lambda: F.int8_vectorwise_dequant(torch.ones(4, 4), torch.ones(4))
)
case("int8_linear_matmul", "A float16", Raises(TypeError, r"\bA\b"))(
    lambda: F.int8_linear_matmul(torch.ones(4, 8, dtype=torch.float16), torch.ones(3, 8, dtype=torch.int8))
)
case("int8_linear_matmul", "inner dim mismatch", Raises(ValueError, r"\bA\b|\bB\b"))(
    lambda: F.int8_linear_matmul(torch.ones(4, 8, dtype=torch.int8), torch.ones(3, 5, dtype=torch.int8))
)
case("int8_linear_matmul", "B 1-D", Raises(ValueError, r"\bB\b"))(
    lambda: F.int8_linear_matmul(torch.ones(4, 8, dtype=torch.int8), torch.ones(8, dtype=torch.int8))
)
case("int8_linear_matmul", "B on meta", Raises(ValueError, r"\bB\b"))(
    lambda: F.int8_linear_matmul(torch.ones(4, 8, dtype=torch.int8), torch.ones(3, 8, dtype=torch.int8, device=META))
)
case("int8_linear_matmul", "out wrong dtype", Raises(TypeError, "out"))(
    lambda: F.int8_linear_matmul(
        torch.ones(4, 8, dtype=torch.int8), torch.ones(3, 8, dtype=torch.int8), out=torch.empty(4, 3)
    )
)
case("int8_mm_dequant", "row_stats wrong length", Raises(ValueError, "row_stats"))(
    lambda: F.int8_mm_dequant(torch.ones(4, 3, dtype=torch.int32), torch.ones(5), torch.ones(3))
)
case("int8_mm_dequant", "col_stats float16", Raises(TypeError, "col_stats"))(
    lambda: F.int8_mm_dequant(torch.ones(4, 3, dtype=torch.int32), torch.ones(4), torch.ones(3).half())
)
case("int8_mm_dequant", "A int8", Raises(TypeError, r"\bA\b"))(
    lambda: F.int8_mm_dequant(torch.ones(4, 3, dtype=torch.int8), torch.ones(4), torch.ones(3))
)


def _i8(*shape):
    return torch.ones(*shape, dtype=torch.int8)


case("op int8_scaled_mm", "row_stats wrong length", Raises(ValueError, "row_stats"))(
    lambda: ops.int8_scaled_mm(_i8(4, 8), _i8(3, 8), torch.ones(2), torch.ones(3))
)
case("op int8_scaled_mm", "A float32", Raises(TypeError, r"\bA\b"))(
    lambda: ops.int8_scaled_mm(torch.ones(4, 8), _i8(3, 8), torch.ones(4), torch.ones(3))
)
case("op int8_scaled_mm", "dtype int32", Raises(TypeError, "dtype"))(
    lambda: ops.int8_scaled_mm(_i8(4, 8), _i8(3, 8), torch.ones(4), torch.ones(3), dtype=torch.int32)
)
case("op int8_scaled_mm", "bias on meta", Raises(ValueError, "bias"))(
    lambda: ops.int8_scaled_mm(_i8(4, 8), _i8(3, 8), torch.ones(4), torch.ones(3), bias=torch.ones(3, device=META))
)
case("op int8_mixed_scaled_mm", "A/CA shape mismatch", Raises(ValueError, r"\bCA\b"))(
    lambda: ops.int8_mixed_scaled_mm(_x(4, 4).half(), _i8(4, 8), _i8(3, 8), torch.ones(4), torch.ones(3))
)
case("op int8_mixed_scaled_mm", "outlier_cols float", Raises(TypeError, "outlier_cols"))(
    lambda: ops.int8_mixed_scaled_mm(_x(4, 8).half(), _i8(4, 8), _i8(3, 8), torch.ones(4), torch.ones(3), torch.ones(2))
)


@reaches("int8_mixed_scaled_mm")
def _mixed(cols: torch.Tensor):
    return ops.int8_mixed_scaled_mm(_x(4, 8).half(), _i8(4, 8), _i8(3, 8), torch.ones(4), torch.ones(3), cols)


# Regression: an index past K used to surface as torch's IndexError naming no argument (and on a GPU it
# would be a device-side assert); outlier_cols are columns of A, so a negative one is refused too.
case("out-of-range codes", "outlier_cols index past K", Raises(ValueError, "outlier_cols"))(
    lambda: _mixed(torch.tensor([999]))
)
case("out-of-range codes", "outlier_cols index K", Raises(ValueError, "outlier_cols"))(
    lambda: _mixed(torch.tensor([1, 8], dtype=torch.int32))
)
case("out-of-range codes", "outlier_cols negative", Raises(ValueError, "outlier_cols"))(
    lambda: _mixed(torch.tensor([-1]))
)
case(
    "out-of-range codes",
    "outlier_cols last column",
    Gives(lambda r: torch.equal(r[1], _x(4, 8).half()[:, [7]]), "subA is A's column 7"),
)(lambda: _mixed(torch.tensor([7])))
case("int8_double_quant", "A int", Raises(TypeError, r"\bA\b"))(
    lambda: F.int8_double_quant(torch.ones(4, 4, dtype=torch.int32))
)

# ---- optimizer updates ------------------------------------------------------------------------------
case("optimizer_update_32bit", "name 'adamw2'", Raises(ValueError, "optimizer_name"))(
    lambda: F.optimizer_update_32bit(**_opt_args(name="adamw2"))
)
case("optimizer_update_32bit", "name None", Raises((TypeError, ValueError), "optimizer_name"))(
    lambda: F.optimizer_update_32bit(**_opt_args(name=None))
)
case("optimizer_update_32bit", "g/p dtype mismatch", Raises(TypeError, r"\bg\b|\bp\b"))(
    lambda: F.optimizer_update_32bit(**_opt_args(g=_x(64).half()))
)
case("optimizer_update_32bit", "state1 wrong length", Raises(ValueError, "state1"))(
    lambda: F.optimizer_update_32bit(**_opt_args(state1=torch.zeros(10)))
)
case("optimizer_update_32bit", "state1 float16", Raises(TypeError, "state1"))(
    lambda: F.optimizer_update_32bit(**_opt_args(state1=torch.zeros(64).half()))
)
case("optimizer_update_32bit", "adam without state2", Raises(ValueError, "state2"))(
    lambda: F.optimizer_update_32bit(**_opt_args(state2=None))
)
case("optimizer_update_32bit", "p on meta", Raises(ValueError, r"\bp\b|\bg\b"))(
    lambda: F.optimizer_update_32bit(**_opt_args(p=_x(64).to(META)))
)
case("optimizer_update_32bit", "step 'one'", Raises(TypeError, "step"))(
    lambda: F.optimizer_update_32bit(**_opt_args(step="one"))
)
case("optimizer_update_32bit", "lr as string", Raises(TypeError, r"\blr\b"))(
    lambda: F.optimizer_update_32bit(**_opt_args(lr="0.1"))
)
case("optimizer_update_8bit_blockwise", "name 'sgd2'", Raises(ValueError, "optimizer_name"))(
    lambda: F.optimizer_update_8bit_blockwise(**_opt8_args(name="sgd2"))
)
case("optimizer_update_8bit_blockwise", "absmax1 too short", Raises(ValueError, "absmax1"))(
    lambda: F.optimizer_update_8bit_blockwise(**_opt8_args(n=512))
)
case("optimizer_update_8bit_blockwise", "state1 float32", Raises(TypeError, "state1"))(
    lambda: F.optimizer_update_8bit_blockwise(**_opt8_args(state1=torch.zeros(256)))
)
case("optimizer_update_8bit_blockwise", "qmap1 wrong length", Raises(ValueError, "qmap1"))(
    lambda: F.optimizer_update_8bit_blockwise(**_opt8_args(qmap1=torch.zeros(7)))
)
case("percentile_clipping", "gnorm_vec wrong length", Raises(ValueError, "gnorm_vec"))(
    lambda: F.percentile_clipping(_x(10), torch.zeros(5), step=1)
)


@reaches("optimizer_update_32bit")
def _opt32_op(**kw) -> torch.Tensor:
    """The op itself (no facade), with every argument; returns p after the step."""
    a = dict(
        optimizer_name="adam", g=_x(64), p=_x(64) * 2, state1=torch.zeros(64), state2=torch.zeros(64),
        unorm_vec=None, max_unorm=0.0, param_norm=0.0, beta1=0.9, beta2=0.999, beta3=0.0, alpha=0.0, eps=1e-8,
        weight_decay=0.0, step=1, lr=1e-3, gnorm_scale=1.0,
    )  # fmt: skip
    a.update(kw)
    ops.optimizer_update_32bit(**a)
    return a["p"]


@reaches("optimizer_update_8bit_blockwise")
def _opt8_op(**kw) -> torch.Tensor:
    a = _opt8_args()
    a.update(weight_decay=0.0, gnorm_scale=1.0)
    a.update(kw)
    ops.optimizer_update_8bit_blockwise(**a)
    return a["p"]


def _at_offset(t: torch.Tensor, offset: int = 1) -> torch.Tensor:
    """The same values, contiguous, at an odd storage offset (a view whose pointer is not aligned)."""
    flat = torch.cat([t.new_zeros(offset), t.reshape(-1)])
    return flat[offset:].view(t.shape)


case("op optimizer_update_32bit", "p not contiguous", Raises(ValueError, r"\bp\b"))(lambda: _opt32_op(p=_x(128)[::2]))
case("op optimizer_update_32bit", "g overlapping (stride 0)", Raises(ValueError, r"\bg\b"))(
    lambda: _opt32_op(g=_x(8).expand(8, 8), p=_x(8, 8), state1=torch.zeros(8, 8), state2=torch.zeros(8, 8))
)
case("op optimizer_update_32bit", "max_unorm > 0 without unorm_vec", Raises(ValueError, "unorm_vec"))(
    lambda: _opt32_op(max_unorm=1.0, param_norm=1.0)
)
case("op optimizer_update_32bit", "unorm_vec of 3", Raises(ValueError, "unorm_vec"))(
    lambda: _opt32_op(unorm_vec=torch.ones(3), max_unorm=1.0, param_norm=1.0)
)
case("op optimizer_update_32bit", "step 0", Raises(ValueError, "step"))(lambda: _opt32_op(step=0))
case("op optimizer_update_32bit", "zero-size", Gives(lambda p: p.numel() == 0, "no-op"))(
    lambda: _opt32_op(g=torch.empty(0), p=torch.empty(0), state1=torch.empty(0), state2=torch.empty(0))
)
case(
    "op optimizer_update_32bit",
    "zero-size with max_unorm",
    Gives(lambda p: p.numel() == 0, "no-op"),
)(
    lambda: _opt32_op(
        g=torch.empty(0),
        p=torch.empty(0),
        state1=torch.empty(0),
        state2=torch.empty(0),
        unorm_vec=torch.ones(1),
        max_unorm=1.0,
        param_norm=1.0,
    )
)
case(
    "op optimizer_update_32bit",
    "views at an odd offset",
    Gives(lambda p: torch.equal(p, _opt32_op()), "same step as aligned tensors"),
)(lambda: _opt32_op(g=_at_offset(_x(64)), p=_at_offset(_x(64) * 2), state1=_at_offset(torch.zeros(64))))
case("op optimizer_update_32bit", "lr as a string", Raises((TypeError, RuntimeError), r"\blr\b"))(
    lambda: _opt32_op(lr="0.001")
)
# torch.ops' schema reads a one-element tensor given for a float; the kernel functions take numbers only.
case(
    "op optimizer_update_8bit_blockwise",
    "lr as a 0-d tensor",
    Gives(lambda p: torch.equal(p, _opt8_op(lr=0.25)), "the step of lr=0.25"),
    direct=Raises(TypeError, r"\blr\b"),
)(lambda: _opt8_op(lr=torch.tensor(0.25)))
case(
    "op optimizer_update_8bit_blockwise",
    "qmap1 of shape [16, 16]",
    Gives(lambda p: torch.equal(p, _opt8_op()), "same step as the flat map"),
)(lambda: _opt8_op(qmap1=F.create_dynamic_map(True).view(16, 16)))
case("op optimizer_update_8bit_blockwise", "p not contiguous", Raises(ValueError, r"\bp\b"))(
    lambda: _opt8_op(p=_x(512)[::2])
)
case("op optimizer_update_8bit_blockwise", "state1 not contiguous", Raises(ValueError, "state1"))(
    lambda: _opt8_op(state1=torch.zeros(512, dtype=torch.uint8)[::2])
)
case("op optimizer_update_8bit_blockwise", "absmax2 too short", Raises(ValueError, "absmax2"))(
    lambda: _opt8_op(absmax2=torch.zeros(0))
)
case("op optimizer_update_8bit_blockwise", "zero-size", Gives(lambda p: p.numel() == 0, "no-op"))(
    lambda: _opt8_op(
        g=torch.empty(0),
        p=torch.empty(0),
        state1=torch.empty(0, dtype=torch.uint8),
        state2=torch.empty(0, dtype=torch.uint8),
        absmax1=torch.empty(0),
        absmax2=torch.empty(0),
    )
)
case(
    "op optimizer_update_8bit_blockwise",
    "qmap1 not contiguous",
    Gives(lambda p: torch.equal(p, _opt8_op()), "same step as a contiguous map"),
)(lambda: _opt8_op(qmap1=F.create_dynamic_map(True).repeat_interleave(2)[::2]))


# ---- maps ---------------------------------------------------------------------------------------------
case("create_dynamic_map", "total_bits 0", Raises(ValueError, "total_bits"))(lambda: F.create_dynamic_map(total_bits=0))
case("create_dynamic_map", "signed 'yes'", Raises(TypeError, "signed"))(lambda: F.create_dynamic_map(signed="yes"))
case("create_linear_map", "total_bits 99", Raises(ValueError, "total_bits"))(lambda: F.create_linear_map(total_bits=99))
case("get_4bit_type", "typename int3", Raises(ValueError, "typename|int3"))(lambda: F.get_4bit_type("int3"))

case("create_fp8_map", "exponent+precision > total_bits", Raises(ValueError, "bits"))(
    lambda: F.create_fp8_map(exponent_bits=6, precision_bits=5, total_bits=8)
)
case("create_normal_map", "offset 1.5", Raises(ValueError, "offset"))(lambda: F.create_normal_map(offset=1.5))
case("quantize_nf4", "blocksize 5", Raises(ValueError, "blocksize"))(lambda: F.quantize_nf4(_x(64), blocksize=5))
case("quantize_fp4", "int dtype", Raises(TypeError, r"\bA\b"))(
    lambda: F.quantize_fp4(torch.ones(64, dtype=torch.int16))
)
# As upstream: a given quant_state's own quant_type wins over the function's name.
case(
    "dequantize_nf4",
    "fp4 state",
    Gives(lambda r: torch.equal(r, F.dequantize_4bit(*_q4("fp4"))), "decoded as fp4 (the state's type)"),
)(lambda: F.dequantize_nf4(*_q4("fp4")))
case("dequantize_fp4", "absmax on meta", Raises(ValueError, "absmax"))(
    lambda: F.dequantize_fp4(_q4("fp4")[0], absmax=_q4("fp4")[1].absmax.to(META), blocksize=64)
)
case("get_paged", "negative size", Raises((ValueError, RuntimeError), "negative|shape|size"))(lambda: F.get_paged(-4))
case("prefetch_tensor", "not a tensor", Raises(TypeError, r"\bA\b"))(lambda: F.prefetch_tensor([1, 2]))

# ---- .out overloads ------------------------------------------------------------------------------------
case("op dequantize_4bit.out", "out wrong shape", Raises(ValueError, "out"))(
    lambda: ops.dequantize_4bit.out(_q4()[0], _q4()[1].absmax, 64, "nf4", [8, 64], torch.float32, torch.empty(4, 4))
)
case("op dequantize_4bit.out", "out on meta", Raises(ValueError, "out"))(
    lambda: ops.dequantize_4bit.out(
        _q4()[0], _q4()[1].absmax, 64, "nf4", [8, 64], torch.float32, torch.empty(8, 64, device=META)
    )
)
case("op dequantize_blockwise.out", "out wrong dtype", Raises(TypeError, "out"))(
    lambda: ops.dequantize_blockwise.out(
        _q8()[0], _q8()[1].absmax, _code(), 64, torch.float32, torch.empty(4, 64, dtype=torch.float16)
    )
)
case("op gemv_4bit.out", "out wrong shape", Raises(ValueError, "out"))(
    lambda: ops.gemv_4bit.out(
        _x(1, 64), _q4(shape=(16, 64))[0], [16, 64], _q4(shape=(16, 64))[1].absmax, _q4()[1].code, 64, torch.empty(1, 3)
    )
)
case("op dequantize_4bit.out", "out not contiguous", Raises(ValueError, "out"))(
    lambda: ops.dequantize_4bit.out(
        _q4()[0], _q4()[1].absmax, 64, "nf4", [8, 64], torch.float32, torch.empty(64, 8).t()
    )
)
case("op dequantize_4bit.out", "out overlapping (stride 0)", Raises(ValueError, "out"))(
    lambda: ops.dequantize_4bit.out(
        _q4()[0], _q4()[1].absmax, 64, "nf4", [8, 64], torch.float32, torch.empty(64).expand(8, 64)
    )
)
case("op dequantize_blockwise.out", "out not contiguous", Raises(ValueError, "out"))(
    lambda: ops.dequantize_blockwise.out(_q8()[0], _q8()[1].absmax, _code(), 64, torch.float32, torch.empty(64, 4).t())
)
case("op gemv_4bit.out", "out not contiguous", Raises(ValueError, "out"))(
    lambda: ops.gemv_4bit.out(
        _x(2, 64),
        _q4(shape=(16, 64))[0],
        [16, 64],
        _q4(shape=(16, 64))[1].absmax,
        _q4()[1].code,
        64,
        torch.empty(16, 2).t(),
    )
)
case("op int8_linear_matmul.out", "out wrong shape", Raises(ValueError, "out"))(
    lambda: ops.int8_linear_matmul.out(_i8(4, 8), _i8(3, 8), torch.empty(4, 4, dtype=torch.int32))
)


# An out that shares memory with an input: the kernel would read values it has already overwritten.
def _gemv_out_is_A():
    A = _x(1, 64)
    B, qs = _q4(shape=(64, 64))
    ops.gemv_4bit.out(A, B, [64, 64], qs.absmax, qs.code, 64, A)


def _dequant8_out_over_absmax():
    q, qs = _q8()
    buf = torch.zeros(q.numel() + 64)
    absmax = buf[: qs.absmax.numel()]
    absmax.copy_(qs.absmax)
    ops.dequantize_blockwise.out(q, absmax, _code(), 64, torch.float32, buf[: q.numel()].view(q.shape))


def _int8_out_over_A():
    buf = torch.zeros(64, dtype=torch.uint8)
    A = buf[:32].view(torch.int8).view(4, 8)
    ops.int8_linear_matmul.out(A, _i8(3, 8), buf[:48].view(torch.int32).view(4, 3))


case("op gemv_4bit.out", "out is A", Raises(ValueError, "out must not share memory with A"))(_gemv_out_is_A)
case("op dequantize_blockwise.out", "out overlaps absmax", Raises(ValueError, "share memory with absmax"))(
    _dequant8_out_over_absmax
)
case("op int8_linear_matmul.out", "out overlaps A", Raises(ValueError, "out must not share memory with A"))(
    _int8_out_over_A
)


# ---- zero-size, views at odd offsets, overflow: the documented results --------------------------------
def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    # Matmuls may sum in another order on another path (aligned vector loads or not); values agree closely.
    return a.shape == b.shape and torch.allclose(a, b, rtol=1e-5, atol=1e-5)


# The contracts count a map's elements: any shape of 256 (16 for gemv) is the flat map. Regression: the
# reference kernels used to index a 2-D map by rows (IndexError, or bucketize's "must be 1 dimension").
case(
    "op quantize_blockwise",
    "code of shape [16, 16]",
    Gives(lambda r: torch.equal(r[0], ops.quantize_blockwise(_x(64), _code(), 64)[0]), "same as the flat code"),
)(lambda: ops.quantize_blockwise(_x(64), _code().view(16, 16), 64))
case(
    "op dequantize_blockwise",
    "code of shape [16, 16]",
    Gives(lambda r: torch.equal(r, F.dequantize_blockwise(*_q8())), "same as the flat code"),
)(lambda: ops.dequantize_blockwise(_q8()[0], _q8()[1].absmax, _code().view(16, 16), 64, torch.float32))
case("op gemv_4bit", "code of shape [4, 4]", Gives(lambda r: _close(r, _gemv()), "same as the flat code"))(
    lambda: _gemv(code=_q4()[1].code.view(4, 4))
)


def _empty_weight(N: int, K: int):
    B, qs = F.quantize_4bit(torch.empty(N, K), blocksize=64)
    return dict(B=B, shapeB=[N, K], absmax=qs.absmax)


case("op gemv_4bit", "K = 0", Gives(lambda r: torch.equal(r, torch.zeros(1, 16)), "zeros [1, 16]"))(
    lambda: _gemv(A=_x(1, 0), **_empty_weight(16, 0))
)
case("op gemm_4bit", "K = 0, with bias", Gives(lambda r: torch.equal(r, torch.ones(9, 16)), "the bias in every row"))(
    lambda: _gemm(A=_x(9, 0), bias=torch.ones(16), **_empty_weight(16, 0))
)
case("op gemm_4bit", "N = 0", Gives(lambda r: r.shape == (9, 0), "empty [9, 0]"))(
    lambda: _gemm(A=_x(9, 64), **_empty_weight(0, 64))
)
case("op gemv_4bit", "zero rows", Gives(lambda r: r.shape == (0, 16), "empty [0, 16]"))(lambda: _gemv(A=_x(0, 64)))
case("op gemm_4bit", "zero rows", Gives(lambda r: r.shape == (0, 16), "empty [0, 16]"))(lambda: _gemm(A=_x(0, 64)))
case("op gemv_4bit", "A not contiguous", Gives(lambda r: _close(r, _gemv(A=_x(2, 128)[:, ::2].contiguous())), "same"))(
    lambda: _gemv(A=_x(2, 128)[:, ::2])
)
case("op gemv_4bit", "A at an odd offset", Gives(lambda r: _close(r, _gemv(A=_x(3, 64))), "same as aligned"))(
    lambda: _gemv(A=_at_offset(_x(3, 64)))
)
case(
    "op gemv_4bit",
    "B at an odd offset",
    Gives(lambda r: _close(r, _gemv()), "same as aligned"),
)(lambda: _gemv(B=_at_offset(_q4(shape=(16, 64))[0])))
case("op gemm_4bit", "A not contiguous, 12 rows", Gives(lambda r: _close(r, _gemm(A=_x(12, 64))), "same"))(
    lambda: _gemm(A=_x(12, 64).t().contiguous().t())
)
case(
    "op quantize_4bit",
    "A at an odd offset",
    Gives(lambda r: torch.equal(r[0], F.quantize_4bit(_x(8, 64))[0]), "same codes as aligned"),
)(lambda: F.quantize_4bit(_at_offset(_x(8, 64))))
case(
    "op dequantize_blockwise",
    "codes at an odd offset",
    Gives(lambda r: torch.equal(r, F.dequantize_blockwise(*_q8())), "same as aligned"),
)(lambda: F.dequantize_blockwise(_at_offset(_q8()[0]), _q8()[1]))
case(
    "dequantize_4bit",
    "shape [0, 64]",
    Gives(lambda r: r.shape == (0, 64), "empty [0, 64]"),
)(lambda: ops.dequantize_4bit(torch.empty(0, dtype=torch.uint8), torch.empty(0), 64, "nf4", [0, 64], torch.float32))
case(
    "int8_vectorwise_quant",
    "zero columns, threshold 1",
    Gives(
        lambda r: r[0].shape == (4, 0) and torch.equal(r[1], torch.zeros(4)) and r[2].numel() == 0,
        "empty codes, stats 0, no outliers",
    ),
)(lambda: F.int8_vectorwise_quant(torch.empty(4, 0, dtype=torch.float16), threshold=1.0))
case(
    "int8_vectorwise_quant",
    "A not contiguous",
    Gives(
        lambda r: torch.equal(r[0], F.int8_vectorwise_quant(_x(8, 4).half().t().contiguous())[0]),
        "same as contiguous copy",
    ),
)(lambda: F.int8_vectorwise_quant(_x(8, 4).half().t()))
case("int8_vectorwise_dequant", "zero rows", Gives(lambda r: r.shape == (0, 4), "empty [0, 4]"))(
    lambda: F.int8_vectorwise_dequant(torch.empty(0, 4, dtype=torch.int8), torch.empty(0))
)
case("int8_mm_dequant", "zero rows", Gives(lambda r: r.shape == (0, 3), "empty [0, 3]"))(
    lambda: F.int8_mm_dequant(torch.empty(0, 3, dtype=torch.int32), torch.empty(0), torch.ones(3))
)
case("int8_linear_matmul", "K = 0", Gives(lambda r: torch.equal(r, torch.zeros(4, 3, dtype=torch.int32)), "zeros"))(
    lambda: F.int8_linear_matmul(torch.empty(4, 0, dtype=torch.int8), torch.empty(3, 0, dtype=torch.int8))
)
case("int8_double_quant", "zero rows", Gives(lambda r: r[0].shape == (0, 4) and r[2].numel() == 0, "empty"))(
    lambda: F.int8_double_quant(torch.empty(0, 4, dtype=torch.float16))
)
case("op int8_mixed_scaled_mm", "outlier_cols on meta", Raises(ValueError, "outlier_cols"))(
    lambda: _mixed(torch.tensor([1], device=META))
)


def _offset_overflow(quant_type: str) -> torch.Tensor:
    # Four blocks with scales of 1e38: finite, but their float32 sum (the offset's mean) is +inf.
    A = torch.full((4, 64), 1e38)
    q, qs = F.quantize_4bit(A, blocksize=64, quant_type=quant_type, compress_statistics=True)
    assert torch.isfinite(A).all() and qs.nested
    return F.dequantize_4bit(q, qs)


# Policy (docs/pages/formats.md, "Overflow of the offset"): upstream's bytes, so the whole tensor goes
# non-finite; what must never happen is a plausible finite result.
for _qt in ("nf4", "fp4"):
    case(
        "NaN/Inf policy",
        f"compress_statistics {_qt}: offset overflows",
        Gives(lambda r: not torch.isfinite(r).any(), "every value non-finite"),
        via=("quantize_4bit", "dequantize_4bit", "quantize_blockwise", "dequantize_blockwise"),
    )(lambda _qt=_qt: _offset_overflow(_qt))


# ---- huge sizes: shape arithmetic must not wrap at 2**31 (checked on meta, where nothing is allocated) ---
_HUGE = 2**31 + 64 * 3
case(
    "huge (meta)",
    "quantize_4bit 2**31+ elements",
    Gives(lambda r: r[0].numel() == _HUGE // 2 and r[1].numel() == -(-_HUGE // 64), "codes n/2, absmax ceil(n/64)"),
    on_device=False,
)(lambda: ops.quantize_4bit(torch.empty(_HUGE, device=META), 64, "nf4", torch.uint8))
_in_n = Gives(lambda r: r.numel() == _HUGE, "n values")
case("huge (meta)", "dequantize_blockwise 2**31+ elements", _in_n, on_device=False)(
    lambda: ops.dequantize_blockwise(
        torch.empty(_HUGE, dtype=torch.uint8, device=META),
        torch.empty(-(-_HUGE // 64), device=META),
        _code().to(META),
        64,
        torch.float32,
    )
)
_square = Gives(lambda r: r.shape == (2**16, 2**16), "shape")
case("huge (meta)", "int8_linear_matmul 2**16 x 2**16 out", _square, on_device=False)(
    lambda: ops.int8_linear_matmul(
        torch.empty(2**16, 8, dtype=torch.int8, device=META), torch.empty(2**16, 8, dtype=torch.int8, device=META)
    )
)

# ---- QuantState.from_dict ------------------------------------------------------------------------------
case("QuantState.from_dict", "not a dict", Raises(TypeError, "qs_dict"))(
    lambda: F.QuantState.from_dict([1, 2], device=_device())
)
case("QuantState.from_dict", "missing absmax", Raises(ValueError, "absmax"))(
    lambda: F.QuantState.from_dict(_qs_dict(absmax=_DROP), device=_device())
)
case("QuantState.from_dict", "missing packed blob", Raises(ValueError, "quant_type|quant_state"))(
    lambda: F.QuantState.from_dict(_qs_dict(**{_PACKED: _DROP}), device=_device())
)
case("QuantState.from_dict", "extra key", Raises(ValueError, "bogus"))(
    lambda: F.QuantState.from_dict(_qs_dict(bogus=torch.ones(1)), device=_device())
)
case("QuantState.from_dict", "absmax as list", Raises(TypeError, "absmax"))(
    lambda: F.QuantState.from_dict(_qs_dict(absmax=[1.0] * 8), device=_device())
)
case("QuantState.from_dict", "absmax int dtype", Raises(TypeError, "absmax"))(
    lambda: F.QuantState.from_dict(_qs_dict(absmax=torch.ones(8, dtype=torch.int64)), device=_device())
)
case("QuantState.from_dict", "absmax wrong length", Raises(ValueError, "absmax"))(
    lambda: F.QuantState.from_dict(_qs_dict(absmax=torch.ones(3)), device=_device())
)
case("QuantState.from_dict", "blob not JSON", Raises(ValueError, _PACKED))(
    lambda: F.QuantState.from_dict(_qs_dict(**{_PACKED: _blob(b"{not json")}), device=_device())
)
case("QuantState.from_dict", "blob not UTF-8", Raises(ValueError, _PACKED))(
    lambda: F.QuantState.from_dict(_qs_dict(**{_PACKED: _blob(b"\xff\xfe\x00")}), device=_device())
)
case("QuantState.from_dict", "blob JSON list", Raises((TypeError, ValueError), _PACKED))(
    lambda: F.QuantState.from_dict(_qs_dict(**{_PACKED: _blob([1, 2])}), device=_device())
)
case("QuantState.from_dict", "blob float dtype", Raises((TypeError, ValueError), _PACKED))(
    lambda: F.QuantState.from_dict(_qs_dict(**{_PACKED: _blob(b"{}").float()}), device=_device())
)
case("QuantState.from_dict", "blob quant_type mismatch", Raises(ValueError, "quant_type"))(
    lambda: F.QuantState.from_dict(
        _qs_dict(**{_PACKED: _blob({**_packed_items(), "quant_type": "fp4"})}), device=_device()
    )
)
case("QuantState.from_dict", "blob blocksize 'x'", Raises((TypeError, ValueError), "blocksize"))(
    lambda: F.QuantState.from_dict(
        _qs_dict(**{_PACKED: _blob({**_packed_items(), "blocksize": "x"})}), device=_device()
    )
)
case("QuantState.from_dict", "blob blocksize 100", Raises(ValueError, "blocksize"))(
    lambda: F.QuantState.from_dict(
        _qs_dict(**{_PACKED: _blob({**_packed_items(), "blocksize": 100})}), device=_device()
    )
)
case("QuantState.from_dict", "blob dtype 'float99'", Raises((TypeError, ValueError), "dtype"))(
    lambda: F.QuantState.from_dict(
        _qs_dict(**{_PACKED: _blob({**_packed_items(), "dtype": "float99"})}), device=_device()
    )
)
case("QuantState.from_dict", "blob shape negative", Raises(ValueError, "shape"))(
    lambda: F.QuantState.from_dict(
        _qs_dict(**{_PACKED: _blob({**_packed_items(), "shape": [-8, 64]})}), device=_device()
    )
)
case("QuantState.from_dict", "blob shape strings", Raises((TypeError, ValueError), "shape"))(
    lambda: F.QuantState.from_dict(_qs_dict(**{_PACKED: _blob({**_packed_items(), "shape": ["a"]})}), device=_device())
)
case("QuantState.from_dict", "blob extra key", Raises(ValueError, "evil"))(
    lambda: F.QuantState.from_dict(_qs_dict(**{_PACKED: _blob({**_packed_items(), "evil": 1})}), device=_device())
)
case("QuantState.from_dict", "bad device", Raises(TypeError, "device"))(
    lambda: F.QuantState.from_dict(_qs_dict(), device=3.5)
)

# ---- out-of-range codes --------------------------------------------------------------------------------
# A uint8 code can never leave the 256-entry table; 4-bit nibbles can never leave the 16-entry table.
# What remains checkable is a table that is too short for the codes.
case("out-of-range codes", "8bit code table of 16", Raises(ValueError, "code"))(
    lambda: ops.dequantize_blockwise(_q8()[0], _q8()[1].absmax, torch.linspace(-1, 1, 16), 64, torch.float32)
)
case("out-of-range codes", "gemv code table of 8", Raises(ValueError, "code"))(lambda: _gemv(code=torch.ones(8)))
case("out-of-range codes", "all 0xFF 4-bit codes", Gives(lambda r: bool(torch.isfinite(r).all()), "finite values"))(
    lambda: ops.dequantize_4bit(
        torch.full((256,), 0xFF, dtype=torch.uint8), torch.ones(8), 64, "fp4", [8, 64], torch.float32
    )
)

# ---- nn modules ----------------------------------------------------------------------------------------
case("Linear4bit", "quant_type 'int4'", Raises(ValueError, "quant_type"))(
    lambda: bnb.nn.Linear4bit(64, 16, quant_type="int4")
)
case("Linear4bit", "negative in_features", Raises((ValueError, RuntimeError), "features|size|negative"))(
    lambda: bnb.nn.Linear4bit(-1, 16)
)
case("Linear4bit", "forward before quantization", Raises(RuntimeError, "weight is not quantized"))(
    lambda: bnb.nn.Linear4bit(64, 16)(_x(2, 64))
)
case("Linear4bit", "forward wrong feature dim", Raises(ValueError, r"\bA\b"), via=("gemv_4bit", "gemm_4bit"))(
    lambda: bnb.nn.Linear4bit(64, 16).to(_device())(_x(2, 32))
)
case("Linear4bit", "forward on meta input", Raises(ValueError, "input is on meta"))(
    lambda: bnb.nn.Linear4bit(64, 16).to(_device())(_x(2, 64).to(META))
)
case(
    "Linear8bitLt",
    "forward wrong feature dim",
    Raises((ValueError, RuntimeError), r"\bA\b|shape|size"),
    via=("int8_vectorwise_quant", "int8_linear_matmul", "int8_scaled_mm"),
)(lambda: bnb.nn.Linear8bitLt(64, 16, has_fp16_weights=False)(_x(2, 32)))
case("Params4bit", "blocksize 100", Raises(ValueError, "blocksize"))(
    lambda: bnb.nn.Params4bit(_x(16, 64), requires_grad=False, blocksize=100)._quantize(_device())
)
case("Embedding4bit", "quant_type 'nf5'", Raises(ValueError, "quant_type"))(
    lambda: bnb.nn.Embedding4bit(10, 64, quant_type="nf5")
)
case("optim.Adam", "negative lr", Raises(ValueError, "lr|learning rate"))(
    lambda: bnb.optim.Adam([torch.nn.Parameter(_x(64))], lr=-1.0)
)
case("optim.Adam", "optim_bits 5", Raises(ValueError, "optim_bits"))(
    lambda: bnb.optim.Adam([torch.nn.Parameter(_x(64))], optim_bits=5)
)
# Regression: a single beta used to step silently with beta2 = 0.
case("optim.Adam", "betas wrong length", Raises(ValueError, "betas"))(
    lambda: bnb.optim.Adam([torch.nn.Parameter(_x(64))], betas=(0.9,))
)
case("optim.Lion", "betas wrong length", Raises(ValueError, "betas"))(
    lambda: bnb.optim.Lion([torch.nn.Parameter(_x(64))], betas=(0.9,))
)
case("optim.AdEMAMix", "two betas", Raises(ValueError, "betas"))(
    lambda: bnb.optim.AdEMAMix([torch.nn.Parameter(_x(64))], betas=(0.9, 0.99))
)
case("optim.Adam", "beta1 = 1.0", Raises(ValueError, r"betas\[0\]"))(
    lambda: bnb.optim.Adam([torch.nn.Parameter(_x(64))], betas=(1.0, 0.999))
)

case("Optimizer2State", "optimizer_name 'bogus'", Raises(ValueError, "optimizer_name"))(
    lambda: bnb.optim.optimizer.Optimizer2State("bogus", [torch.nn.Parameter(_x(64))])
)
case("Optimizer1State", "optimizer_name 'ADAM'", Raises(ValueError, "optimizer_name"))(
    lambda: bnb.optim.optimizer.Optimizer1State("ADAM", [torch.nn.Parameter(_x(64))])
)
case("optim.Adam", "min_8bit_size -1", Raises(ValueError, "min_8bit_size"))(
    lambda: bnb.optim.Adam([torch.nn.Parameter(_x(64))], min_8bit_size=-1)
)
case("Linear4bit", "compute_dtype int32", Raises(TypeError, "compute_dtype"))(
    lambda: bnb.nn.Linear4bit(64, 16, compute_dtype=torch.int32)
)
case("Linear4bit", "quant_storage int64", Raises(TypeError, "quant_storage"))(
    lambda: bnb.nn.Linear4bit(64, 16, quant_storage=torch.int64)
)
case("Linear8bitLt", "forward on meta input", Raises(ValueError, "device"))(
    lambda: bnb.nn.Linear8bitLt(64, 16, has_fp16_weights=False).to(_device())(_x(2, 64).to(META))
)
case("Embedding4bit", "float indices", Raises(TypeError, "indices"))(
    lambda: bnb.nn.Embedding4bit(10, 64).to(_device())(torch.ones(3))
)
# Same contract as torch.nn.Embedding: an index past the table is an IndexError, never a read past the end.
case("Embedding4bit", "index past the table", Raises(IndexError, "out of range"))(
    lambda: bnb.nn.Embedding4bit(10, 64).to(_device())(torch.tensor([11]))
)
case("Embedding", "index past the table", Raises(IndexError, "out of range"))(
    lambda: bnb.nn.Embedding(10, 64)(torch.tensor([11]))
)
case("Int8Params", "int32 data", Raises(RuntimeError, "floating point"))(
    lambda: bnb.nn.Int8Params(torch.ones(4, 4, dtype=torch.int32), has_fp16_weights=False)
)
