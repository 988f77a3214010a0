"""How long the launcher waits for a server to become ready, and what it says when one ended on its own."""

from pathlib import Path

from tritongen.server import ENGINE_START_TIMEOUT_S, START_TIMEOUT_S, ServerOptions, describe_exit, start_timeout


def test_a_server_hosting_an_llm_engine_gets_the_engine_start_timeout() -> None:
    engine = ServerOptions(repository=Path("repo"), python_backends={"vllm": Path("backends/vllm")})
    assert start_timeout(engine) == ENGINE_START_TIMEOUT_S > START_TIMEOUT_S
    assert start_timeout(ServerOptions(repository=Path("repo"))) == START_TIMEOUT_S


def test_a_stated_start_timeout_wins() -> None:
    stated = ServerOptions(repository=Path("repo"), python_backends={"vllm": Path("backends/vllm")}, start_timeout_s=30.0)
    assert start_timeout(stated) == 30.0


def test_a_server_that_died_says_by_which_signal_and_quotes_its_log() -> None:
    log = "I1205 ready\nSignal (11) received.\n 0# 0x000055d0 in tritonserver\n"
    crashed = describe_exit(4242, -11, log, Path("tritonserver.log"))
    assert "killed by SIGSEGV" in crashed and "Signal (11) received." in crashed and "4242" in crashed
    assert "exited with code 1" in describe_exit(4242, 1, "", None)
    assert "printed nothing" in describe_exit(4242, -9, "", None)
