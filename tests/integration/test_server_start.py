"""The launcher's ports: drawn below the kernel's ephemeral range (read from the kernel), and one it
chose and lost before tritonserver bound it is chosen again; and what its Python stubs keep in shared
memory goes with it."""

from __future__ import annotations

import signal
import socket
from pathlib import Path

import httpx
import pytest

import tritongen.server as server_module
from tritongen.server import ServerOptions, TritonServer
from tritongen.shared import processes
from tritongen.shared.processes import free_port

pytestmark = pytest.mark.integration


def test_a_chosen_port_taken_before_the_server_binds_it_is_chosen_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process takes the gRPC port between the launcher's choice and tritonserver's bind
    (a client's connection, a second server starting): the start still succeeds, on other ports."""
    thief = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    thief.bind(("127.0.0.1", free_port()))
    thief.listen()
    taken = thief.getsockname()[1]
    draws: list[int] = []

    def choose() -> int:
        port = taken if len(draws) == 1 else free_port()  # the second draw is the gRPC port's
        draws.append(port)
        return port

    monkeypatch.setattr(server_module, "free_port", choose)
    try:
        with TritonServer(ServerOptions(repository=tmp_path, model_control="explicit")) as server:
            assert server.options.grpc_port != taken
            assert httpx.get(f"http://{server.http_url}/v2/health/ready", timeout=5).status_code == 200
    finally:
        thief.close()
    assert len(draws) == 6, draws  # three ports, chosen twice


@pytest.mark.parametrize(("text", "expected"), [
    ("32768\t60999\n", (processes.LOW_PORT, 32768)),
    ("49152 65535", (processes.LOW_PORT, 49152)),
    ("10500 60999", None),  # too little room below the ephemeral range: the kernel's bind(0)
    ("", None),
    ("garbage", None),
])
def test_the_listening_range_ends_where_the_ephemeral_range_begins(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, expected: tuple[int, int] | None) -> None:
    path = tmp_path / "ip_local_port_range"
    path.write_text(text)
    monkeypatch.setattr(processes, "_EPHEMERAL_RANGE", path)
    assert processes._listening_range() == expected


def test_an_unreadable_range_is_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(processes, "_EPHEMERAL_RANGE", tmp_path / "missing")
    assert processes._listening_range() is None


IDENTITY_CONFIG = '''backend: "python"
max_batch_size: 0
input [ { name: "IN", data_type: TYPE_FP32, dims: [ 1 ] } ]
output [ { name: "OUT", data_type: TYPE_FP32, dims: [ 1 ] } ]
'''
IDENTITY_MODEL = '''import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())])
                for r in requests]
'''


def test_a_killed_server_leaves_no_shared_memory_behind(tmp_path: Path) -> None:
    """The Python backend's stubs keep their regions in /dev/shm, which only a clean shutdown
    removes: a server killed (or crashed) left them in RAM until the host rebooted. Each server has
    a prefix of its own, and stop() clears it, however the server ended."""
    (tmp_path / "identity" / "1").mkdir(parents=True)
    (tmp_path / "identity" / "config.pbtxt").write_text(IDENTITY_CONFIG)
    (tmp_path / "identity" / "1" / "model.py").write_text(IDENTITY_MODEL)
    server = TritonServer(ServerOptions(repository=tmp_path)).start()
    try:
        assert server.shm_prefix is not None
        assert list(server_module.SHM_DIR.glob(f"{server.shm_prefix}*")), "the stub's regions carry this server's prefix"
        assert server.process is not None
        processes.kill_group(server.process, signal.SIGKILL)  # no shutdown: the stubs' regions stay
        server.process.wait(timeout=10)
        assert list(server_module.SHM_DIR.glob(f"{server.shm_prefix}*"))
    finally:
        server.stop()
    assert not list(server_module.SHM_DIR.glob(f"{server.shm_prefix}*"))
