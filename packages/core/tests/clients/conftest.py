"""Fixtures for the real-client tests (transformers, PEFT, accelerate on CPU). They need those packages
installed (`nox -s tests` does; versions pinned in ci/constraints.txt)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers", reason="client tests need transformers, peft and accelerate (nox installs them)")

from tiny_llama import VOCAB, build_checkpoint


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory):
    return build_checkpoint(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def input_ids():
    g = torch.Generator().manual_seed(1)
    return torch.randint(3, VOCAB, (2, 12), generator=g)
