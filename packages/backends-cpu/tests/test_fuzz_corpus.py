"""Every input committed under ci/fuzz/corpus/ (the fuzzers' seeds, and each input that once found a bug,
kept as regression-*) replayed once through its harness, without atheris: what `nox -s fuzz` starts from
must pass on every `nox -s tests` run. Here because half the harnesses call this package's extension."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

FUZZ = Path(__file__).resolve().parents[3] / "ci" / "fuzz"
CASES = sorted(
    (target.name, path)
    for target in (FUZZ / "corpus").iterdir()
    if target.is_dir()
    for path in sorted(target.iterdir())
)


@pytest.fixture(scope="module", autouse=True)
def harness_path():
    sys.path.insert(0, str(FUZZ))
    yield
    sys.path.remove(str(FUZZ))


def test_every_corpus_folder_has_a_harness():
    assert {t for t, _ in CASES} == {p.stem.removeprefix("fuzz_") for p in FUZZ.glob("fuzz_*.py")}


@pytest.mark.parametrize(("target", "path"), CASES, ids=[f"{t}/{p.name}" for t, p in CASES])
def test_corpus_input_passes_its_harness(target, path):
    harness = importlib.import_module(f"fuzz_{target}")
    harness.test_one_input(path.read_bytes())
