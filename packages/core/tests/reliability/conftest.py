"""Shared hooks for the reliability tests: the bad-input matrix prints its table in the terminal summary."""

from __future__ import annotations

import matrix_table


def pytest_configure(config):
    matrix_table.install(config)
