"""The kernel tables: one ``tables/<family>.py`` per kernel source, each a ``KERNELS`` list of ``Kernel``.

The launcher generator (build time), the ctypes argument types and the emulated path all read these
entries, so a kernel's name, template instance and parameter types are written exactly once. This package
imports neither torch nor bitsandbytes: CMake runs the generator in a bare build environment.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from dataclasses import dataclass

__all__ = ["POINTEE_TYPES", "SCALAR_TYPES", "Kernel", "all_kernels", "by_source", "element_type", "get", "is_pointer"]

# Scalar C types a kernel parameter may have: name -> (kind, bytes, signed). Kind "int" or "float".
SCALAR_TYPES: dict[str, tuple[str, int, bool]] = {
    "bool": ("int", 1, False),
    "char": ("int", 1, True),
    "signed char": ("int", 1, True),
    "unsigned char": ("int", 1, False),
    "short": ("int", 2, True),
    "unsigned short": ("int", 2, False),
    "int": ("int", 4, True),
    "unsigned": ("int", 4, False),
    "unsigned int": ("int", 4, False),
    "long long": ("int", 8, True),
    "unsigned long long": ("int", 8, False),
    "int8_t": ("int", 1, True),
    "uint8_t": ("int", 1, False),
    "int16_t": ("int", 2, True),
    "uint16_t": ("int", 2, False),
    "int32_t": ("int", 4, True),
    "uint32_t": ("int", 4, False),
    "int64_t": ("int", 8, True),
    "uint64_t": ("int", 8, False),
    "size_t": ("int", 8, False),
    "float": ("float", 4, True),
    "double": ("float", 8, True),
}

# Element types a pointer parameter may point to: name -> bytes per element. Floating types must
# match a tensor's dtype exactly; integer and vector types accept any dtype of a dividing size.
POINTEE_TYPES: dict[str, int] = {
    **{name: size for name, (_, size, _) in SCALAR_TYPES.items() if name != "bool"},
    "bool": 1,
    "void": 1,
    "half": 2,
    "__half": 2,
    "__nv_bfloat16": 2,
    "nv_bfloat16": 2,
    "__half2": 4,
    "__nv_bfloat162": 4,
    **{f"{v}{n}": s * n for v, s in (("char", 1), ("uchar", 1), ("short", 2), ("ushort", 2)) for n in (1, 2, 4)},
    **{f"{v}{n}": s * n for v, s in (("int", 4), ("uint", 4), ("float", 4)) for n in (1, 2, 4)},
    **{f"{v}{n}": 8 * n for v in ("longlong", "ulonglong", "double") for n in (1, 2)},
}

_POINTER = re.compile(r"^(const\s+)?([A-Za-z_][A-Za-z_0-9 ]*?)\s*\*\s*(__restrict__)?$")


def _pointee(ctype: str) -> tuple[str, bool] | None:
    m = _POINTER.match(ctype.strip())
    if not m:
        return None
    return " ".join(m.group(2).split()), bool(m.group(1))


def is_pointer(ctype: str) -> bool:
    """Whether a parameter type from a table is a pointer (``"const float*"``, ``"uint8_t*"``)."""
    return _pointee(ctype) is not None


def element_type(ctype: str) -> tuple[str, bool]:
    """The pointee of a pointer parameter type and whether it is const: ``"const float*"`` -> ``("float", True)``."""
    p = _pointee(ctype)
    if p is None:
        raise ValueError(f"{ctype!r} is not a pointer type")
    return p


@dataclass(frozen=True)
class Kernel:
    """One launchable kernel: exported as ``bnb_cuda_<name>``, defined in ``csrc/kernels/<source>``.

    ``expr`` is the C++ expression naming the ``__global__`` function (a template instance such as
    ``"quantize_blockwise<float, 256>"``); ``params`` its parameter types, in order, as C spellings.
    """

    name: str
    source: str
    expr: str
    params: tuple[str, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ValueError(f"Kernel name must be a C identifier, got {self.name!r}")
        if not isinstance(self.source, str) or not re.fullmatch(r"[A-Za-z_0-9]+\.cu", self.source):
            raise ValueError(f"Kernel {self.name}: source must be a file name like 'blockwise.cu', got {self.source!r}")
        if not isinstance(self.expr, str) or not self.expr.strip():
            raise ValueError(f"Kernel {self.name}: expr must name the __global__ function, got {self.expr!r}")
        if isinstance(self.params, list):
            object.__setattr__(self, "params", tuple(self.params))
        if not isinstance(self.params, tuple) or not all(isinstance(p, str) for p in self.params):
            raise TypeError(f"Kernel {self.name}: params must be a tuple of C type strings, got {self.params!r}")
        for i, p in enumerate(self.params):
            pointee = _pointee(p)
            if pointee is not None:
                if pointee[0] not in POINTEE_TYPES:
                    raise ValueError(
                        f"Kernel {self.name}: parameter {i} {p!r} points to an unknown type {pointee[0]!r}; "
                        f"known: {', '.join(sorted(POINTEE_TYPES))}"
                    )
            elif " ".join(p.split()) not in SCALAR_TYPES:
                raise ValueError(
                    f"Kernel {self.name}: parameter {i} {p!r} is neither a pointer nor a known scalar type "
                    f"({', '.join(SCALAR_TYPES)})"
                )

    @property
    def symbol(self) -> str:
        """The exported C launcher: ``bnb_cuda_<name>``."""
        return f"bnb_cuda_{self.name}"


_all: dict[str, Kernel] | None = None


def _table(module) -> list[Kernel]:
    kernels = getattr(module, "KERNELS", None)
    if not isinstance(kernels, (list, tuple)):
        raise TypeError(f"{module.__name__}.KERNELS must be a list of Kernel, got {type(kernels).__name__}")
    wrong = [k for k in kernels if not isinstance(k, Kernel)]
    if wrong:
        raise TypeError(f"{module.__name__}.KERNELS holds {wrong[0]!r}, not a Kernel")
    return list(kernels)


def all_kernels() -> dict[str, Kernel]:
    """Every table's kernels, name -> Kernel, collected once from the modules of this package.

    The walk is this package's own, not ``bitsandbytes.backends.kit.collect``: the launcher generator runs it
    at build time, where neither torch nor the core is installed."""
    global _all
    if _all is None:
        families = sorted(info.name for info in pkgutil.iter_modules(__path__) if not info.name.startswith("_"))
        found: dict[str, Kernel] = {}
        for family in families:
            module = importlib.import_module(f"{__name__}.{family}")
            for k in _table(module):
                if k.name in found:
                    raise ValueError(f"kernel name {k.name!r} is in two tables ({module.__name__} and another)")
                found[k.name] = k
        _all = found
    return _all


def get(name: str) -> Kernel:
    """The table entry for a kernel name; ``KeyError`` naming the closest names when unknown."""
    kernel = all_kernels().get(name)
    if kernel is None:
        import difflib

        close = ", ".join(difflib.get_close_matches(name, all_kernels(), n=3))
        raise KeyError(
            f"no kernel named {name!r} in bitsandbytes_cuda.tables" + (f"; did you mean {close}?" if close else "")
        )
    return kernel


def by_source() -> dict[str, list[Kernel]]:
    """The kernels grouped by their source file, in table order."""
    kernels = all_kernels().values()
    return {source: [k for k in kernels if k.source == source] for source in dict.fromkeys(k.source for k in kernels)}
