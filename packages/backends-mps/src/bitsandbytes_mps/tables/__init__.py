"""The kernel tables: one ``tables/<family>.py`` per Metal source, each a ``KERNELS`` list of ``Kernel``.

A ``Kernel`` names a host function of ``metal/<source>`` (the ``[[host_name]]`` of a template instance, or
a plain ``kernel void``), its buffer arguments in binding order and the largest threadgroup the host
launches it with (``max_threads``, which the source declares as ``[[max_total_threads_per_threadgroup]]``).
The dispatcher checks every call against it, the loader compiles exactly the sources the tables name,
and a host-side test parses each kernel's signature and limit from the ``.metal`` text
(``parse_kernels``) and compares: the three cannot drift.
Importing it imports neither torch nor bitsandbytes; ``all_kernels`` collects the family modules with the
core's plugin kit.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

__all__ = [
    "ELEMENT_TYPES",
    "SCALAR_TYPES",
    "Kernel",
    "Param",
    "all_kernels",
    "by_source",
    "canonical_type",
    "get",
    "parse_kernels",
]

# Scalar argument types (bound as `constant T&`): name -> (kind, bytes, torch arg_cast or None).
# torch binds a Python int as int64 and a float as float32; narrower types need an arg_cast.
SCALAR_TYPES: dict[str, tuple[str, int, str | None]] = {
    "long": ("int", 8, None),
    "ulong": ("int", 8, None),
    "int": ("int", 4, "int32"),
    "uint": ("int", 4, "int32"),
    "short": ("int", 2, "int16"),
    "ushort": ("int", 2, "int16"),
    "char": ("int", 1, "int8"),
    "uchar": ("int", 1, "uint8"),
    "bool": ("int", 1, "uint8"),
    "float": ("float", 4, None),
    "half": ("float", 2, "fp16"),
    "bfloat": ("float", 2, "bf16"),
}

# Element types of `device T*` buffers: name -> bytes per element. The floating scalars must match a
# tensor's dtype exactly; integer and vector types accept any dtype whose size divides theirs.
ELEMENT_TYPES: dict[str, int] = {
    **{name: size for name, (_, size, _) in SCALAR_TYPES.items()},
    **{f"{v}{n}": s * n for v, s in (("char", 1), ("uchar", 1), ("short", 2), ("ushort", 2)) for n in (2, 4)},
    **{f"{v}{n}": s * n for v, s in (("int", 4), ("uint", 4), ("float", 4)) for n in (2, 4)},
    **{f"{v}{n}": 2 * n for v in ("half", "bfloat") for n in (2, 4)},
    **{"atomic_int": 4, "atomic_uint": 4, "atomic_float": 4, "atomic_ulong": 8},
}
FLOAT_ELEMENTS = ("float", "half", "bfloat")

_TYPE_TOKENS = re.compile(r"[A-Za-z_]\w*|[*&]")


def canonical_type(spelling: str) -> str:
    """An argument type in one spelling: ``"const device float *"`` -> ``"device const float*"``,
    ``"constant long &"`` -> ``"constant long&"``. ``ValueError`` for anything that is not a buffer
    (``device [const] T*``, ``constant T*``) or a scalar (``constant T&``) of the known types."""
    tokens = _TYPE_TOKENS.findall(spelling)
    if "".join(tokens).replace("const", "") != re.sub(r"\s+", "", spelling).replace("const", ""):
        raise ValueError(f"argument type {spelling!r} has characters outside a Metal type")
    const = "const" in tokens
    words = [t for t in tokens if t not in ("const", "*", "&")]
    space = words.pop(0) if words and words[0] in ("device", "constant") else None
    ptr = tokens.count("*")
    ref = tokens.count("&")
    base = " ".join(words)
    if space == "device" and ptr == 1 and ref == 0 and base in ELEMENT_TYPES:
        return f"device {'const ' if const else ''}{base}*"
    if space == "constant" and ptr == 1 and ref == 0 and base in ELEMENT_TYPES:
        return f"constant {base}*"  # constant memory is read-only: const or not, the same
    if space == "constant" and ref == 1 and ptr == 0 and base in SCALAR_TYPES:
        return f"constant {base}&"
    raise ValueError(
        f"argument type {spelling!r} is not 'device [const] T*' (T one of {', '.join(ELEMENT_TYPES)}) nor "
        f"'constant T&' (T one of {', '.join(SCALAR_TYPES)})"
    )


@dataclass(frozen=True)
class Param:
    """One bound argument: its name in the source and its canonical type."""

    name: str
    type: str

    @property
    def is_buffer(self) -> bool:
        return self.type.endswith("*")

    @property
    def element(self) -> str:
        """The element type of a buffer, or the scalar's type: ``"device const half*"`` -> ``"half"``."""
        return self.type.rstrip("*&").split()[-1]

    @property
    def writable(self) -> bool:
        return self.type.startswith("device ") and " const " not in f" {self.type} "

    def __str__(self) -> str:
        return f"{self.type} {self.name}"


# Threads per SIMD-group the kernels are written for (lane / 32, simd_max over one 32-value group, ...):
# every Apple GPU's; a pipeline reporting another thread_execution_width cannot run them.
SIMD_WIDTH = 32
# Apple GPUs' largest threadgroup; a pipeline's own limit (maxTotalThreadsPerThreadgroup) may be lower.
MAX_THREADGROUP = 1024


@dataclass(frozen=True)
class Kernel:
    """A kernel ``name`` (its Metal host name) of ``metal/<source>``, its buffer arguments in order, and
    ``max_threads``: the largest threadgroup the host ever launches it with, which the source declares as
    ``[[max_total_threads_per_threadgroup(max_threads)]]`` (so the compiler may budget registers for it,
    and a pipeline whose limit is lower is seen at load time, not as torch's error at a launch).

    ``params`` are ``(name, type)`` pairs (or ``Param``) with Metal spellings: ``("A", "device const
    half*")``, ``("n", "constant long&")``. Position attributes (``thread_position_in_grid`` ...) are not
    arguments and are not listed.
    """

    name: str
    source: str
    params: tuple[Param, ...]
    max_threads: int

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ValueError(f"Kernel name must be an identifier, got {self.name!r}")
        if not isinstance(self.source, str) or not re.fullmatch(r"[A-Za-z_0-9]+\.metal", self.source):
            raise ValueError(f"Kernel {self.name}: source must be a file name like 'int8.metal', got {self.source!r}")
        if not isinstance(self.params, (tuple, list)):
            raise TypeError(f"Kernel {self.name}: params must be a sequence of (name, type), got {self.params!r}")
        params = []
        for i, p in enumerate(self.params):
            if isinstance(p, Param):
                p = (p.name, p.type)
            if not (isinstance(p, tuple) and len(p) == 2 and all(isinstance(s, str) for s in p)):
                raise TypeError(f"Kernel {self.name}: parameter {i} must be a (name, type) pair, got {p!r}")
            name, spelling = p
            if not name.isidentifier():
                raise ValueError(f"Kernel {self.name}: parameter {i} name {name!r} is not an identifier")
            try:
                params.append(Param(name, canonical_type(spelling)))
            except ValueError as e:
                raise ValueError(f"Kernel {self.name}: parameter {i} ({name}): {e}") from None
        names = [p.name for p in params]
        if len(set(names)) != len(names):
            raise ValueError(f"Kernel {self.name}: parameter names repeat: {names}")
        object.__setattr__(self, "params", tuple(params))
        mt = self.max_threads
        if isinstance(mt, bool) or not isinstance(mt, int) or not (0 < mt <= MAX_THREADGROUP) or mt % SIMD_WIDTH:
            raise ValueError(
                f"Kernel {self.name}: max_threads must be a multiple of {SIMD_WIDTH} in {SIMD_WIDTH}.."
                f"{MAX_THREADGROUP} (whole SIMD-groups, within Apple's threadgroup limit), got {mt!r}"
            )

    def signature(self) -> str:
        return f"{self.name}({', '.join(map(str, self.params))})"


@functools.cache
def all_kernels() -> dict[str, Kernel]:
    """Every table's kernels, name -> Kernel, collected once from the modules of this package."""
    from bitsandbytes.backends import kit  # not at import: the table types need no torch

    return kit.collect(__name__, "KERNELS", key=lambda k: k.name, item_type=Kernel)


def get(name: str) -> Kernel:
    """The table entry for a kernel name; ``KeyError`` naming the closest names when unknown."""
    if (k := all_kernels().get(name)) is not None:
        return k
    import difflib

    close = ", ".join(difflib.get_close_matches(name, all_kernels(), n=3))
    hint = f"; did you mean {close}?" if close else ""
    raise KeyError(f"no kernel named {name!r} in bitsandbytes_mps.tables{hint}")


def by_source() -> dict[str, list[Kernel]]:
    """The kernels grouped by their source file, in table order."""
    sources = dict.fromkeys(k.source for k in all_kernels().values())
    return {s: [k for k in all_kernels().values() if k.source == s] for s in sources}


# ---------------------------------------------------------------------------- parsing .metal sources

_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_ATTRIBUTE = re.compile(r"\[\[(.*?)\]\]", re.S)
_KERNEL_HEAD = re.compile(
    r"(?:\bkernel\b|\[\[\s*kernel\s*(?:,[^\]]*)?\]\])\s*(?:\[\[[^\]]*\]\]\s*)*void\s+([A-Za-z_]\w*)\s*(<[^(;{]*>)?\s*\("
)
_HOST_NAME = re.compile(r"\[\[\s*host_name\s*\(\s*\"(\w+)\"\s*\)\s*\]\]")
_MAX_THREADS = re.compile(r"\bmax_total_threads_per_threadgroup\s*\(\s*(\d+)\s*\)")
_NOT_NAMES = {"const", "device", "constant", "thread", "threadgroup", "unsigned", *ELEMENT_TYPES, *SCALAR_TYPES}
_TEMPLATE_PARAMS = re.compile(r"\btemplate\s*<([^;{}]*)>\s*(?:\[\[[^\]]*\]\]\s*)*$")


def _close(text: str, open_pos: int) -> int:
    depth = 0
    for i in range(open_pos, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return i
    raise ValueError(f"unbalanced '(' at offset {open_pos}")


def _split_top(text: str) -> list[str]:
    depth, start, out = 0, 0, []
    for i, c in enumerate(text):
        if c in "([{<":
            depth += 1
        elif c in ")]}>":
            depth -= 1
        elif c == "," and depth == 0:
            out.append(text[start:i])
            start = i + 1
    if text[start:].strip():
        out.append(text[start:])
    return out


def _raw_params(text: str, open_paren: int) -> list[tuple[str | None, str, list[str]]]:
    """(name or None, type spelling, attributes) per parameter of the list opening at ``open_paren``."""
    out = []
    for piece in _split_top(text[open_paren + 1 : _close(text, open_paren)]):
        attrs = [a.strip() for a in _ATTRIBUTE.findall(piece)]
        decl = " ".join(_ATTRIBUTE.sub(" ", piece).split())
        m = re.match(r"^(.*?[\s*&])([A-Za-z_]\w*)$", decl)
        if m and m.group(2) not in _NOT_NAMES and m.group(1).strip():
            out.append((m.group(2), m.group(1).strip(), attrs))
            continue
        out.append((None, decl, attrs))
    return out


def _bound(raw: list[tuple[str | None, str, list[str]]], where: str) -> list[tuple[str | None, str, int]]:
    """The bound arguments (not position attributes) with their buffer index, implied indices filled in."""
    bound, used = [], set()
    for name, spelling, attrs in raw:
        index = None
        is_builtin = False
        for a in attrs:
            m = re.fullmatch(r"buffer\s*\(\s*(\d+)\s*\)", a)
            if m:
                index = int(m.group(1))
            else:
                is_builtin = True
        if is_builtin and index is None:
            continue
        if index is not None:
            used.add(index)
        bound.append([name, spelling, index])
    free = (i for i in range(len(bound) + len(used)) if i not in used)
    for b in bound:
        if b[2] is None:
            b[2] = next(free)
    if any(b[2] in used and sum(c[2] == b[2] for c in bound) > 1 for b in bound):
        raise ValueError(f"{where}: a buffer index is bound twice")
    return [tuple(b) for b in bound]


def _substitute(spelling: str, mapping: dict[str, str]) -> str:
    return re.sub(r"[A-Za-z_]\w*", lambda m: mapping.get(m.group(0), m.group(0)), spelling)


def parse_kernels(source: str, filename: str = "kernel.metal") -> dict[str, Kernel]:
    """The host functions of a Metal source, name -> ``Kernel`` (source ``filename``): the bound arguments
    in buffer order and the declared ``[[max_total_threads_per_threadgroup(N)]]``.

    Plain ``kernel void f(...)`` exports ``f``; a ``template [[host_name("h")]] kernel void f<T>(...)``
    instance exports ``h`` with the template's parameters, its template arguments substituted (and the
    instance's own types checked against them), and the template's thread limit. Names come from the
    template when the instance omits them. ``ValueError`` names the file and kernel for anything malformed
    (an argument type outside ``canonical_type``, buffer indices that are not 0, 1, 2, ... in parameter
    order, no thread limit, or an instance whose limit is not its template's).
    """
    text = _COMMENT.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), source)
    templates: dict[str, tuple[list[str], list, int | None]] = {}
    found: dict[str, Kernel] = {}

    def finish(host: str, bound: list[tuple[str | None, str, int]], limit: int | None, where: str) -> None:
        params = []
        for pos, (name, spelling, index) in enumerate(bound):
            if index != pos:
                raise ValueError(f"{where}: argument {name} is buffer({index}); torch binds arguments in order, so "
                                 f"argument {pos} must be buffer({pos})")  # fmt: skip
            try:
                params.append(Param(name or f"arg{pos}", canonical_type(spelling)))
            except ValueError as e:
                raise ValueError(f"{where}: argument {name}: {e}") from None
        if host in found:
            raise ValueError(f"{where}: host name {host!r} is defined twice")
        if limit is None:
            raise ValueError(f"{where}: no [[max_total_threads_per_threadgroup(N)]]; declare the largest threadgroup "
                             "the host launches (torch refuses a larger one than the pipeline allows)")  # fmt: skip
        try:
            found[host] = Kernel(host, filename, tuple(params), limit)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None

    for m in _KERNEL_HEAD.finditer(text):
        name, targs = m.group(1), m.group(2)
        line = text.count("\n", 0, m.start()) + 1
        where = f"{filename}:{line} ({name})"
        raw = _raw_params(text, m.end() - 1)
        head_start = max(text.rfind(c, 0, m.start()) for c in ";}") + 1
        host = _HOST_NAME.search(text, head_start, m.start())
        declared = _MAX_THREADS.search(text, head_start, m.end())
        limit = int(declared.group(1)) if declared else None
        tmpl = _TEMPLATE_PARAMS.search(text, head_start, m.start())
        if targs is None and tmpl and tmpl.group(1).strip():  # template <typename T> kernel void f(...)
            names = [re.findall(r"[A-Za-z_]\w*", p)[-1] for p in _split_top(tmpl.group(1))]
            templates[name] = (names, raw, limit)
        elif targs is not None:  # template [[host_name("h")]] kernel void f<float>(...);
            if host is None:
                raise ValueError(f"{where}: an explicit instance without [[host_name(...)]] is not callable")
            if name not in templates:
                raise ValueError(f"{where}: instance of {name!r}, which is not a template kernel above it")
            tnames, traw, tlimit = templates[name]
            if limit is not None and limit != tlimit:
                raise ValueError(f"{where}: the instance declares max_total_threads_per_threadgroup({limit}), the "
                                 f"template {tlimit}")  # fmt: skip
            args = [" ".join(a.split()) for a in _split_top(targs[1:-1])]
            if len(args) != len(tnames):
                raise ValueError(f"{where}: {len(args)} template arguments for {len(tnames)} parameters")
            mapping = dict(zip(tnames, args, strict=True))
            if len(raw) != len(traw):
                raise ValueError(f"{where}: the instance has {len(raw)} parameters, the template {len(traw)}")
            merged = []
            for (iname, ispell, iattrs), (tname, tspell, tattrs) in zip(raw, traw, strict=True):
                expected = _substitute(tspell, mapping)
                try:
                    same = _is_position(tattrs) or canonical_type(ispell) == canonical_type(expected)
                except ValueError:
                    same = " ".join(ispell.split()) == " ".join(expected.split())
                if not same:
                    raise ValueError(f"{where}: parameter {tname}: the instance says {ispell!r}, the template "
                                     f"gives {expected!r}")  # fmt: skip
                merged.append((iname or tname, expected, tattrs or iattrs))
            finish(host.group(1), _bound(merged, where), tlimit, where)
        else:
            finish(host.group(1) if host else name, _bound(raw, where), limit, where)
    return found


def _is_position(attrs: list[str]) -> bool:
    return bool(attrs) and not any(re.fullmatch(r"buffer\s*\(\s*\d+\s*\)", a) for a in attrs)
