"""Integration-only collection order.

`make test` runs this folder on two workers, a module at a time each (`-n 2 --dist loadfile
--no-loadscope-reorder`). Left to xdist, modules go out by their number of tests, so the two that
start real vLLM engines (few tests, two engine starts each, the longest modules by far) went out
last and one of them ran alone at the end. They go first; the rest keep their order."""

from __future__ import annotations

import pytest

from tritongen.server import TritonServer

LONGEST_FIRST = ("test_example_repository.py", "test_vllm_engine.py")


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONGEST_FIRST)))  # stable: the rest keep their order


@pytest.fixture(autouse=True)
def _servers_outlive_the_test(request: pytest.FixtureRequest):
    """A shared server that died fails the test it died in, with how it ended (signal or code) and
    its log's last lines: otherwise the module's later tests fail one by one on a refused connection,
    and CI's output shows only that (2026-12-05: a vLLM-backed tritonserver was gone mid-test, and
    nothing said whether it crashed or was killed). A test that stops its server on purpose runs
    it in a fixture of its own, which has ended by now and is not among the test's arguments."""
    yield
    for value in list(request.node.funcargs.values()):
        ended = value.exit_report() if isinstance(value, TritonServer) else None
        if ended is not None:
            pytest.fail(f"a server this test shares {ended}", pytrace=False)
