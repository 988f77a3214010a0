"""Integration-only collection order.

`make test` runs this folder on two workers, a module at a time each (`-n 2 --dist loadfile
--no-loadscope-reorder`). Left to xdist, modules go out by their number of tests, so the two that
start real vLLM engines (few tests, two engine starts each, the longest modules by far) went out
last and one of them ran alone at the end. They go first; the rest keep their order."""

from __future__ import annotations

import pytest

LONGEST_FIRST = ("test_example_repository.py", "test_vllm_engine.py")


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONGEST_FIRST)))  # stable: the rest keep their order
