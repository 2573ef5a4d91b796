"""The address-space check of a Metal source: ``check_metal_address_spaces(source, filename)``.

The emulator runs Metal kernels with ``device``, ``constant``, ``threadgroup`` and ``thread`` erased, so
a pointer handed across address spaces (a threadgroup array to a ``device`` parameter, a device pointer
to a ``thread`` one) or a store through ``constant`` memory runs in emulation and fails on a Mac. This
check type-checks the front end's C++ text with clang (``-fsyntax-only``: nothing is built or run) under
``bnb_emu/metal_as.h``, where each space is a distinct clang address space; clang's diagnostic, with the
.metal file and line, is the error. It needs clang (any C++ compiler runs the kernels; only clang has
address spaces in C++).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from .errors import EmulationCompileError, EmulationError

HERE = Path(__file__).parent
INCLUDE = HERE / "include"
HEADERS = INCLUDE / "bnb_emu" / "metal_headers"
NEED_CLANG = "clang++ (the Metal address-space check needs clang's address_space attribute)"
# Clang prints a qualified type as the attribute; the message says the MSL spelling instead.
_SPACES = {"1": "device", "2": "constant", "3": "threadgroup"}
_SPELLED = re.compile(r"__attribute__\(\(address_space\((\d)\)\)\)")
_REASON = re.compile(r"address space '(\d)'")
# MSL's vector constructor / conversion `float4(...)`: metal_as.h's vectors are ext_vector_types, which
# C++ cannot construct that way (same length and line, so diagnostics keep their columns roughly).
_VECTOR_CALL = re.compile(
    r"(?<![\w:.])((?:float|half|bfloat|int|uint|short|ushort|char|uchar|long|ulong|bool)[234])\s*\("
)


class MetalAddressSpaceError(EmulationCompileError):
    """A Metal source mixes address spaces (or writes to ``constant`` memory) where MSL forbids it;
    ``stderr`` holds clang's diagnostic, in MSL's terms."""


def find_clang() -> list[str] | None:
    """The clang command: $BNB_EMU_CLANG, else clang++ on PATH, else the clang inside PyPI's ``ziglang``
    wheel (``python -m ziglang clang``: pip installs it where no system clang is, as the nox sessions do);
    None when there is none."""
    env = os.environ.get("BNB_EMU_CLANG")
    if env:
        found = shutil.which(env) or (env if Path(env).is_file() else None)
        return [found] if found else None
    system = shutil.which("clang++")
    if system:
        return [system]
    if importlib.util.find_spec("ziglang") is not None:
        return [sys.executable, "-m", "ziglang", "clang"]
    return None


def clang_unavailable_reason() -> str | None:
    """Why the address-space check cannot run here (naming what is missing), or None."""
    if find_clang() is None:
        return (
            f"the Metal address-space check needs {NEED_CLANG}; none found (install clang or the ziglang "
            "wheel, or set BNB_EMU_CLANG)"
        )
    return None


def skip_unless_clang() -> None:
    """In a test: skip it, naming clang, when the address-space check cannot run here."""
    reason = clang_unavailable_reason()
    if reason:
        import pytest

        pytest.skip(reason)


def _msl_terms(text: str) -> str:
    text = _SPELLED.sub(lambda m: _SPACES.get(m.group(1), m.group(0)), text)
    text = re.sub(r"\b__fp16\b", "half", text).replace("long double", "bfloat")  # metal_as.h's stand-ins
    text = text.replace("generic address space", "address space 'thread'")
    return _REASON.sub(lambda m: f"address space '{_SPACES.get(m.group(1), m.group(1))}'", text)


def check_metal_address_spaces(source: str | os.PathLike, filename: str | None = None, *, include_dirs=()) -> None:
    """Raise ``MetalAddressSpaceError`` if ``source`` (Metal text, or the path of a .metal file) passes a
    pointer or reference of one address space where another is declared, or stores through constant
    memory; return None when clang accepts it. Template kernels are checked at their host_name
    instantiations.

    Raises:
        MetalAddressSpaceError: the diagnostic, at the .metal file and line.
        MetalSubsetError / EmulationCompileError: the source is outside the emulated subset.
        EmulationError: no clang here.
    """
    from .metal import MetalSubsetError, translate

    dirs = [str(HEADERS), *(str(Path(d).resolve()) for d in include_dirs)]
    is_path = isinstance(source, str) and "\n" not in source and source.endswith(".metal")
    if isinstance(source, os.PathLike) or is_path:
        path = Path(os.fspath(source)).resolve()
        text = path.read_text()
        filename = filename or str(path)
        dirs.append(str(path.parent))
    else:
        text = str(source)
        filename = filename or "kernel.metal"
    clang = find_clang()
    if clang is None:
        raise EmulationError(clang_unavailable_reason())
    try:
        body, _ = translate(text, filename)
    except MetalSubsetError as e:
        raise EmulationCompileError(f"bnb_emu/metal: {e}") from None
    body = _VECTOR_CALL.sub(lambda m: f"bnb_emu_as_vector<{m.group(1)}>(", body)
    escaped = filename.replace("\\", "\\\\").replace('"', '\\"')
    unit = f'#line 1 "{escaped}"\n{body}\n'
    cmd = [*clang, "-x", "c++", "-std=c++17", "-fsyntax-only", "-ferror-limit=50", "-Wno-unused-value"]
    cmd += ["-Wno-ignored-attributes", "-I", str(INCLUDE), "-include", "bnb_emu/metal_as.h"]
    for d in dirs:
        cmd += ["-I", d]
    proc = subprocess.run([*cmd, "-"], input=unit, capture_output=True, text=True)
    if proc.returncode != 0:
        diag = _msl_terms(proc.stderr.strip())
        # Mostly a mixed space or a store to constant memory; a name metal_as.h does not declare (it
        # stubs the subset's functions) would also land here, and the diagnostic says which.
        raise MetalAddressSpaceError(
            f"{filename}: the Metal address-space check (clang, MSL's address spaces) rejects it:\n{diag}", diag
        )
