"""Every connection error names the address it tried and the option that sets it (issue 16), shown
where it happens: on ports nothing listens on (each picked free at run time and left unbound), a
fake Triton HTTP API on a port of its own, and the sidecar started without a Triton. The CLI runs as
users run it (a subprocess: one line, an exit code, no traceback); the profile's gRPC path runs
against the fake Triton (the profile reads configs over HTTP first). What needs no port is in
tests/unit/test_reach.py.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from sidecar.config import SidecarConfig
from sidecar.run import SidecarThread
from tests.helpers import cli
from tests.sidecar_rigs import policy_doc
from tritongen.cli.profile_cmd import _check_endpoints
from tritongen.client import infer_http, stream_grpc
from tritongen.core.traffic import Arrivals
from tritongen.errors import RunFailed
from tritongen.loadgen import LoadTarget, run_load
from tritongen.profiler.first_output import first_output_int
from tritongen.profiler.load import StreamLoad
from tritongen.profiler.targets import Target
from tritongen.shared.processes import free_port
from tritongen.shared.reach import check_grpc, derived, metrics_problem
from tritongen.triton_admin import Endpoints

pytestmark = pytest.mark.integration

REFUSED = "Connection refused"
TEXT = {"text_input": np.array([b"hello"], dtype=np.object_)}


def said(result) -> str:
    text = " ".join((result.stdout + result.stderr).split())  # rich wraps long lines
    assert "Traceback" not in text and "internal error" not in text, text
    return text


STREAMING_CONFIG = {
    "name": "llm", "backend": "python", "max_batch_size": 0,
    "model_transaction_policy": {"decoupled": True},
    "input": [{"name": "text_input", "data_type": "TYPE_STRING", "dims": [1]}],
    "output": [{"name": "text_output", "data_type": "TYPE_STRING", "dims": [1]}],
}


class FakeTriton(BaseHTTPRequestHandler):
    """Triton's HTTP API as far as `profile` reads it before measuring: one streaming model."""

    def _send(self, code: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path == "/v2/models/llm/ready":
            self._send(200, {})
        elif self.path == "/v2/models/llm/config":
            self._send(200, STREAMING_CONFIG)
        elif self.path == "/v2":
            self._send(200, {"name": "triton", "version": "2.51.0"})
        else:
            self._send(404, {"error": f"no {self.path}"})

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path == "/v2/repository/index":
            self._send(200, [{"name": "llm", "version": "1", "state": "READY"}])
        else:
            self._send(404, {"error": f"no {self.path}"})

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def fake_triton() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeTriton)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


# ---------------------------------------------------------------------------------------------
# The CLI


def test_profile_names_the_http_address_and_url_option(tmp_path: Path) -> None:
    port = free_port()
    result = cli("profile", "--model", "m", "--url", f"127.0.0.1:{port}", "-o", str(tmp_path / "out"))
    text = said(result)
    assert result.returncode == 1, text
    assert f"http://127.0.0.1:{port}" in text and "--url" in text and REFUSED in text


def test_profile_names_the_grpc_address_and_grpc_url_option(tmp_path: Path, fake_triton: str) -> None:
    port = free_port()
    metrics = f"http://127.0.0.1:{free_port()}/metrics"
    result = cli("profile", "--model", "llm", "--url", fake_triton, "--grpc-url", f"127.0.0.1:{port}",
                 "--metrics-url", metrics, "-o", str(tmp_path / "out"))
    text = said(result)
    assert result.returncode == 1, text
    assert f"error: cannot reach Triton's gRPC endpoint at 127.0.0.1:{port} (--grpc-url): " in text
    assert REFUSED in text and "no longer in valid state" not in text


def test_doctor_names_the_http_address_and_url_option() -> None:
    port = free_port()
    result = cli("doctor", "--url", f"127.0.0.1:{port}", "--window", "0.5")
    text = said(result)
    assert result.returncode == 1, text
    assert f"error: cannot reach Triton's HTTP endpoint at http://127.0.0.1:{port} (--url): ConnectError" in text


def test_doctor_names_the_metrics_url_and_its_option(fake_triton: str) -> None:
    metrics = f"http://127.0.0.1:{free_port()}/metrics"
    result = cli("doctor", "--url", fake_triton, "--metrics-url", metrics, "--window", "0.5")
    text = said(result)
    assert result.returncode == 1, text
    assert f"cannot reach Triton's metrics endpoint at {metrics} (--metrics-url): ConnectError" in text


# ---------------------------------------------------------------------------------------------
# The functions behind them


def streaming_target() -> Target:
    return Target(name="llm", kind="streaming", max_batch_size=0, inputs=[], outputs=[], config=STREAMING_CONFIG)


def test_a_derived_grpc_address_says_which_option_sets_it(capsys: pytest.CaptureFixture[str]) -> None:
    grpc, metrics = f"127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}/metrics"
    endpoints = Endpoints(http="127.0.0.1:8000", grpc=grpc, metrics=metrics)
    with pytest.raises(RunFailed) as info:
        _check_endpoints(endpoints, [streaming_target()], False, None, None)
    assert str(info.value).startswith(
        f"cannot reach Triton's gRPC endpoint at {grpc} (derived from --url; pass --grpc-url HOST:PORT): "
    )
    # classic models need no gRPC; metrics are optional: a note naming the address and the option
    classic = Target(name="m", kind="classic", max_batch_size=8, inputs=[], outputs=[], config={})
    _check_endpoints(endpoints, [classic], False, None, None)
    note = " ".join(capsys.readouterr().err.split())
    assert f"cannot reach Triton's metrics endpoint at {metrics} (derived from --url; pass --metrics-url URL)" in note
    assert "profiling without Triton's metrics" in note


def test_the_probes_name_what_they_tried() -> None:
    grpc = f"127.0.0.1:{free_port()}"
    with pytest.raises(RunFailed, match=rf"^cannot reach Triton's gRPC endpoint at {grpc} \(--grpc-url\): .*{REFUSED}"):
        check_grpc(grpc, "--grpc-url")
    metrics = f"http://127.0.0.1:{free_port()}/metrics"
    problem = metrics_problem(metrics, derived("--metrics-url", "--url", "URL"))
    assert problem is not None and problem.startswith(f"cannot reach Triton's metrics endpoint at {metrics} (derived")


def test_the_load_generator_stops_before_its_clock_naming_the_address() -> None:
    arrivals = Arrivals(t=np.array([0.0, 0.01]), cls=np.zeros(2, np.int64), prompt=np.zeros(2, np.int64),
                        output=np.zeros(2, np.int64), rows=np.ones(2, np.int64), class_names=["all"], class_priority=[0])
    http, grpc = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    with pytest.raises(RunFailed, match=rf"^cannot reach Triton's HTTP endpoint at http://{http}: ClientConnectorError"):
        run_load(arrivals, {"all": LoadTarget(model="m")}, http_url=http, request_timeout_s=5)
    with pytest.raises(RunFailed, match=rf"^cannot reach Triton's gRPC endpoint at {grpc}: .*{REFUSED}"):
        run_load(arrivals, {"all": LoadTarget(model="m")}, grpc_url=grpc, request_timeout_s=5)


def test_single_requests_name_the_address() -> None:
    url = f"127.0.0.1:{free_port()}"
    with pytest.raises(RunFailed, match=rf"^cannot reach Triton's HTTP endpoint at http://{url}: ConnectionRefusedError"):
        infer_http(url, "m", {"X": np.zeros((1, 2), np.float32)}, ["Y"])
    with pytest.raises(RunFailed, match=rf"^cannot reach Triton's gRPC endpoint at {url}: .*{REFUSED}"):
        stream_grpc(url, "m", TEXT, "text_output", timeout_s=5)
    with pytest.raises(RunFailed, match=rf"^model 'm': cannot reach Triton's gRPC endpoint at {url} \(--grpc-url; "):
        first_output_int(url, "m", TEXT, "n", timeout_s=5)


def test_a_broken_stream_reports_its_cause_not_tritonclients_invalid_state() -> None:
    url = f"127.0.0.1:{free_port()}"
    load = StreamLoad(url, "m", TEXT, "text_output", request_timeout_s=5)
    record = load.one(TEXT)
    assert record.error is not None and REFUSED in record.error and "valid state" not in record.error
    workers, stop = load.start(1)
    deadline = time.monotonic() + 10
    while workers[0].fatal is None and time.monotonic() < deadline:
        time.sleep(0.02)
    load.finish(workers, stop)
    fatal = workers[0].fatal
    assert fatal is not None and fatal.startswith(f"the gRPC stream to {url} failed: ") and REFUSED in fatal


def test_the_sidecar_starts_without_triton_and_says_where_it_looked(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "sidecar_policy.json"
    path.write_text(json.dumps(policy_doc(headroom={"sources": ["triton_metrics", "static"], "safety_pad_bytes": 0})))
    upstream = f"127.0.0.1:{free_port()}"
    config = SidecarConfig(policy_path=path, upstream=upstream, listen="127.0.0.1:0", metrics_listen="127.0.0.1:0",
                           install_signal_handlers=False, front="python")
    assert config.metrics_how() == "derived from --url; pass --metrics-url URL"
    config.triton_metrics_url = f"http://127.0.0.1:{free_port()}/metrics"
    with caplog.at_level(logging.WARNING), SidecarThread(config):
        pass
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert f"Triton's HTTP endpoint at http://{upstream}/v2/health/ready (--url) does not answer yet" in logged
    assert f"cannot reach Triton's metrics endpoint at {config.triton_metrics_url} (--metrics-url)" in logged
