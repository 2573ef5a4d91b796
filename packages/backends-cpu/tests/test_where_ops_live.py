"""The CPU column of "Where each op lives" (docs/pages/ops.md) matches this package's tree and its ops."""

from __future__ import annotations

import re
from importlib import import_module
from pathlib import Path

import pytest

from bitsandbytes_cpu.ops import all_ops

PACKAGE = Path(__file__).resolve().parents[1]
OPS_MD = PACKAGE.parents[1] / "docs" / "pages" / "ops.md"
ROW = re.compile(r"^\| (\w+) \| (.+?) \| .+? \| .+? \| (.+?) \|")


def cpu_rows() -> dict[str, tuple[list[str], list[str]]]:
    """family -> (its ops, the CPU column's paths)."""
    if not OPS_MD.is_file():
        pytest.skip(f"{OPS_MD} is not here: this test reads the docs of a source checkout")
    rows = {}
    for line in OPS_MD.read_text().splitlines():
        m = ROW.match(line)
        if m and m[1] != "family":
            rows[m[1]] = (re.findall(r"`([^`]+)`", m[2]), re.findall(r"`([^`]+)`", m[3]))
    return rows


def test_every_path_exists():
    for family, (_, paths) in cpu_rows().items():
        for path in paths:
            where = PACKAGE / ("src/bitsandbytes_cpu" if path.startswith("ops/") else "") / path
            assert where.is_file(), f"{family}: {path} is not in packages/backends-cpu"


def test_each_family_module_holds_its_rows_ops():
    rows = cpu_rows()
    assert sorted(rows) == ["blockwise", "fourbit", "int8", "matmul_4bit", "optimizers"]
    for family, (ops, paths) in rows.items():
        assert paths[0] == f"ops/{family}.py"
        assert set(import_module(f"bitsandbytes_cpu.ops.{family}").OPS) == set(ops), family
    assert set(all_ops()) == {op for ops, _ in rows.values() for op in ops}
