"""Every bench imports. Benches run by hand (`make bench-*`), never in the suite, so a moved helper or
a renamed field would otherwise surface only when someone next runs one, an hour into a session.
Importing runs no bench: each starts its work under `if __name__ == "__main__"`."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import bench

BENCHES = sorted(m.name for m in pkgutil.iter_modules(bench.__path__) if m.name.startswith("bench_"))


def test_there_are_benches_to_import() -> None:
    assert len(BENCHES) >= 10, BENCHES


@pytest.mark.parametrize("name", BENCHES)
def test_the_bench_imports(name: str) -> None:
    module = importlib.import_module(f"bench.{name}")
    assert callable(getattr(module, "main", None)), f"bench/{name}.py has no main()"
