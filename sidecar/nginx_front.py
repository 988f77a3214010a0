"""nginx as the sidecar's front door (`tritongen sidecar --front native`): its configuration, its
process, and the control socket the lane's slots and counts go through.

Why nginx: a proxy's cost per request is mostly parsing and copying bytes, which a Python event
loop does at 2-3x nginx's CPU (README, bench_sidecar). nginx carries the bytes of every model
request: plain classic ones on the lane (sidecar/lane.py), the other HTTP and gRPC `ModelInfer`
ones once Python has decided (sidecar/decisions.py), gRPC `ModelStreamInfer` carried or handed to
the Python relay as sidecar/stream_path.py says (nginx's Lua cannot read a request out of an open
HTTP/2 stream). The rest (admin APIs, health, the sidecar's own endpoints, compressed bodies,
bodies too large for memory) goes to the Python listeners on private ports. docs/layout.md has
the table.

Needs Debian's `nginx-light` (or any nginx 1.19+) and `libnginx-mod-http-lua`. The binary and the
module directory can be moved with TRITONGEN_NGINX and TRITONGEN_NGINX_MODULES.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import logging

import aiohttp

from sidecar.lane import LaneCounts, LaneKey, caps_body, parse_counts
from sidecar.metrics import LATENCY_BUCKETS
from sidecar.reading import PRIORITY
from sidecar.stream_path import CARRIED, stream_path
from tritongen.core.sidecar_policy.schema import SidecarPolicy
from tritongen.errors import BadInput
from tritongen.shared.processes import kill_group, tied_to_parent

NGINX = "/usr/sbin/nginx"
MODULE_DIR = "/usr/lib/nginx/modules"
MODULES = ("ndk_http_module.so", "ngx_http_lua_module.so")
LUA_DIR = Path(__file__).resolve().parent  # sidecar/tritongen_lane.lua, sidecar/tritongen_decide.lua
BODY_IN_MEMORY = 8 * 1024 * 1024  # larger bodies spill to a file, and nginx hands them to Python
LONG_S = 3600  # streams and queue waits: nginx must not time them out before the sidecar does
WORKER_CONNECTIONS = 8192  # nginx's connections at once, clients' and upstream ones together
# Streams one client connection may hold open at once. nginx's default (128) held a gRPC client's
# 129th stream in the client's own library, where the sidecar can neither queue, order nor refuse it:
# through the sidecar at 1.5x of the zoo's textgen, streams waited there seconds with no refusal
# (bench/results/zoo-sidecar.md, 2026-12-07 06:54), where Triton's own gRPC server takes them all.
# Each stream nginx holds for a decision keeps a connection to the decision socket: half the
# worker's connections, so that the upstream ones always find room.
HTTP2_STREAMS = WORKER_CONNECTIONS // 2
log = logging.getLogger("tritongen.sidecar")
INSTALL_HINT = "Debian/Ubuntu: `apt-get install nginx-light libnginx-mod-http-lua`"


class NativeFrontUnavailable(BadInput):
    """`--front native` was asked for and nginx with Lua cannot run here."""


@dataclass(frozen=True)
class NginxInstall:
    binary: Path
    modules: tuple[Path, ...]


def find_nginx() -> tuple[NginxInstall | None, str]:
    """(the install, "") or (None, why not)."""
    binary = Path(os.environ.get("TRITONGEN_NGINX", NGINX))
    if not os.access(binary, os.X_OK):
        return None, f"{binary} is not installed ({INSTALL_HINT}; TRITONGEN_NGINX names another binary)"
    folder = Path(os.environ.get("TRITONGEN_NGINX_MODULES", MODULE_DIR))
    modules = tuple(folder / name for name in MODULES)
    missing = [str(m) for m in modules if not m.exists()]
    if missing:
        return None, f"nginx's Lua module is missing: {', '.join(missing)} ({INSTALL_HINT})"
    return NginxInstall(binary, modules), ""


@dataclass(frozen=True)
class FrontAddresses:
    """Where nginx listens (the sidecar's public ports) and where it sends requests."""

    http_listen: str  # host:port
    triton_http: str
    sidecar_http: str
    grpc_listen: str | None = None
    triton_grpc: str | None = None
    sidecar_grpc: str | None = None


def _header_var(name: str) -> str:
    return "http_" + name.lower().replace("-", "_")


def _lua_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def control_socket(work: Path) -> Path:
    return work / "control.sock"


def decision_socket(work: Path) -> Path:
    """Where the sidecar answers nginx's questions about the requests it carries (sidecar/decisions.py)."""
    return work / "decide.sock"


def upstream_block(name: str, server: str) -> str:
    """An upstream with a keep-alive pool: nginx reuses its connections to Triton and to the
    Python listeners instead of opening one per request."""
    return f"""    upstream {name} {{
        server {server};
        keepalive 64;
        keepalive_requests 1000000;
    }}
"""


def process_preamble(work: Path) -> str:
    """One worker in the foreground, its pid, logs and temporary files in `work` (a private
    folder), as root's workers too (they would run as nobody, locked out of `work`)."""
    user = "user root;\n" if os.geteuid() == 0 else ""
    return f"""{user}daemon off;
worker_processes 1;
pid {work}/nginx.pid;
error_log {work}/error.log warn;
events {{
    worker_connections {WORKER_CONNECTIONS};
}}
"""


def temp_paths(work: Path) -> str:
    return "".join(f"    {kind}_temp_path {work}/{kind};\n" for kind in ("client_body", "proxy", "fastcgi", "uwsgi",
                                                                          "scgi"))


def render_config(install: NginxInstall, work: Path, at: FrontAddresses, policy: SidecarPolicy) -> str:
    """The whole nginx.conf. Pure: the same inputs give the same text (a reload compares them)."""
    modules = "".join(f"load_module {m};\n" for m in install.modules)
    limits = policy.limits
    configure = (f"lane.configure{{class_var = {_lua_string(_header_var(policy.class_header))}, "
                 f"tenant_var = {_lua_string(_header_var(policy.tenant_header))}, "
                 f"class_parameter = {_lua_string(policy.class_parameter)}, "
                 f"priority_parameter = {_lua_string(PRIORITY)}, "
                 f"default_class = {_lua_string(policy.default_class)}, "
                 f"buckets = {{{', '.join(repr(b) for b in LATENCY_BUCKETS)}}}}}")
    too_large_json = (f'{{"error": "the request body is over limits.max_body_bytes of the sidecar policy '
                      f'({limits.max_body_bytes} bytes)", "reason": "body_too_large"}}')
    down_json = ('{"error": "Triton is unavailable: the lane could not reach it", '
                 '"reason": "upstream_unavailable", "retry_after_s": 1}')
    grpc = "" if at.grpc_listen is None else upstream_block("triton_grpc", str(at.triton_grpc)) + upstream_block(
        "sidecar_grpc", str(at.sidecar_grpc)) + f"""    server {{
        listen {at.grpc_listen} http2;
        keepalive_requests 1000000;
        http2_max_concurrent_streams {HTTP2_STREAMS};
        grpc_read_timeout {LONG_S}s;
        grpc_send_timeout {LONG_S}s;
        header_filter_by_lua_block {{ ngx.header["Server"] = nil; ngx.header["Date"] = nil }}
        set $tg_lane "";
        set $tg_decided "";  # else every lane request's log phase warns that it is uninitialized
        location = /inference.GRPCInferenceService/ModelInfer {{
            lua_check_client_abort on;
            access_by_lua_block {{ require("tritongen_lane").grpc() }}
            log_by_lua_block {{ require("tritongen_lane").log("ok") require("tritongen_decide").log("ok") }}
            error_page 502 504 = @triton_down_grpc;
            grpc_pass grpc://triton_grpc;
        }}
{_carried_streams(policy)}        location / {{
            grpc_pass grpc://sidecar_grpc;
        }}
        location @sidecar_grpc {{
            grpc_pass grpc://sidecar_grpc;
        }}
        location @triton_down_grpc {{
            log_by_lua_block {{ require("tritongen_lane").log("down") require("tritongen_decide").log("down") }}
            default_type application/grpc;
            add_header grpc-status 14 always;
            add_header grpc-message "Triton is unavailable: the lane could not reach it" always;
            return 204;
        }}
    }}
"""
    return f"""{modules}{process_preamble(work)}http {{
    access_log off;
{temp_paths(work)}    client_max_body_size {limits.max_body_bytes};
    client_body_buffer_size {min(BODY_IN_MEMORY, limits.max_body_bytes)};
    large_client_header_buffers 8 {limits.max_header_bytes};
    lua_package_path "{LUA_DIR}/?.lua;;";
    lua_shared_dict tg_caps 1m;
    lua_shared_dict tg_inflight 1m;
    lua_shared_dict tg_stats 1m;
    lua_max_pending_timers 16384;
    init_by_lua_block {{
        local lane = require("tritongen_lane")
        {configure}
        require("tritongen_decide").configure({_lua_string(str(decision_socket(work)))})
    }}
    init_worker_by_lua_block {{ require("tritongen_decide").start_worker() }}
{upstream_block("triton_http", at.triton_http)}{upstream_block("sidecar_http", at.sidecar_http)}    server {{
        listen {at.http_listen};
        keepalive_requests 1000000;
        proxy_http_version 1.1;
        proxy_set_header Connection "";
        proxy_buffering off;
        proxy_read_timeout {LONG_S}s;
        proxy_send_timeout {LONG_S}s;
        set $tg_lane "";
        set $tg_decided "";
        error_page 413 = @too_large;
        location ~ ^/v2/models/(?<tg_model>[^/]+)(/versions/[^/]+)?/(?<tg_op>generate|generate_stream)$ {{
            lua_check_client_abort on;  # a client that leaves while queued leaves the sidecar's queue
            access_by_lua_block {{ require("tritongen_decide").access(ngx.var.tg_model, ngx.var.tg_op, {_lua_string(_header_var(policy.class_header))}, {_lua_string(_header_var(policy.tenant_header))}) }}
            body_filter_by_lua_block {{ require("tritongen_decide").body() }}
            log_by_lua_block {{ require("tritongen_decide").log("ok") }}
            error_page 502 504 = @triton_down;
            error_page 413 = @too_large;
            proxy_pass http://triton_http;
        }}
        location ~ ^/v2/models/(?<tg_model>[^/]+)(/versions/[^/]+)?/infer$ {{
            lua_check_client_abort on;
            access_by_lua_block {{ require("tritongen_lane").http(ngx.var.tg_model) }}
            body_filter_by_lua_block {{ require("tritongen_decide").body() }}
            log_by_lua_block {{ require("tritongen_lane").log("ok") require("tritongen_decide").log("ok") }}
            error_page 502 504 = @triton_down;
            error_page 413 = @too_large;  # a location's error_page replaces the server's, not adds to it
            proxy_buffering on;  # a unary answer: one write to the client
            proxy_pass http://triton_http;
        }}
        location / {{
            proxy_pass http://sidecar_http;
        }}
        location @sidecar {{
            proxy_pass http://sidecar_http;
        }}
        location @too_large {{
            default_type application/json;
            return 413 '{too_large_json}';
        }}
        location @triton_down {{  # whichever holds the request (a lane slot, a decision) gives it back
            log_by_lua_block {{ require("tritongen_lane").log("down") require("tritongen_decide").log("down") }}
            default_type application/json;
            add_header Retry-After 1 always;
            return 503 '{down_json}';
        }}
    }}
{grpc}    server {{
        listen unix:{control_socket(work)};
        location = /lane {{
            content_by_lua_block {{ require("tritongen_lane").control() }}
        }}
    }}
}}
"""


def _carried_streams(policy: SidecarPolicy) -> str:
    """The location that carries gRPC streams to Triton, where the policy's streams take that way
    (sidecar/stream_path.py); else none, and they reach the Python relay through `location /`."""
    if stream_path(policy, native_front=True).mode != CARRIED:
        return ""
    klass, tenant = _lua_string(_header_var(policy.class_header)), _lua_string(_header_var(policy.tenant_header))
    return f"""        location = /inference.GRPCInferenceService/ModelStreamInfer {{
            lua_check_client_abort on;  # a client that leaves while queued leaves the sidecar's queue
            access_by_lua_block {{ require("tritongen_decide").stream({klass}, {tenant}) }}
            body_filter_by_lua_block {{ require("tritongen_decide").stream_body() }}
            log_by_lua_block {{ require("tritongen_decide").log("ok") }}
            error_page 502 504 = @triton_down_grpc;
            grpc_pass grpc://triton_grpc;
        }}
"""


class NginxFront:
    """One nginx master (with one worker) owned by the sidecar, stopped by its PID."""

    def __init__(self, install: NginxInstall, addresses: FrontAddresses, policy: SidecarPolicy) -> None:
        self.install = install
        self.work = Path(tempfile.mkdtemp(prefix="tritongen-front-"))
        self.addresses = addresses
        self.conf = self.work / "nginx.conf"
        self.text = render_config(install, self.work, addresses, policy)
        self.proc: subprocess.Popen[bytes] | None = None
        self._session: aiohttp.ClientSession | None = None
        # Called when nginx died and is started again: what its requests held must go back.
        self.on_restart: Callable[[], None] | None = None

    def _logs(self) -> str:
        parts = [p.read_text(errors="replace") for p in (self.work / "stderr.log", self.work / "error.log") if p.exists()]
        return "".join(parts)[-2000:]

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    async def revive(self) -> bool:
        """Start nginx again if it died (a crash, an operator's kill): the clients' front door must
        not stay shut while the sidecar lives. Its workers go first (they would keep the ports).
        True if it was restarted."""
        if self.proc is None or self.running:
            return False
        log.error("nginx (the native front) exited with %s; starting it again: %s", self.proc.returncode,
                  self._logs()[-500:])
        self._kill_group()
        await self._close_session()
        if self.on_restart is not None:
            self.on_restart()
        await self.start()
        return True

    def _kill_group(self) -> None:
        if self.proc is not None:
            kill_group(self.proc)

    async def _close_session(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def start(self, timeout_s: float = 10.0) -> None:
        self.conf.write_text(self.text)
        with contextlib.suppress(FileNotFoundError):
            control_socket(self.work).unlink()  # a dead nginx's socket file would refuse the bind
        with open(self.work / "stderr.log", "wb") as log:
            # SIGTERM when the sidecar dies: nginx's fast shutdown takes its workers down too (a
            # SIGKILLed master would orphan them, and they keep the ports).
            self.proc = subprocess.Popen(
                tied_to_parent([str(self.install.binary), "-p", str(self.work), "-c", str(self.conf),
                                "-e", str(self.work / "error.log")], signal.SIGTERM),
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
        self._session = aiohttp.ClientSession(
            connector=aiohttp.UnixConnector(path=str(control_socket(self.work))),
            timeout=aiohttp.ClientTimeout(total=2.0),
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise NativeFrontUnavailable(f"nginx exited with {self.proc.returncode} at start: {self._logs()}")
            with contextlib.suppress(aiohttp.ClientError, OSError, asyncio.TimeoutError):
                await self.exchange(None)
                return
            if loop.time() > deadline:
                raise NativeFrontUnavailable(f"nginx did not answer on its control socket in {timeout_s:.0f} s: "
                                             f"{self._logs()}")
            await asyncio.sleep(0.05)

    async def exchange(self, caps: Mapping[LaneKey, int] | None) -> dict[LaneKey, LaneCounts]:
        """Set the slots (None: leave them) and read the lane's counts, in one request."""
        assert self._session is not None
        if caps is None:
            request = self._session.get("http://front/lane")
        else:
            request = self._session.post("http://front/lane", data=caps_body(caps).encode())
        async with request as resp:
            text = await resp.text()
            if resp.status != 200:
                raise aiohttp.ClientError(f"nginx's control socket answered {resp.status}: {text[:200]}")
            return parse_counts(text)

    def reconfigure(self, policy: SidecarPolicy) -> bool:
        """A reloaded policy that changes nginx's part (header names, limits): write it and have the
        master reload (new workers; in-flight requests finish on the old ones). False: unchanged."""
        text = render_config(self.install, self.work, self.addresses, policy)
        if text == self.text or not self.running:
            return False
        tmp = self.conf.with_suffix(".new")
        tmp.write_text(text)
        check = subprocess.run([str(self.install.binary), "-t", "-q", "-p", str(self.work), "-c", str(tmp)],
                               capture_output=True, timeout=10)
        if check.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise BadInput(f"nginx refused the reloaded policy's configuration: {check.stderr.decode()[-500:]}")
        tmp.replace(self.conf)
        self.text = text
        self.proc.send_signal(signal.SIGHUP)
        return True

    async def stop(self) -> None:
        await self._close_session()
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.terminate()  # SIGTERM: nginx's fast shutdown, its workers go too
            for _ in range(100):
                if proc.poll() is not None:
                    break
                await asyncio.sleep(0.05)
        # The group goes too: a master that did not stop in 5 s, or one that died before (a crash, a
        # kill) and left a worker holding the ports. Empty after a clean shutdown.
        self._kill_group()
        if proc is not None:
            proc.wait()
        self.proc = None
        shutil.rmtree(self.work, ignore_errors=True)
