"""The C header that native kernels include must say exactly what _formats says."""

import re
import struct
from pathlib import Path

import torch

import bitsandbytes
from bitsandbytes import _cheader, _formats


def test_committed_header_is_generated_from_formats():
    header = Path(bitsandbytes.get_include()) / "bitsandbytes" / "formats.h"
    assert header.read_text() == _cheader.render(), "run `python -m bitsandbytes._cheader` and commit the result"


def _floats(name: str, text: str) -> list[float]:
    body = re.search(rf"{name}\[\d+\] = \{{([^}}]*)\}}", text).group(1)
    return [float.fromhex(v.strip().removesuffix("f")) for v in body.split(",")]


def test_header_tables_parse_back_to_the_exact_float32_bits():
    text = _cheader.render()
    for qt in ("nf4", "fp4"):
        parsed = torch.tensor(_floats(f"BNB_{qt.upper()}_TABLE", text), dtype=torch.float32)
        expected = _formats.code_table(qt)
        assert parsed.view(torch.int32).tolist() == expected.view(torch.int32).tolist()
    (scale,) = re.search(r"BNB_INT8_MM_DEQUANT_SCALE (\S+)f", text).groups()
    assert float.fromhex(scale) == struct.unpack("<f", struct.pack("<f", 6.200124e-05))[0]


def test_header_thresholds_reproduce_the_reference_rounding():
    # code = ORDER[count of midpoints < s] must agree with the reference's nearest-code rule everywhere,
    # including exactly on each midpoint and one float32 step either side of it.
    from bitsandbytes._reference.blockwise import nearest_code

    text = _cheader.render()
    for qt in ("nf4", "fp4"):
        mids = torch.tensor(_floats(f"BNB_{qt.upper()}_MIDPOINTS", text), dtype=torch.float32)
        order = torch.tensor(
            [int(v) for v in re.search(rf"BNB_{qt.upper()}_ORDER\[16\] = \{{([^}}]*)\}}", text).group(1).split(",")]
        )
        probes = torch.cat([torch.linspace(-1, 1, 2001), mids, mids.nextafter(mids + 1), mids.nextafter(mids - 1)])
        via_header = order[(mids.unsqueeze(0) < probes.unsqueeze(1)).sum(1)]
        assert torch.equal(via_header, nearest_code(probes, _formats.code_table(qt)))
