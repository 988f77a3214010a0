"""The sidecar image's entrypoint run as the image runs it, in front of the session's real tritonserver.

What runs is the Containerfile's ENTRYPOINT after tini (`python3 -m tritongen.sidecar_image`, on
this suite's interpreter: the image's python3 is the only one it has), with the image's ENV and the
env the pod `tritongen deploy` renders, each address moved onto 127.0.0.1 (Triton's to the session
server, the sidecar's to ports free now) and the policy path onto the committed example repository
(what the pod's /models holds: the same render). As a non-root user, as in the image: the image's
UID where the suite runs as root (CI), else the suite's own. The temporary folder stands in for the
pod's emptyDir at /tmp.

It checks that the entrypoint execs the sidecar (the PID started is the sidecar's), that nginx faces
the clients (its processes are the sidecar's children, the status says native, the lane and the
decision socket carried requests), that requests reach Triton, and that SIGTERM stops it cleanly:
exit 0, no nginx left, nginx's folder gone. The image itself is not built here (no container
builder on the suite's machine); tests/unit/test_sidecar_image.py holds the Containerfile.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import EXAMPLES, MODEL_REPOSITORY, example_render
from tests.sidecar_rigs import TINI, containerfile_values, image_entrypoint, image_user
from tritongen.client import STALL_TIMEOUT
from tritongen.core.file_names import POLICY_FILE
from tritongen.k8s import DeployOptions, render_manifests
from tritongen.k8s_warmup import warmup_requests
from tritongen.shared.processes import free_port, tied_to_parent
from tritongen.sidecar_image import VARIABLES
from tritongen.specio import load_spec

pytestmark = pytest.mark.integration

TOKEN = "image-entrypoint-token-0123456789"
BY_ENV = {v.env: v for v in VARIABLES}


def pod_env() -> dict[str, str]:
    """The sidecar container's env in the example deployment's hot pod, as `tritongen deploy` writes it."""
    manifests = render_manifests(load_spec(EXAMPLES / "deployment.yaml").spec, example_render(), DeployOptions(),
                                 "deployment.yaml")
    pod = next(o for o in manifests.objects if o["kind"] == "Deployment")["spec"]["template"]["spec"]
    sidecar = next(c for c in pod["containers"] if c["name"] == "sidecar")
    return {e["name"]: e["value"] for e in sidecar["env"]}


def image_env() -> dict[str, str]:
    """The Containerfile's ENV (KEY=VALUE words)."""
    return dict(word.split("=", 1) for line in containerfile_values("ENV") for word in line.split())


def _open_to_others(path: str) -> bool:
    """Whether a user who is neither owner nor in the group can reach `path` (every folder above it
    searchable, the file itself readable), by the mode bits: as root, os.access says yes to all."""
    target = Path(os.path.realpath(path))
    folders_ok = all(folder.stat().st_mode & 0o001 for folder in target.parents)
    return folders_ok and bool(target.stat().st_mode & 0o004)


def image_user_can_run_us() -> str | None:
    """None when the image's user can run this interpreter and its packages; else what it cannot reach
    (a Python installed under a private home, as pyenv puts it under /root)."""
    import aiohttp

    for path in (sys.executable, os.__file__, aiohttp.__file__, __file__):
        if not _open_to_others(path):
            return path
    return None


def as_image_user(argv: list[str]) -> tuple[list[str], str]:
    """`argv` tied to this process (SIGKILL when it dies) and run as the image's user where the suite
    is root and that user can reach the interpreter, and who runs it. One setpriv for both: it sets
    the death signal after the user, which a change of user would clear."""
    tied = tied_to_parent(argv, signal.SIGKILL)
    if os.geteuid() != 0:
        return tied, f"as uid {os.geteuid()}, the suite's own (not root, as in the image)"
    blocked = image_user_can_run_us()
    if blocked is not None:
        return tied, f"as root: the image's uid {image_user()[0]} cannot reach {os.path.realpath(blocked)}"
    assert Path(tied[0]).name == "setpriv", tied
    uid, gid = image_user()
    return [tied[0], f"--reuid={uid}", f"--regid={gid}", "--clear-groups", *tied[1:]], f"as the image's uid {uid}"


Process = tuple[int, str, str]  # PID, command name, start time: one process, even after its PID is reused


def _stat(pid: int) -> tuple[Process, int] | None:
    """(the process, its parent's PID) from /proc, or None when it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    if fields[0] == "Z":
        return None
    return (pid, stat[stat.index("(") + 1: stat.rindex(")")], fields[19]), int(fields[1])


def children(parent: int) -> list[Process]:
    """The live processes whose parent is `parent`."""
    found = (_stat(int(entry.name)) for entry in Path("/proc").iterdir() if entry.name.isdigit())
    return [proc for proc, ppid in filter(None, found) if ppid == parent]


def alive(process: Process) -> bool:
    """Whether that very process (the same PID and start time) still runs."""
    now = _stat(process[0])
    return now is not None and now[0] == process


def metric(base: str, prefix: str) -> float:
    text = httpx.get(f"{base}/metrics", timeout=5).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))


@pytest.fixture
def folder() -> Iterator[Path]:
    """A folder the image's user can use (pytest's tmp_path is root's alone): the token, the log,
    and the stand-in for the pod's /tmp."""
    path = Path(tempfile.mkdtemp(prefix="tritongen-image-"))
    if os.geteuid() == 0:
        os.chown(path, *image_user())
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_the_entrypoint_runs_the_native_sidecar_as_the_pod_would_and_stops_on_sigterm(triton_server: Any,
                                                                                      folder: Path) -> None:
    pod = pod_env()
    assert pod["TRITONGEN_SIDECAR_POLICY"] == f"/models/{POLICY_FILE}"
    listen, grpc_listen, metrics_listen = (f"127.0.0.1:{free_port()}" for _ in range(3))
    moved = {"--policy": str(MODEL_REPOSITORY / POLICY_FILE), "--url": triton_server.http_url,
             "--grpc-url": triton_server.grpc_url, "--metrics-url": triton_server.metrics_url,
             "--listen": listen, "--grpc-listen": grpc_listen, "--metrics-listen": metrics_listen}
    env = {name: moved.get(BY_ENV[name].flag, value) for name, value in pod.items()}
    assert {BY_ENV[name].flag for name in pod} - set(moved) == {"--front"}  # the rest as the pod says: native
    token = folder / "token"  # as a mounted Secret would hold it
    token.write_text(TOKEN + "\n")
    work = folder / "tmp"
    work.mkdir()
    if os.geteuid() == 0:
        for path in (token, work):
            os.chown(path, *image_user())
    env["TRITONGEN_SIDECAR_TOKEN_FILE"] = str(token)
    env = {**image_env(), "TMPDIR": str(work), "PATH": os.environ["PATH"], **env}
    if "PYTHONPATH" in os.environ:  # the image has tritongen installed; a checkout may not
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]

    entrypoint = image_entrypoint()[len(TINI):]
    assert entrypoint[0] == "python3"
    argv, who = as_image_user([sys.executable, *entrypoint[1:]])
    log = folder / "sidecar.log"
    base, metrics_base = f"http://{listen}", f"http://{metrics_listen}"
    nginx: list[Process] = []
    started = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, f"the entrypoint exited with {proc.returncode}:\n{log.read_text()[-3000:]}"
            try:
                if httpx.get(f"{base}/v2/health/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"not ready in 30 s:\n{log.read_text()[-3000:]}"
            time.sleep(0.1)
        ready_s = time.monotonic() - started

        # The entrypoint exec'd the sidecar: the PID started is the sidecar, nginx its child.
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")
        assert [b"-m", b"tritongen.cli", b"sidecar"] == cmdline[1:4], cmdline
        masters = [p for p in children(proc.pid) if p[1] == "nginx"]
        assert len(masters) == 1, children(proc.pid)
        nginx = masters + [p for p in children(masters[0][0]) if p[1] == "nginx"]
        assert len(nginx) >= 2  # the master and its worker
        if who.startswith("as the image's"):
            assert Path(f"/proc/{proc.pid}").stat().st_uid == image_user()[0]
        status = httpx.get(f"{base}/sidecar/status", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5)
        assert status.status_code == 200 and status.json()["front"]["kind"] == "native", status.text

        # The warm-up requests the pod's self-check sends: a plain infer (nginx's lane, straight to
        # Triton) and a stream (nginx asks the sidecar, then carries it).
        requests = {r["model"]: r for r in warmup_requests(example_render().plan)}
        with httpx.Client(timeout=10) as client:
            infers = [client.post(base + requests["ranker"]["path"], json=requests["ranker"]["body"]) for _ in range(5)]
            stream = client.post(base + requests["tinyllm"]["path"], json=requests["tinyllm"]["body"])
        # 200, or Triton's own queue timeout carried back (the session ranker's REJECT policy, as in
        # test_sidecar_native.py): either way Triton answered
        assert all(r.status_code == 200 or STALL_TIMEOUT in r.text for r in infers), [r.text for r in infers]
        assert any(r.status_code == 200 and r.json()["model_name"] == "ranker" for r in infers)
        assert stream.status_code == 200 and "text_output" in stream.text, stream.text
        deadline = time.monotonic() + 5
        while metric(metrics_base, "sidecar_lane_requests_total") + metric(metrics_base, "sidecar_lane_overflow_total") < 5:
            assert time.monotonic() < deadline, "nginx's lane saw none of the plain requests"
            time.sleep(0.2)
        assert metric(metrics_base, "sidecar_front_wait_seconds_count") >= 1  # the stream was decided for nginx

        proc.send_signal(signal.SIGTERM)  # what the kubelet sends (tini passes it on)
        assert proc.wait(timeout=20) == 0, log.read_text()[-3000:]
        assert not [p for p in nginx if alive(p)], "nginx outlived the sidecar"
        assert not list(work.glob("tritongen-front-*")), "nginx's folder was left behind"
        text = log.read_text()
        assert "tritongen sidecar image: exec -m tritongen.cli sidecar --policy" in text
        assert "native front" in text and "Traceback" not in text, text[-3000:]
        print(f"\nran {who}; ready {ready_s:.1f} s after the entrypoint started; stopped on SIGTERM with exit 0")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid, _, _ in (p for p in nginx if alive(p)):
            os.kill(pid, signal.SIGKILL)
