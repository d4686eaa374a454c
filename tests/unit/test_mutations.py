"""The mutation list of bench/mutations.py cannot rot silently: each fix's text is in its file once, and
the break it puts back still compiles."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.mutations import MUTATIONS, Mutation

ROOT = Path(__file__).resolve().parents[2]


def test_mutation_names_are_unique() -> None:
    names = [m.name for m in MUTATIONS]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("mutation", MUTATIONS, ids=[m.name for m in MUTATIONS])
def test_each_fix_is_in_its_file_exactly_once(mutation: Mutation) -> None:
    text = (ROOT / mutation.file).read_text()
    assert text.count(mutation.fixed) == 1, (
        f"{mutation.name}: the fix's text occurs {text.count(mutation.fixed)} times in {mutation.file} "
        "(moved or changed? update tests/support/mutations.py)"
    )


@pytest.mark.parametrize("mutation", MUTATIONS, ids=[m.name for m in MUTATIONS])
def test_each_break_is_python(mutation: Mutation) -> None:
    text = (ROOT / mutation.file).read_text().replace(mutation.fixed, mutation.broken)
    assert text != (ROOT / mutation.file).read_text()
    ast.parse(text, mutation.file)
