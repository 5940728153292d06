"""The test tree's own rule: pytest imports test modules (and the helpers beside them)
by their file's name alone (no ``__init__.py`` in tests/), so two files of one name
anywhere under tests/ fail the whole run's collection ("import file mismatch"), which
a run of one of them never shows."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def test_every_module_under_tests_has_a_name_of_its_own() -> None:
    where: dict[str, list[str]] = defaultdict(list)
    for path in TESTS.rglob("*.py"):
        if path.name in ("conftest.py", "__init__.py") or "__pycache__" in path.parts:
            continue
        where[path.name].append(str(path.relative_to(TESTS)))
    assert {name: paths for name, paths in where.items() if len(paths) > 1} == {}
