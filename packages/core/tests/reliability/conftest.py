"""Shared hooks for the reliability tests: the bad-input matrix prints its table in the terminal summary."""

from __future__ import annotations

import pytest

# (group, case, outcome) rows appended by the matrix_row fixture, printed once at the end of the run.
_ROWS: list[tuple[str, str, str]] = []


@pytest.fixture
def matrix_row():
    def record(group: str, case: str, outcome: str) -> None:
        _ROWS.append((group, case, outcome))

    return record


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not _ROWS:
        return
    tr = terminalreporter
    tr.section("bad-input matrix (cases x outcome)")
    w_group = max(len(g) for g, _, _ in _ROWS)
    w_case = max(len(c) for _, c, _ in _ROWS)
    for group, case, outcome in sorted(_ROWS):
        tr.write_line(f"{group:<{w_group}}  {case:<{w_case}}  {outcome}")
    kinds: dict[str, int] = {}
    for _, _, outcome in _ROWS:
        kind = outcome.split(":")[0]
        kinds[kind] = kinds.get(kind, 0) + 1
    summary = ", ".join(f"{k}: {v}" for k, v in sorted(kinds.items()))
    tr.write_line(f"bad-input cases: {len(_ROWS)} ({summary})")
