"""The Metal source of each kernel family as the compilers see it: the prelude, then ``metal/<source>``
with the headers of ``metal/`` it includes (``#include "quantize.h"``) pasted in.

Both loaders compile exactly this text: ``torch.mps.compile_shader`` at run time, which takes one text
and no include path (and the emulator in the tests), and the CMake build on macOS (``python _assemble.py
--out DIR`` writes one ``.metal`` per source, which ``xcrun metal`` turns into ``bitsandbytes.metallib``).
Imports neither torch nor bitsandbytes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from pathlib import Path

METAL_DIR = Path(__file__).parent / "metal"

# bfloat arrived with MSL 3.1 (macOS 14). Kernel sources guard their bfloat code with `#if BNB_HAS_BFLOAT`
# so that one source still compiles where it is missing; the bf16 kernels are then absent from the
# library and their ops run on the reference. The emulator defines no __METAL_VERSION__ and has bfloat,
# so it is told directly.
PRELUDE = """\
// --- bitsandbytes-mps prelude (bitsandbytes_mps/_assemble.py) ---
#ifndef BNB_HAS_BFLOAT
#if defined(__METAL_VERSION__) && __METAL_VERSION__ >= 310
#define BNB_HAS_BFLOAT 1
#else
#define BNB_HAS_BFLOAT 0
#endif
#endif
"""
EMULATOR_DEFINES = "#define BNB_HAS_BFLOAT 1\n"

# Written by the build beside bitsandbytes.metallib: the digest of each assembled source the metallib was
# compiled from. The loader binds the metallib only when every digest matches the sources installed with
# it, since a kernel whose signature changed under an unchanged name would otherwise bind its arguments
# in the wrong order.
MANIFEST_NAME = "bitsandbytes.metallib.json"
MANIFEST_FORMAT = 1


def source_path(source: str) -> Path:
    """The file of a table's ``source`` (``"int8.metal"``)."""
    return METAL_DIR / source


def non_ascii(text: str, where: str) -> list[str]:
    """Each non-ASCII character of ``text`` as ``where:LINE:COLUMN: 'c' (U+XXXX)``, lines as compilers count them."""
    if text.isascii():
        return []
    return [
        f"{where}:{row}:{col}: {ch!r} (U+{ord(ch):04X})"
        for row, line in enumerate(text.split("\n"), 1)
        for col, ch in enumerate(line, 1)
        if not ch.isascii()
    ]


def check_ascii(text: str, where: str) -> None:
    """Raise ``ValueError`` naming every non-ASCII character of ``text``.

    torch.mps.compile_shader turns the source into an NSString with NSASCIIStringEncoding, so one such
    character (a multiplication sign in a comment) fails the compile of the whole family, on a Mac only; the emulator
    and the offline compiler would accept it. Checking here makes every path refuse it alike."""
    bad = non_ascii(text, where)
    if bad:
        more = f" (and {len(bad) - 5} more)" if len(bad) > 5 else ""
        raise ValueError(
            f"Metal source {where} has non-ASCII characters, which torch.mps.compile_shader cannot read: "
            + "; ".join(bad[:5])
            + more
        )


def _read(name: str) -> str:
    path = source_path(name)
    try:
        body = path.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise FileNotFoundError(f"Metal source {str(path)!r} cannot be read: {e.strerror}") from None
    check_ascii(body, str(path))
    return body


# A header of metal/ included by a source: pasted in where it is included.
_LOCAL_INCLUDE = re.compile(r'^#include "(\w+\.h)"[ \t]*$', re.M)


def expand(source: str, text: str | None = None) -> str:
    """``metal/<source>`` (or ``text`` as that file) with each ``#include "<header>"`` of ``metal/`` replaced
    by the header, once per source (a second include of it is dropped); ``#line`` keeps compiler messages
    on each file's own lines.

    Raises ``ValueError`` if a file is not pure ASCII (``check_ascii``)."""
    pasted: set[str] = set()

    def paste(name: str, body: str) -> str:
        def one(m: re.Match[str]) -> str:
            header = m.group(1)
            after = f'#line {body.count(chr(10), 0, m.end()) + 2} "{name}"'
            if header in pasted:
                return after
            pasted.add(header)
            return f'#line 1 "{header}"\n{paste(header, _read(header)).rstrip(chr(10))}\n{after}'

        return _LOCAL_INCLUDE.sub(one, body)

    if text is None:
        text = _read(source)
    else:
        check_ascii(text, source)
    return paste(source, text)


def assemble(source: str, *, emulated: bool = False) -> str:
    """The compilable text of ``metal/<source>``: the prelude, then ``expand(source)``.

    Raises ``ValueError`` if the text is not pure ASCII (``check_ascii``)."""
    body = expand(source)
    head = (EMULATOR_DEFINES if emulated else "") + PRELUDE
    check_ascii(head, "the prelude (bitsandbytes_mps/_assemble.py)")
    return f'{head}#line 1 "{source}"\n{body}'


def digest(source: str) -> str:
    """The sha256 of ``assemble(source)``: what the metallib manifest records for it."""
    return hashlib.sha256(assemble(source).encode("utf-8")).hexdigest()


def manifest(names: list[str] | None = None) -> dict:
    """The manifest of a metallib built from ``names`` (default: every source)."""
    return {"format": MANIFEST_FORMAT, "sources": {n: digest(n) for n in (sources() if names is None else names)}}


def sources() -> list[str]:
    """The Metal sources, ``metal/*.metal`` by name: the kernel families (a test checks that the tables
    name exactly these). Read off the directory, because CMake runs this file in a Python without torch,
    which the tables' collection needs."""
    return sorted(p.name for p in METAL_DIR.glob("*.metal"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write the assembled Metal sources (for xcrun metal).")
    parser.add_argument("--out", required=True, type=Path, help="directory for <source>.metal files")
    parser.add_argument("--list", action="store_true", help="only print the sources, one a line")
    parser.add_argument("--manifest", type=Path, help=f"also write the metallib manifest ({MANIFEST_NAME}) here")
    args = parser.parse_args(argv)
    names = sources()
    if args.list:
        print("\n".join(names))
        return 0
    if args.manifest is not None:
        text = json.dumps(manifest(names), indent=1, sort_keys=True) + "\n"
        if not args.manifest.exists() or args.manifest.read_text() != text:
            args.manifest.parent.mkdir(parents=True, exist_ok=True)
            args.manifest.write_text(text)
    args.out.mkdir(parents=True, exist_ok=True)
    for name in names:
        target = args.out / name
        text = assemble(name)
        if not target.exists() or target.read_text() != text:  # keep timestamps: no needless rebuilds
            target.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
