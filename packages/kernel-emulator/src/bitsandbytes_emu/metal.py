"""Metal kernels in emulation: ``metal_library(source)`` stands in for ``torch.mps.compile_shader(source)``.

The returned library exposes each kernel as an attribute, called the way torch calls a compiled shader:
arguments in buffer order (tensors, Python ints as int64, floats as float32, lists of either as arrays,
``arg_casts`` to narrow them), ``threads=`` the total thread count (int or up to 3 dims, default the first
tensor's numel) and ``group_size=`` the threadgroup size (torch's defaults). The kernel runs on CPU
tensors, which it updates in place.

The source is compiled as MSL would see it, with a few mechanical rewrites a header cannot express:
threadgroup variable declarations become per-threadgroup storage, ``[[...]]`` attributes are read (buffer
indices, position attributes) and removed, unsuffixed floating literals get MSL's float type (``1.0`` is a
float in MSL, a double in C++), ``1.0h`` becomes a half, and ``const constant`` loses its duplicate const.
"""

from __future__ import annotations

import ctypes
import itertools
import math
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

# Kernel parameter attributes that take a position/size value -> bnb_emu::metal_launch::BuiltinId (metal.h).
_BUILTINS = {
    "thread_position_in_grid": "THREAD_POSITION_IN_GRID",
    "thread_position_in_threadgroup": "THREAD_POSITION_IN_THREADGROUP",
    "threadgroup_position_in_grid": "THREADGROUP_POSITION_IN_GRID",
    "threads_per_threadgroup": "THREADS_PER_THREADGROUP",
    "dispatch_threads_per_threadgroup": "DISPATCH_THREADS_PER_THREADGROUP",
    "threads_per_grid": "THREADS_PER_GRID",
    "threadgroups_per_grid": "THREADGROUPS_PER_GRID",
    "thread_index_in_threadgroup": "THREAD_INDEX_IN_THREADGROUP",
    "thread_index_in_simdgroup": "THREAD_INDEX_IN_SIMDGROUP",
    "simdgroup_index_in_threadgroup": "SIMDGROUP_INDEX_IN_THREADGROUP",
    "threads_per_simdgroup": "THREADS_PER_SIMDGROUP",
    "thread_execution_width": "THREAD_EXECUTION_WIDTH",
    "simdgroups_per_threadgroup": "SIMDGROUPS_PER_THREADGROUP",
    "dispatch_simdgroups_per_threadgroup": "DISPATCH_SIMDGROUPS_PER_THREADGROUP",
    "thread_index_in_quadgroup": "THREAD_INDEX_IN_QUADGROUP",
    "quadgroup_index_in_threadgroup": "QUADGROUP_INDEX_IN_THREADGROUP",
    "quadgroups_per_threadgroup": "QUADGROUPS_PER_THREADGROUP",
}
# Standard C++ attributes stay; every other [[...]] is MSL's and is removed after it has been read.
_CXX_ATTRIBUTES = {"maybe_unused", "likely", "unlikely", "fallthrough", "nodiscard", "noreturn"}

_COMMENT_OR_STRING = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_ATTRIBUTE = re.compile(r"\[\[(.*?)\]\]", re.S)
_KERNEL = re.compile(
    r"(?:\bkernel\b|\[\[\s*kernel\s*(?:,[^\]]*)?\]\])\s*(?:\[\[[^\]]*\]\]\s*)*void\s+([A-Za-z_]\w*)\s*\("
)
_INSTANTIATION = re.compile(
    r"\btemplate\s*\[\[\s*host_name\s*\(\s*\"(?P<host>\w+)\"\s*\)\s*\]\]"
    r"(?P<rest>[^;]*?)\b(?P<name>[A-Za-z_]\w*)\s*<(?P<targs>(?:[^;{}()<>]|<[^;{}()<>]*>)*)>\s*(?:\(|;)",
    re.S,
)
_TEMPLATE_HEAD = re.compile(r"\btemplate\s*<[^;{}]*>\s*(?:\[\[[^\]]*\]\]\s*)*$")
_MAX_THREADS = re.compile(r"\bmax_total_threads_per_threadgroup\s*\(\s*(\d+)\s*\)")
# Attributes the front end understands anywhere in a source (parameter attributes are checked per kernel).
_KNOWN_ATTRIBUTE = re.compile(
    r"kernel|host_name\s*\(.*\)|max_total_threads_per_threadgroup\s*\(\s*\d+\s*\)|buffer\s*\(\s*\d+\s*\)|"
    + "|".join(_BUILTINS)
    + "|"
    + "|".join(_CXX_ATTRIBUTES),
    re.S,
)
_GRAPHICS_FUNCTION = re.compile(r"^[ \t]*(?:\[\[[^\]]*\]\]\s*)?\b(vertex|fragment)\s+[\w:<>]+\s+\w+\s*\(", re.M)
_FLOAT_LITERAL = re.compile(r"(?<![\w.])((?:\d+\.\d*|\.\d+)(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+)([fFhH]?)(?![\w.])")
_DOUBLE_CONST = re.compile(r"\bconst\s+constant\b|\bconstant\s+const\b")


class MetalSubsetError(ValueError):
    """A construct of the Metal source that the emulator does not support (raised before compiling)."""


# ---- emulation options: what a real Apple GPU or compiler may do that the default emulation does not ----
EDGE_ENV = "BNB_EMU_METAL_EDGE"
FTZ_ENV = "BNB_EMU_METAL_FTZ"
FAST_MATH_ENV = "BNB_EMU_METAL_FAST_MATH"
EDGE_MODES = ("actual", "dispatched")
# PYTORCH_MPS_FAST_MATH=1 lets Apple's compiler assume no NaN or infinity (isnan may fold to false). The
# host compiler is told the same; reassociation and reciprocals are left out, as the kernels ask for
# precise:: quotients where their bits matter and fast math keeps those precise on Apple GPUs too.
FAST_MATH_FLAGS = ("-ffinite-math-only", "-fno-math-errno", "-fno-trapping-math")
_EDGE_DISPATCHED, _FLUSH_SUBNORMALS = 1, 2  # metal.h DispatchFlags


def _env_flag(name: str) -> bool:
    value = os.environ.get(name, "").strip().lower()
    if value in ("", "0", "false", "no", "off"):
        return False
    if value in ("1", "true", "yes", "on"):
        return True
    raise ValueError(f"{name} must be 0 or 1, got {os.environ[name]!r}")


def _edge_mode(edge: str | None) -> str:
    """threads_per_threadgroup of a short edge threadgroup: the ``actual`` (short) size or the
    ``dispatched`` one; None reads $BNB_EMU_METAL_EDGE (default actual)."""
    source = f"{EDGE_ENV}" if edge is None else "edge"
    mode = (os.environ.get(EDGE_ENV, "") or "actual") if edge is None else edge
    mode = mode.strip().lower()
    if mode not in EDGE_MODES:
        raise ValueError(f"{source} must be one of {', '.join(EDGE_MODES)}, got {mode!r}")
    return mode


@dataclass
class KernelParam:
    name: str
    buffer: int | None = None  # [[buffer(n)]] (or the implied index)
    builtin: str | None = None  # a BuiltinId name


@dataclass
class KernelEntry:
    host_name: str  # the name Python calls
    callee: str  # the C++ expression called (name, or name<targs> for a template instantiation)
    params: list[KernelParam] = field(default_factory=list)
    max_threads: int = 1024  # [[max_total_threads_per_threadgroup(n)]], else the Apple GPU limit

    @property
    def buffer_count(self) -> int:
        return max((p.buffer + 1 for p in self.params if p.buffer is not None), default=0)

    @property
    def symbol(self) -> str:
        return f"bnb_emu_metal_{self.host_name}"


def _blank(match: re.Match) -> str:
    return re.sub(r"[^\n]", " ", match.group(0))


def _line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def _matching(blanked: str, open_pos: int) -> int:
    """Index of the bracket closing the one at ``open_pos``."""
    pairs = {"(": ")", "[": "]", "{": "}"}
    stack = []
    for i in range(open_pos, len(blanked)):
        c = blanked[i]
        if c in pairs:
            stack.append(pairs[c])
        elif stack and c == stack[-1]:
            stack.pop()
            if not stack:
                return i
    raise MetalSubsetError(f"unbalanced '{blanked[open_pos]}' at line {_line_of(blanked, open_pos)}")


def _split_top(text: str) -> list[tuple[int, str]]:
    """Split a parameter list at top-level commas; returns (offset, piece) pairs."""
    depth, start, out = 0, 0, []
    for i, c in enumerate(text):
        if c in "([{<":
            depth += 1
        elif c in ")]}>":
            depth -= 1
        elif c == "," and depth == 0:
            out.append((start, text[start:i]))
            start = i + 1
    if text[start:].strip():
        out.append((start, text[start:]))
    return out


def _parse_params(blanked: str, open_paren: int, kernel: str, filename: str) -> list[KernelParam]:
    close = _matching(blanked, open_paren)
    params: list[KernelParam] = []
    used: set[int] = set()
    implicit: list[KernelParam] = []
    for offset, piece in _split_top(blanked[open_paren + 1 : close]):
        where = f"{filename}:{_line_of(blanked, open_paren + 1 + offset)}"
        attrs = [a.strip() for a in _ATTRIBUTE.findall(piece)]
        names = re.findall(r"[A-Za-z_]\w*", _ATTRIBUTE.sub(" ", piece))
        p = KernelParam(name=names[-1] if names else "?")
        for a in attrs:
            m = re.fullmatch(r"buffer\s*\(\s*(\d+)\s*\)", a)
            if m:
                p.buffer = int(m.group(1))
                if p.buffer in used:
                    raise MetalSubsetError(f"{where}: kernel '{kernel}' binds buffer({p.buffer}) twice")
                used.add(p.buffer)
            elif a in _BUILTINS:
                p.builtin = _BUILTINS[a]
            elif re.fullmatch(r"threadgroup\s*\(\s*\d+\s*\)", a):
                raise MetalSubsetError(
                    f"{where}: kernel '{kernel}' takes threadgroup memory as an argument ([[{a}]]); outside the "
                    "emulated Metal subset: declare a threadgroup array inside the kernel instead"
                )
            else:
                raise MetalSubsetError(
                    f"{where}: kernel '{kernel}' parameter '{p.name}' has attribute [[{a}]], which is outside the "
                    "emulated Metal subset"
                )
        if p.buffer is None and p.builtin is None:
            implicit.append(p)
        params.append(p)
    # Buffers without an index take the free ones in order, as the Metal compiler assigns them.
    free = (i for i in range(len(params) + len(used)) if i not in used)
    for p in implicit:
        p.buffer = next(free)
    return params


def _rewrite_threadgroup(text: str, blanked: str, filename: str) -> list[tuple[int, int, str]]:
    """Edits turning `threadgroup T name[N];` declarations into per-threadgroup storage."""
    edits = []
    for m in re.finditer(r"\bthreadgroup\b", blanked):
        j = m.start() - 1
        while j >= 0 and blanked[j] in " \t\r\n":
            j -= 1
        if j >= 0 and blanked[j] in "(,<":
            continue  # a qualifier inside a parameter list, cast or template argument
        end = blanked.find(";", m.end())
        decl = blanked[m.end() : end]
        # Only the declarator before an array size tells a pointer: `T name[2 * N]` is an array.
        head = decl.split("=", 1)[0].split("[", 1)[0]
        if "*" in head or "&" in head or "(" in head:
            continue  # a threadgroup pointer or reference: the qualifier just goes
        where = f"{filename}:{_line_of(text, m.start())}"
        depth = blanked.count("{", 0, m.start()) - blanked.count("}", 0, m.start())
        if depth <= 0:
            raise MetalSubsetError(f"{where}: a threadgroup variable at program scope; declare it inside the kernel")
        if "=" in decl:
            raise MetalSubsetError(f"{where}: a threadgroup variable cannot have an initializer (MSL rule)")
        edits.append((m.start(), m.end(), "BNB_EMU_THREADGROUP_VAR"))
        # Each variable reports its size when a lane reaches it, for the 32 KiB per-kernel limit.
        notes = []
        for _, piece in _split_top(decl):
            names = re.findall(r"[A-Za-z_]\w*", piece.split("[", 1)[0])
            if names:
                notes.append(f" ::bnb_emu::metal_launch::note_threadgroup(&{names[-1]}, sizeof({names[-1]}));")
        edits.append((end + 1, end + 1, "".join(notes)))
    return edits


def _rewrite_literals(blanked: str) -> list[tuple[int, int, str]]:
    edits = []
    for m in _FLOAT_LITERAL.finditer(blanked):
        line_start = blanked.rfind("\n", 0, m.start()) + 1
        if blanked[line_start : m.start()].lstrip().startswith("#") and "define" not in blanked[line_start : m.start()]:
            continue  # numbers in #if/#line/#pragma stay
        number, suffix = m.group(1), m.group(2)
        if suffix in ("f", "F"):
            continue
        if suffix in ("h", "H"):
            edits.append((m.start(), m.end(), f"half({number}f)"))
        else:
            edits.append((m.end(), m.end(), "f"))
    return edits


def _apply(text: str, edits: list[tuple[int, int, str]]) -> str:
    out, last = [], 0
    for start, end, new in sorted(edits):
        out.append(text[last:start])
        out.append(new)
        last = end
    out.append(text[last:])
    return "".join(out)


def translate(source: str, filename: str = "kernel.metal") -> tuple[str, list[KernelEntry]]:
    """The C++ text of a Metal source (without the shim include) and the kernels it exports."""
    blanked = _COMMENT_OR_STRING.sub(_blank, source)
    for m in _GRAPHICS_FUNCTION.finditer(blanked):
        where = f"{filename}:{_line_of(source, m.start())}"
        raise MetalSubsetError(f"{where}: {m.group(1)} functions are outside the emulated Metal subset (kernels only)")
    entries: list[KernelEntry] = []
    templates: dict[str, list[KernelParam]] = {}
    max_threads: dict[str, int] = {}
    for m in _KERNEL.finditer(blanked):
        name = m.group(1)
        params = _parse_params(blanked, m.end() - 1, name, filename)
        head_start = max(blanked.rfind(c, 0, m.start()) for c in ";}") + 1
        limit = _MAX_THREADS.search(blanked, head_start, m.end())
        max_threads[name] = int(limit.group(1)) if limit else 1024
        if _TEMPLATE_HEAD.search(blanked, 0, m.start()):  # template <...> kernel void name(...)
            templates[name] = params
        else:
            entries.append(KernelEntry(host_name=name, callee=name, params=params, max_threads=max_threads[name]))
    # Kernel parameters were checked above with more specific messages; this catches the rest.
    for m in _ATTRIBUTE.finditer(blanked):
        if not all(_KNOWN_ATTRIBUTE.fullmatch(a.strip()) for _, a in _split_top(m.group(1))):
            where = f"{filename}:{_line_of(source, m.start())}"
            raise MetalSubsetError(f"{where}: attribute [[{m.group(1).strip()}]] is outside the emulated Metal subset")
    no_comments = _COMMENT.sub(_blank, source)  # host names are string literals: keep those
    for m in _INSTANTIATION.finditer(no_comments):
        name = m.group("name")
        if name not in templates:
            raise MetalSubsetError(
                f"{filename}:{_line_of(source, m.start())}: host_name instantiation of '{name}', which is not a "
                "template kernel in this source"
            )
        targs = " ".join(source[m.start("targs") : m.end("targs")].split())
        host = m.group("host")
        entry = KernelEntry(host, f"{name}<{targs}>", templates[name], max_threads=max_threads[name])
        entries.append(entry)
    if not entries:
        raise MetalSubsetError(f"{filename}: no kernel functions found (expected 'kernel void name(...)')")

    edits = _rewrite_threadgroup(source, blanked, filename)
    edits += _rewrite_literals(blanked)
    for m in _ATTRIBUTE.finditer(blanked):
        inner = m.group(1).strip()
        if inner.split("(")[0].strip() not in _CXX_ATTRIBUTES:
            edits.append((m.start(), m.end(), _blank(m)))
    for m in _DOUBLE_CONST.finditer(blanked):
        edits.append((m.start(), m.end(), "constant"))
    # host_name instantiations become plain explicit instantiations (their attribute is blanked above).
    return _apply(source, _dedupe(edits)), entries


def _dedupe(edits: list[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    """Drop edits that overlap an earlier one (a literal inside a blanked attribute, say)."""
    out: list[tuple[int, int, str]] = []
    last_end = -1
    for e in sorted(edits, key=lambda e: (e[0], -e[1])):
        if e[0] < last_end:
            continue
        out.append(e)
        last_end = max(last_end, e[1])
    return out


def _escape(path: str) -> str:
    return path.replace("\\", "\\\\").replace('"', '\\"')


def translation_unit(source: str, filename: str = "kernel.metal") -> tuple[str, list[KernelEntry]]:
    """The whole file the host compiler builds: shim, rewritten source, one C entry point per kernel."""
    body, entries = translate(source, filename)
    lines = ["#include <bnb_emu/metal.h>", f'#line 1 "{_escape(filename)}"', body, '#line 1 "<bnb_emu metal entries>"']
    for e in entries:
        args = []
        for p in e.params:
            if p.builtin is not None:
                args.append(f"b.builtin(::bnb_emu::metal_launch::{p.builtin})")
            else:
                args.append(f"b.buffer({p.buffer})")
        lines.append(
            f"BNB_EMU_EXPORT_C int {e.symbol}(const ::bnb_emu::Arg* args, int nargs, const uint32_t* dispatch) {{\n"
            f'  return ::bnb_emu::metal_launch::run("{e.host_name}", args, nargs, dispatch,\n'
            f"      [](const ::bnb_emu::metal_launch::Bind& b) {{ {e.callee}({', '.join(args)}); }});\n"
            "}"
        )
    return "\n".join(lines) + "\n", entries


# ---- calling a compiled library ---------------------------------------------------------------------------


class _Arg(ctypes.Structure):
    _fields_ = [
        ("kind", ctypes.c_int32),
        ("readonly", ctypes.c_int32),
        ("nbytes", ctypes.c_int64),
        ("i", ctypes.c_int64),
        ("f", ctypes.c_double),
        ("ptr", ctypes.c_void_p),
        ("name", ctypes.c_char_p),
    ]


_CASTS = {
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "int32": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "uint8": torch.uint8,
}


def _scalar_tensor(value: Any, cast: str | None, index: int, kernel: str) -> torch.Tensor:
    """A Python scalar or list as the bytes torch would bind: int64 / float32, or the arg_casts type."""
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    if not values:
        raise ValueError(f"kernel '{kernel}': argument {index} is an empty list (torch rejects it too)")
    first = values[0]
    if isinstance(first, bool) or isinstance(first, int):
        dtype = torch.int64
    elif isinstance(first, float):
        dtype = torch.float32
    else:
        raise TypeError(
            f"kernel '{kernel}': argument {index} must be a tensor, int, float or a list of ints/floats, "
            f"got {type(value).__name__}"
        )
    t = torch.tensor(values, dtype=dtype)
    if cast:
        if cast not in _CASTS:
            raise ValueError(f"kernel '{kernel}': arg_casts for argument {index} must be one of {sorted(_CASTS)}")
        t = t.to(_CASTS[cast])
    return t


def _dims(value: int | Sequence[int], what: str, kernel: str) -> list[int]:
    dims = [value] if isinstance(value, int) else list(value)
    if not 1 <= len(dims) <= 3 or not all(isinstance(d, int) and d >= 0 for d in dims):
        raise ValueError(f"kernel '{kernel}': {what} must be a non-negative int or 1-3 of them, got {value!r}")
    return dims


class MetalKernel:
    """One kernel of an emulated library; call it as torch calls a compiled Metal kernel."""

    def __init__(self, library: MetalLibrary, entry: KernelEntry):
        self._library = library
        self._entry = entry
        fn = getattr(library._dll, entry.symbol)
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.POINTER(_Arg), ctypes.c_int, ctypes.POINTER(ctypes.c_uint32)]
        self._fn = fn

    @property
    def max_threads_per_threadgroup(self) -> int:
        return self._entry.max_threads

    @property
    def thread_execution_width(self) -> int:
        return 32

    def __call__(self, *args: Any, threads=None, group_size=None, arg_casts=None) -> None:
        from .errors import EmulationError

        kernel = self._entry.host_name
        need = self._entry.buffer_count
        if len(args) < need:
            raise ValueError(f"kernel '{kernel}' binds {need} buffers, got {len(args)} arguments")
        casts: dict[int, str] = {}
        if isinstance(arg_casts, str):
            casts = dict.fromkeys(range(len(args)), arg_casts)
        elif arg_casts:
            casts = dict(arg_casts)
        names = {p.buffer: p.name for p in self._entry.params if p.buffer is not None}
        keep: list[Any] = []
        tensors: list[torch.Tensor] = []
        c_args = (_Arg * max(len(args), 1))()
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                if a.device.type != "cpu":
                    raise ValueError(f"kernel '{kernel}': argument {i} must be a CPU tensor, got device {a.device}")
                if not a.is_contiguous():
                    raise ValueError(f"kernel '{kernel}': argument {i} must be contiguous")
                t = a
                tensors.append(a)
            else:
                t = _scalar_tensor(a, casts.get(i), i, kernel)
            keep.append(t)
            name = f"{names[i]} (buffer {i})" if i in names else f"buffer {i}"
            enc = name.encode()
            keep.append(enc)
            c_args[i].kind = 0
            c_args[i].nbytes = t.numel() * t.element_size()
            c_args[i].ptr = t.data_ptr() if t.numel() else None
            c_args[i].name = enc
        spans = sorted((c_args[i].ptr, c_args[i].ptr + c_args[i].nbytes, i) for i in range(len(args)) if c_args[i].ptr)
        for (_, end, i), (start, _, j) in itertools.pairwise(spans):
            if start < end:
                raise ValueError(
                    f"kernel '{kernel}': arguments {min(i, j)} and {max(i, j)} share memory; the emulator copies each "
                    "buffer on its own, so aliased buffers would not see each other's writes"
                )
        if threads is None:
            if not tensors:
                raise ValueError(f"kernel '{kernel}': pass threads= (no tensor argument to take the count from)")
            threads = tensors[0].numel()
        tdims = _dims(threads, "threads", kernel)
        if group_size is None:  # torch's defaults: min(max, threads) in 1-D, (max, 1, 1) otherwise
            if len(tdims) == 1:
                group_size = max(1, min(self._entry.max_threads, tdims[0]))
            else:
                group_size = (self._entry.max_threads,) + (1,) * (len(tdims) - 1)
        gdims = _dims(group_size, "group_size", kernel)
        if math.prod(gdims) > self._entry.max_threads:
            raise ValueError(
                f"kernel '{kernel}': group_size {group_size!r} has more threads than the kernel's maximum "
                f"threadgroup size {self._entry.max_threads} (Metal rejects such a dispatch)"
            )
        if len(gdims) != len(tdims):
            raise ValueError(f"kernel '{kernel}': threads and group_size must have the same number of dimensions")
        flags = self._library._dispatch_flags()
        dispatch = (ctypes.c_uint32 * 7)(*(tdims + [1] * (3 - len(tdims))), *(gdims + [1] * (3 - len(gdims))), flags)
        rc = self._fn(c_args, len(args), dispatch)
        if rc != 0:
            raise EmulationError(self._library._last_error())


class MetalLibrary:
    """An emulated stand-in for the object torch.mps.compile_shader returns."""

    def __init__(
        self, dll: ctypes.CDLL, entries: list[KernelEntry], *, edge: str | None = None, ftz: bool | None = None
    ):
        self._dll = dll
        self._edge = None if edge is None else _edge_mode(edge)
        self._ftz = ftz
        self._entries = {e.host_name: e for e in entries}
        self._kernels: dict[str, MetalKernel] = {}
        dll.bnb_emu_last_error.restype = ctypes.c_char_p

    def _last_error(self) -> str:
        return self._dll.bnb_emu_last_error().decode(errors="replace")

    def _dispatch_flags(self) -> int:
        # Read at every dispatch: the options need no rebuild, and tests can switch them per call.
        edge = self._edge or _edge_mode(None)
        ftz = _env_flag(FTZ_ENV) if self._ftz is None else self._ftz
        return (_EDGE_DISPATCHED if edge == "dispatched" else 0) | (_FLUSH_SUBNORMALS if ftz else 0)

    def __getattr__(self, name: str) -> MetalKernel:
        if name.startswith("_"):
            raise AttributeError(name)
        if name not in self._entries:
            raise AttributeError(
                f"no kernel '{name}' in this Metal library (it has: {', '.join(sorted(self._entries))})"
            )
        if name not in self._kernels:
            self._kernels[name] = MetalKernel(self, self._entries[name])
        return self._kernels[name]

    def __dir__(self) -> list[str]:
        return sorted(self._entries)


_HEADERS = Path(__file__).parent / "include" / "bnb_emu" / "metal_headers"
_libraries: dict[tuple, MetalLibrary] = {}


def metal_library(
    source: str | os.PathLike,
    *,
    filename: str | None = None,
    include_dirs: Iterable[str | os.PathLike] = (),
    edge: str | None = None,
    ftz: bool | None = None,
    fast_math: bool | None = None,
) -> MetalLibrary:
    """Compile Metal kernel source for emulation, like ``torch.mps.compile_shader(source)``.

    Args:
        source: the Metal source text, or the path of a ``.metal`` file.
        filename: the name compiler messages and errors use for the source (default: the path, or
            ``kernel.metal`` for text).
        include_dirs: directories searched by ``#include`` (a file's own directory always is).
        edge: what ``threads_per_threadgroup`` (and ``simdgroups_per_threadgroup``) says in a short edge
            threadgroup of a non-uniform grid: ``"actual"`` (its own size) or ``"dispatched"`` (the
            group_size of the dispatch). None: $BNB_EMU_METAL_EDGE at each call, default actual.
        ftz: flush float32 subnormals to zero, on input and output, as Apple GPUs do (float16 ones stay).
            None: $BNB_EMU_METAL_FTZ at each call, default off.
        fast_math: compile as under PYTORCH_MPS_FAST_MATH=1: the compiler may assume no NaN or infinity.
            None: $BNB_EMU_METAL_FAST_MATH when the library is built, default off. A separate build.

    Raises:
        EmulationCompileError: the source uses something outside the emulated subset or does not compile.
        EmulationError: no C++ compiler here.
    """
    from .build import build
    from .errors import EmulationCompileError

    dirs = [str(_HEADERS), *(str(Path(d).resolve()) for d in include_dirs)]
    if isinstance(source, os.PathLike) or (
        isinstance(source, str) and "\n" not in source and source.endswith(".metal")
    ):
        path = Path(os.fspath(source)).resolve()
        try:
            text = path.read_text()
        except OSError as e:
            raise FileNotFoundError(f"Metal source {str(path)!r} cannot be read: {e.strerror}") from None
        filename = filename or str(path)
        dirs.append(str(path.parent))
    else:
        text = str(source)
        filename = filename or "kernel.metal"
    if edge is not None:
        edge = _edge_mode(edge)
    fast = _env_flag(FAST_MATH_ENV) if fast_math is None else bool(fast_math)
    key = (filename, text, tuple(dirs), edge, ftz, fast)
    if key not in _libraries:
        try:
            tu, entries = translation_unit(text, filename)
        except MetalSubsetError as e:
            raise EmulationCompileError(f"bnb_emu/metal: {e}") from None
        extra = FAST_MATH_FLAGS if fast else ()
        lib = build(tu, dialect="metal", label=filename, include_dirs=dirs, defines={}, extra_flags=extra)
        _libraries[key] = MetalLibrary(ctypes.CDLL(str(lib)), entries, edge=edge, ftz=ftz)
    return _libraries[key]
