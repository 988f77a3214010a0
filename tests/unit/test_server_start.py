"""How long the launcher waits for a server to become ready: by what it serves, unless told."""

from pathlib import Path

from tritongen.server import ENGINE_START_TIMEOUT_S, START_TIMEOUT_S, ServerOptions, start_timeout


def test_a_server_hosting_an_llm_engine_gets_the_engine_start_timeout() -> None:
    engine = ServerOptions(repository=Path("repo"), python_backends={"vllm": Path("backends/vllm")})
    assert start_timeout(engine) == ENGINE_START_TIMEOUT_S > START_TIMEOUT_S
    assert start_timeout(ServerOptions(repository=Path("repo"))) == START_TIMEOUT_S


def test_a_stated_start_timeout_wins() -> None:
    stated = ServerOptions(repository=Path("repo"), python_backends={"vllm": Path("backends/vllm")}, start_timeout_s=30.0)
    assert start_timeout(stated) == 30.0
