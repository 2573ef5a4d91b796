"""The generated regions of the Metal sources, so that neither a kernel signature nor a format constant is
copied by hand into a ``.metal`` file.

- ``instances``: the explicit template instantiations of a family whose table module lists ``INSTANCES``
  (host name -> ``Instance``); the same entries make its ``KERNELS`` (``kernels``).
- ``constants``: every constant of ``bitsandbytes._formats`` that the source (with the headers it
  includes) uses, rendered from the core as decimal float32 literals that read back bit for bit.

``python -m bitsandbytes_mps.tables._generate`` rewrites both regions of every source the tables name; a
test checks that it would change nothing. Importing this module imports neither torch nor bitsandbytes.
"""

from __future__ import annotations

import importlib
import re
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

from . import Kernel

# bfloat needs MSL 3.1 (macOS 14): its instances are compiled only where the compiler has it (BNB_HAS_BFLOAT
# is defined by the prelude of _assemble.py).
BFLOAT_GUARD = "#if BNB_HAS_BFLOAT"

_BEGIN = "// BEGIN GENERATED {what} (python -m bitsandbytes_mps.tables._generate; do not edit)"
_END = "// END GENERATED {what}"
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)


@dataclass(frozen=True)
class Instance:
    """One ``[[host_name]]`` instance of a kernel template: the template, its template arguments (``""``
    for a plain kernel, which needs no instance), its buffers as (name, MSL type) in binding order, and
    its position attributes as (MSL type, name, attribute)."""

    template: str
    targs: str
    buffers: tuple[tuple[str, str], ...]
    positions: tuple[tuple[str, str, str], ...]


def kernels(source: str, instances: dict[str, Instance], max_threads: dict[str, int]) -> list[Kernel]:
    """The table entries of ``instances`` (``max_threads``: template -> its declared thread limit)."""
    return [Kernel(host, source, inst.buffers, max_threads[inst.template]) for host, inst in instances.items()]


def _instance(host: str, inst: Instance) -> str:
    params = [f"{t} {n} [[buffer({i})]]" for i, (n, t) in enumerate(inst.buffers)]
    params += [f"{t} {n} [[{attr}]]" for t, n, attr in inst.positions]
    head = f'template [[host_name("{host}")]] kernel void {inst.template}<{inst.targs}>('
    return head + "\n    " + ",\n    ".join(params) + ");"


def render_instances(instances: dict[str, Instance]) -> str:
    """The explicit instantiation of every templated kernel (bfloat ones behind BFLOAT_GUARD)."""
    templated = {h: inst for h, inst in instances.items() if inst.targs}
    plain = [_instance(h, inst) for h, inst in templated.items() if not h.endswith("_bf16")]
    bf = [_instance(h, inst) for h, inst in templated.items() if h.endswith("_bf16")]
    return "\n".join([*plain, BFLOAT_GUARD, *bf, "#endif"])


def f32(x: float) -> str:
    """A decimal literal that reads back as exactly the float32 ``x`` (9 significant digits suffice)."""
    (x,) = struct.unpack("<f", struct.pack("<f", x))
    text = f"{x:.9g}"
    if "e" not in text and "." not in text and "n" not in text:
        text += ".0"
    return text + "f"


def format_constants() -> dict[str, str]:
    """name -> MSL definition of every format constant a Metal source may use, in a fixed order."""
    import torch

    from bitsandbytes import _cheader, _formats

    min_scale = torch.tensor(_formats.MIN_SCALE, dtype=torch.float32)
    defines = {
        "BNB_FIRST_VALUE_IN_HIGH_NIBBLE": int(_formats.FIRST_VALUE_IN_HIGH_NIBBLE),
        "BNB_OPTIMIZER_BLOCKSIZE": _formats.OPTIMIZER_BLOCKSIZE,
        "BNB_MIN_SCALE": f32(min_scale.item()),
        "BNB_MIN_SCALE_BITS": f"{min_scale.view(torch.int32).item():#010x}u",
    }
    out = {name: f"#define {name} {value}" for name, value in defines.items()}
    for qt in _formats.QUANT_TYPES:
        table = _formats.code_table(qt).float()
        midpoints, order = _cheader._sorted_thresholds(table)
        pad = order[sum(m < _formats.PAD_VALUE for m in midpoints)]
        up = qt.upper()
        out[f"{up}_TABLE"] = f"constant float {up}_TABLE[16] = {{{', '.join(map(f32, table.tolist()))}}};"
        out[f"{up}_MIDPOINTS"] = f"constant float {up}_MIDPOINTS[15] = {{{', '.join(map(f32, midpoints))}}};"
        out[f"{up}_ORDER"] = f"constant uchar {up}_ORDER[16] = {{{', '.join(map(str, order))}}};"
        out[f"{up}_PAD_CODE"] = f"#define {up}_PAD_CODE {pad}u"
    return out


def _region(what: str) -> re.Pattern[str]:
    begin, end = (re.escape(s.format(what=what)) for s in (_BEGIN, _END))
    return re.compile(f"({begin}\n)(.*?)({end})", re.S)


def generated_regions(text: str) -> dict[str, str]:
    """The current content of each generated region of a source text (``"constants"``, ``"instances"``)."""
    return {what: m.group(2) for what in ("constants", "instances") if (m := _region(what).search(text))}


def render_constants(source: str, text: str) -> str:
    """The constants region of ``text`` (the source ``source``): the format constants its code (and the
    headers it includes) names, outside the region itself."""
    from .. import _assemble

    code = _COMMENT.sub(" ", _region("constants").sub("", _assemble.expand(source, text)))
    return "\n".join(line for name, line in format_constants().items() if re.search(rf"\b{name}\b", code))


def _instances_of(source: str) -> dict[str, Instance]:
    module = importlib.import_module(f"{__package__}.{Path(source).stem}")  # tables/<family>.py
    return getattr(module, "INSTANCES", {})


def render_source(source: str, text: str) -> str:
    """``text`` (of ``metal/<source>``) with each generated region it has rewritten."""
    present = generated_regions(text)
    bodies = {}
    if "constants" in present:
        bodies["constants"] = render_constants(source, text)
    if "instances" in present:
        bodies["instances"] = render_instances(_instances_of(source))
    for what, body in bodies.items():
        text = _region(what).sub(lambda m, body=body: m.group(1) + body + "\n" + m.group(3), text, count=1)
    return text


def main() -> None:
    from .. import _assemble
    from . import by_source

    for source in by_source():
        path = _assemble.source_path(source)
        text = path.read_text()
        new = render_source(source, text)
        if new != text:
            path.write_text(new)
            sys.stdout.write(f"wrote {path}\n")


if __name__ == "__main__":
    main()
