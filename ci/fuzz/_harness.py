"""What every fuzz harness (ci/fuzz/fuzz_*.py) shares: a reader that turns fuzz bytes into arguments, the
allow-list check for errors, canary-guarded buffers for the native calls, and the atheris entry point.

A harness defines ``test_one_input(data: bytes)`` and ends with ``main(test_one_input, modules)``. Anything
that escapes ``test_one_input`` is a finding: a crash, an exception outside the target's allow-list, an error
whose message names none of the arguments, or a native call that wrote outside its output buffers.
atheris is imported only in ``main``: ``BNB_FUZZ_REPLAY=1 python ci/fuzz/fuzz_X.py FILE...`` replays inputs
without it, and tests import the harnesses to replay the committed corpus.
"""

from __future__ import annotations

import os
import re
import struct
import sys
from collections.abc import Callable, Sequence
from math import prod

import torch

# Integers that sit on the edges the checks must get right: block sizes, int32/int64 overflow.
EDGE_INTS = (0, 1, -1, 2, 3, 15, 16, 31, 32, 33, 63, 64, 65, 255, 256, 257, 4095, 4096, 4097, 2**31 - 1, 2**31,
             -(2**31), 2**32, 2**32 + 1, 2**40, 2**61, 2**62, 2**63 - 1, -(2**63))  # fmt: skip
EDGE_FLOATS = (0.0, -0.0, 1.0, -1.0, 0.5, 1e-45, 1.1754944e-38, 3.4028235e38, -3.4028235e38, 65504.0, 6e-8,
               float("inf"), float("-inf"), float("nan"))  # fmt: skip
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
ANY_DTYPES = (*FLOAT_DTYPES, torch.uint8, torch.int8, torch.int32, torch.int64, torch.float64, torch.bool)


class Reader:
    """Consumes fuzz bytes from the front; past the end every read is 0, so any input decodes."""

    def __init__(self, data: bytes):
        self.data = data
        self.pos = 0

    def u8(self) -> int:
        if self.pos >= len(self.data):
            return 0
        self.pos += 1
        return self.data[self.pos - 1]

    def take(self, n: int) -> bytes:
        out = self.data[self.pos : self.pos + n]
        self.pos += len(out)
        return out.ljust(n, b"\0")

    def rest(self) -> bytes:
        out = self.data[self.pos :]
        self.pos = len(self.data)
        return out

    def flag(self) -> bool:
        return bool(self.u8() & 1)

    def pick(self, options: Sequence):
        return options[self.u8() % len(options)]

    def small(self, hi: int) -> int:
        """0..hi, from one or two bytes."""
        v = self.u8() if hi < 256 else self.u8() | self.u8() << 8
        return v % (hi + 1)

    def int64(self) -> int:
        """Mostly small, sometimes an edge value or any int64: sizes, counts and offsets to probe."""
        mode = self.u8() % 4
        if mode == 0:
            return self.small(300)
        if mode == 1:
            return self.pick(EDGE_INTS)
        if mode == 2:
            return struct.unpack("<q", self.take(8))[0]
        return -self.small(300)

    def float(self) -> float:
        if self.flag():
            return self.pick(EDGE_FLOATS)
        return struct.unpack("<f", self.take(4))[0]

    def values(self, n: int, dtype: torch.dtype) -> torch.Tensor:
        """n values of dtype: raw bit patterns (NaN, Inf, denormals), a seeded normal sample, edges or zeros."""
        mode = self.u8() % 4
        if n == 0:
            return torch.empty(0, dtype=dtype)
        if mode == 0:
            raw = self.take(min(n * _size(dtype), 512)) or b"\0"
            raw = (raw * (n * _size(dtype) // len(raw) + 1))[: n * _size(dtype)]
            t = torch.frombuffer(bytearray(raw), dtype=dtype).clone()
            return t.bool() if dtype == torch.bool else t
        if mode == 1:
            g = torch.Generator().manual_seed(self.u8() | self.u8() << 8)
            t = torch.randn(n, generator=g) * self.pick((1.0, 1e-3, 1e4, 1e-40))
            return _cast(t, dtype)
        if mode == 2:
            return _cast(torch.tensor([self.float() for _ in range(min(n, 8))]).repeat(n // min(n, 8) + 1)[:n], dtype)
        return torch.zeros(n, dtype=dtype)


def _size(dtype: torch.dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()


def _cast(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if dtype.is_floating_point:
        return t.to(dtype)
    info = torch.iinfo(dtype) if dtype != torch.bool else None
    if info is None:
        return t > 0
    return torch.nan_to_num(t, 0.0).clamp(info.min, info.max).to(dtype)


class Finding(AssertionError):
    """A result the target's contract rules out (atheris reports it as a crash, with the input)."""


def call(fn: Callable, *args, names: Sequence[str], errors=(TypeError, ValueError), **kwargs):
    """(True, fn(...)) or (False, exc) for an allowed error whose message names one of ``names``.

    Any other exception propagates; an allowed type whose message names no argument becomes a Finding.
    """
    try:
        result = fn(*args, **kwargs)
    except errors as e:
        message = str(e)
        named = [n for n in names if re.search(r"(?<![A-Za-z0-9_])" + re.escape(n), message)]
        if not named:
            raise Finding(f"{type(e).__name__} from {_name(fn)} names none of {list(names)}: {message}") from e
        _feedback(f"{_name(fn)}:{type(e).__name__}:{named[0]}")
        return False, e
    _feedback(f"{_name(fn)}:ok")
    return True, result


def _feedback(outcome: str) -> None:
    """Coverage for outcomes the fuzzer cannot see in native code: which argument a call refused, or that it ran.

    Each new outcome gets a function of its own, instrumented by atheris, so reaching it is a new edge.
    """
    fn = _OUTCOMES.get(outcome)
    if fn is None:
        if len(_OUTCOMES) >= 4096:
            return
        namespace: dict = {}
        exec(f"def outcome_{len(_OUTCOMES)}():\n    return {len(_OUTCOMES)}\n", namespace)
        fn = namespace[f"outcome_{len(_OUTCOMES)}"]
        if "atheris" in sys.modules:
            fn = sys.modules["atheris"].instrument_func(fn)
        _OUTCOMES[outcome] = fn
    fn()


_OUTCOMES: dict[str, Callable[[], int]] = {}


def _name(fn: Callable) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)


CANARY = 0xA5
_PAD = 64  # bytes of canary on each side of a guarded tensor (a multiple of every element size)


class Guarded:
    """Tensors that live inside larger byte buffers with canary bytes around them.

    A native call that writes past either end of its output changes a canary; ``check`` reports it. Reads
    past the end are not seen this way (the ASan build of `nox -s fuzz` sees those, where clang is present).
    """

    def __init__(self):
        self._buffers: list[tuple[str, torch.Tensor]] = []

    def __call__(self, name: str, values: torch.Tensor, shape: Sequence[int] | None = None, layout: int = 0):
        """``values`` copied into a guarded buffer, viewed as ``shape``; ``layout`` 1 gives a transposed view
        and 2 a strided slice (non-contiguous: the native side must refuse both)."""
        shape = tuple(values.shape) if shape is None else tuple(shape)
        n = prod(shape)
        if layout == 2:
            n *= 2
        nbytes = n * values.element_size()
        buf = torch.full((_PAD + nbytes + _PAD,), CANARY, dtype=torch.uint8)
        body = buf[_PAD : _PAD + nbytes].view(values.dtype)
        flat = values.reshape(-1)
        if flat.numel():
            body[: min(flat.numel(), body.numel())] = flat[: body.numel()]
        self._buffers.append((name, buf))
        if layout == 2:
            return body[::2].reshape(shape) if shape else body[:1].reshape(shape)
        t = body.reshape(shape)
        if layout == 1 and t.dim() >= 2:
            t = t.reshape(*shape[:-2], shape[-1], shape[-2]).transpose(-1, -2)
        return t

    def check(self, what: str) -> None:
        for name, buf in self._buffers:
            head, tail = buf[:_PAD], buf[buf.numel() - _PAD :]
            if bool((head != CANARY).any()) or bool((tail != CANARY).any()):
                raise Finding(f"{what} wrote outside the buffer of {name}")


def count(r: Reader, exact: int) -> int:
    """Mostly ``exact``; sometimes one off, empty, or any small count (the size checks' edges)."""
    mode = r.u8() % 8
    if mode == 5:
        return max(exact - 1, 0)
    if mode == 6:
        return exact + 1
    if mode == 7:
        return r.pick((0, 1, r.small(300)))
    return exact


def array(r: Reader, guard: Guarded, name: str, n: int, dtype: torch.dtype, shape: Sequence[int] | None = None):
    """A guarded argument: mostly ``n`` values of ``dtype`` (contiguous, of ``shape`` when given), sometimes a
    wrong dtype, count or layout."""
    if r.u8() % 8 == 0:
        dtype = r.pick(ANY_DTYPES)
    m = count(r, n)
    layout = r.pick((0, 0, 0, 0, 0, 0, 1, 2))
    if shape is None or m != n:
        shape = (m,) if m % 2 or m < 4 or r.flag() else (2, m // 2)
    return guard(name, r.values(m, dtype), shape, layout)


THREADS = (1, 1, 2, 4, 0, -1, 3)


def import_target(*modules: str) -> None:
    """Import the code under test, with atheris' Python coverage when it is loaded (torch stays uninstrumented)."""
    import importlib

    if "atheris" in sys.modules and os.environ.get("BNB_FUZZ_NO_PY_COVERAGE") != "1":
        import atheris

        with atheris.instrument_imports(include=["bitsandbytes", "bitsandbytes_cpu"]):
            for m in modules:
                importlib.import_module(m)
    else:
        for m in modules:
            importlib.import_module(m)


def main(test_one_input: Callable[[bytes], None], modules: Sequence[str]) -> None:
    """Fuzz with atheris (libFuzzer flags in argv); with BNB_FUZZ_REPLAY=1, run the given files once each."""
    if os.environ.get("BNB_FUZZ_REPLAY") == "1":
        import_target(*modules)
        for path in sys.argv[1:]:
            with open(path, "rb") as f:
                test_one_input(f.read())
        print(f"replayed {len(sys.argv) - 1} input(s)")
        return
    import atheris

    import_target(*modules)
    _instrument_harness(atheris, sys.modules["__main__"])
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


def _instrument_harness(atheris, harness) -> None:
    """The harness' own decisions (which entry point, which sizes) are coverage too: instrument its functions."""
    import inspect

    for module in (sys.modules[__name__], harness):
        for obj in list(vars(module).values()):
            fns = [obj] if inspect.isfunction(obj) else []
            if inspect.isclass(obj) and obj.__module__ == module.__name__:
                fns = [f for f in vars(obj).values() if inspect.isfunction(f)]
            for fn in fns:
                if fn.__module__ == module.__name__ and fn.__name__ not in ("main", "_instrument_harness"):
                    atheris.instrument_func(fn)
