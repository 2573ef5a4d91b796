"""The "Where each op lives" table in docs/pages/ops.md matches the core's files, so it cannot rot.

Only the core's columns are checked here (each backend checks its own columns against its tree).
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

import bitsandbytes
from bitsandbytes._ops import OPS
from bitsandbytes._reference import REFERENCE

OPS_MD = Path(__file__).resolve().parents[3] / "docs" / "pages" / "ops.md"
CORE_SRC = Path(bitsandbytes.__file__).parent
HEADER = "| family | ops | reference | conformance |"


def table_rows() -> list[list[str]]:
    if not OPS_MD.is_file():
        pytest.skip(f"{OPS_MD} is not here: this test reads the docs of a source checkout")
    lines = OPS_MD.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(HEADER))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def names(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def test_every_op_is_in_exactly_one_row():
    listed = [op for row in table_rows() for op in names(row[1])]
    assert sorted(listed) == sorted(OPS), f"missing {sorted(set(OPS) - set(listed))}, extra or repeated {listed}"


@pytest.mark.parametrize("column", [2, 3], ids=["reference", "conformance"])
def test_core_files_exist(column):
    for row in table_rows():
        (path,) = names(row[column])
        assert (CORE_SRC / path).is_file(), f"{row[0]}: {path} is not under {CORE_SRC}"


def module_of(path: str):
    return importlib.import_module("bitsandbytes." + path.removesuffix(".py").replace("/", "."))


def test_each_op_is_defined_and_tested_where_its_row_says():
    for family, ops, reference, conformance, *_ in table_rows():
        ref_module = module_of(names(reference)[0]).__name__
        tested = module_of(names(conformance)[0]).OPS_TESTED
        for op in names(ops):
            assert REFERENCE[op].__module__ == ref_module, f"{op}: reference in {REFERENCE[op].__module__}"
            assert op in tested, f"{op}: not in {names(conformance)[0]}'s OPS_TESTED"
        assert Path(names(reference)[0]).stem == family, f"{family}: reference file {names(reference)[0]}"
