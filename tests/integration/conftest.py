"""Integration-only collection order.

`make test` runs this folder on two workers, a module at a time each (`-n 2 --dist loadfile
--no-loadscope-reorder`). xdist hands out modules in collection order, two to each worker at the
start (first and third to one, second and fourth to the other), then the next to whichever worker
starts its last one; the suite's wall time is the busier worker's. Left to xdist, modules go out
by their number of tests, so the two that start real vLLM engines (few tests, two engine starts
each, the longest modules by far) went out last and one of them ran alone at the end.

Two rules, both measured (2026-12-05, full runs on 2 cores):
- the two vLLM modules run one after the other on one worker (first and third): side by side, both
  engines' threads are pinned to the same core (`split_cores`, as a GPU engine has its device to
  itself) and each module took 1.5x what it takes alone (demo 112 s against 76);
- the rest go longest first, so neither worker is left alone at the end (alphabetical order left
  one idle for the last 38 s of a 360 s run)."""

from __future__ import annotations

import pytest

from tritongen.server import TritonServer

# Seconds of setup + call + teardown in a full run (2026-12-05, the vLLM modules side by side; 691 s
# in all): a module that grows past its neighbours moves up. Modules not listed take a few seconds
# each and keep their order at the end.
LONGEST_FIRST = (
    "test_example_repository.py",  # 142: the demo, with a real vLLM started twice (76 alone)
    "test_llm_standins.py",  # 62
    "test_vllm_engine.py",  # 127: a real vLLM, two engines loaded (82-92 alone)
    "test_zoo_conformance.py",  # 100: the zoo's LLMs and tinyllm profiled as a new user starts (issue 43)
    "test_profile.py",  # 54
    "test_check_vs_server.py",  # 52
    "test_classic_profile.py",  # 47
    "test_doctor_llm.py",  # 41
    "test_sidecar_chaos.py",  # 32
    "test_sim_fidelity.py",  # 29
    "test_doctor.py",  # 29
    "test_sidecar.py",  # 16
    "test_sidecar_native.py",  # 12
    "test_sidecar_streams.py",  # 8
)


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
