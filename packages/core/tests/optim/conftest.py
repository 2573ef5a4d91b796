"""A clean GlobalOptimManager for every optimizer test."""

from __future__ import annotations

import pytest

import bitsandbytes as bnb


@pytest.fixture(autouse=True)
def fresh_manager():
    # The manager is a process-wide singleton; every test starts and ends with no overrides.
    bnb.optim.GlobalOptimManager.get_instance().initialize()
    yield
    bnb.optim.GlobalOptimManager.get_instance().initialize()
