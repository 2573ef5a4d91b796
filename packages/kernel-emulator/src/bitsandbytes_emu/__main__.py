"""``python -m bitsandbytes_emu FILE [...]``: do kernel sources (.cu, .metal) stay inside the emulated subset?

Compiles each CUDA source in emulation (as the tests would, cached) and prints ``ok`` or the compiler's
message, which names any construct outside the subset. ``--kernel NAME`` (or ``NAME=EXPR`` for a template
instance) also exports that kernel and prints its parameter types. ``--address-spaces`` also type-checks
each Metal source's address spaces with clang (``check_metal_address_spaces``). Exit code 1 when any
file fails.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from . import EmulationCompileError, EmulationError, check_metal_address_spaces, load_cuda, metal_library
from .build import build
from .source import translation_unit


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bitsandbytes_emu", description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="+", type=Path, help="CUDA (.cu) or Metal (.metal) kernel sources")
    parser.add_argument("--kernel", action="append", default=[], metavar="NAME[=EXPR]", help="kernel to export")
    parser.add_argument("-I", dest="include_dirs", action="append", default=[], help="extra include directory")
    parser.add_argument(
        "--address-spaces", action="store_true", help="also check Metal address spaces with clang (-fsyntax-only)"
    )
    args = parser.parse_args(argv)
    exports = dict(k.split("=", 1) if "=" in k else (k, k) for k in args.kernel)
    failed = 0
    for path in args.files:
        try:
            if path.suffix == ".metal":  # Metal: the kernels torch.mps.compile_shader would expose
                lib = metal_library(path, include_dirs=args.include_dirs)
                detail = f"kernels: {', '.join(dir(lib)) or 'none found'}"
                if args.address_spaces:
                    check_metal_address_spaces(path, include_dirs=args.include_dirs)
                    detail += "; address spaces checked"
            elif exports:
                mod = load_cuda(path, exports, include_dirs=args.include_dirs)
                detail = "; ".join(repr(k) for k in mod.kernels.values())
            else:
                text = path.read_text()
                dirs = [str(path.resolve().parent), *args.include_dirs]
                build(translation_unit(text, str(path.resolve()), "cuda", {}), dialect="cuda", label=str(path),
                      include_dirs=dirs, defines={})  # fmt: skip
                found = re.findall(r"__global__\s+(?:[\w:<>]+\s+)*?void\s+(\w+)", text)
                detail = f"kernels: {', '.join(dict.fromkeys(found)) or 'none found'}"
            print(f"ok: {path} ({detail})")
        except (EmulationCompileError, EmulationError, OSError) as e:
            failed += 1
            print(f"FAILED: {path}\n{e}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
