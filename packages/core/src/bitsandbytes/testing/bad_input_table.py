"""The bad-input matrix's printed table: rows recorded by the conformance suite's and the backends' matrix
tests, written once in the terminal summary with the counts per backend and per outcome."""

from __future__ import annotations

import pytest

PLUGIN = "bnb-bad-input-matrix"

# (backend, group, case, outcome); outcome is "raises: <type>" or "result: <what>".
ROWS: list[tuple[str, str, str, str]] = []


def record(backend: str, group: str, case: str, outcome: str) -> None:
    ROWS.append((backend, group, case, outcome))


def _counts(rows) -> str:
    kinds: dict[str, int] = {}
    for *_, outcome in rows:
        kind = outcome.split(":")[0]
        kinds[kind] = kinds.get(kind, 0) + 1
    return ", ".join(f"{k}: {v}" for k, v in sorted(kinds.items()))


class _Report:
    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not ROWS:
            return
        tr = terminalreporter
        tr.section("bad-input matrix (cases x outcome)")
        widths = [max(len(row[i]) for row in ROWS) for i in range(3)]
        for row in sorted(ROWS):
            tr.write_line("  ".join([*(f"{v:<{w}}" for v, w in zip(row, widths, strict=False)), row[3]]))
        tr.write_line(f"bad-input cases: {len(ROWS)} ({_counts(ROWS)})")
        for backend in sorted({r[0] for r in ROWS}):
            rows = [r for r in ROWS if r[0] == backend]
            tr.write_line(f"  {backend}: {len(rows)} ({_counts(rows)})")


def install(config: pytest.Config) -> None:
    """Print the table at the end of this run (once, however many test files install it)."""
    if not config.pluginmanager.has_plugin(PLUGIN):
        config.pluginmanager.register(_Report(), PLUGIN)
