"""Wiring and lifecycle: the policy, the admission state and its owner, headroom polling, the
upstream probe, the HTTP and gRPC proxies, the metrics endpoint, and policy reloads (SIGHUP, a
changed file, or the token-protected reload endpoint).
`Sidecar` owns every task, listener and reload of one sidecar process, and the order they start
and stop in; what it is told is sidecar/config.py, running it sidecar/run.py.

    sidecar = Sidecar(SidecarConfig(policy_path=..., upstream="127.0.0.1:8000"))
    await sidecar.start()      # binds, starts background tasks; raises PolicyError on a bad policy
    ...
    await sidecar.stop()       # in-flight requests end, tasks stop, ports close

`sidecar.run.SidecarThread` runs one in a background thread with its own event loop (tests, embedding).
Every I/O source can be injected: the clock, the headroom sources (through `sources`), the
NVML module, the Prometheus registry.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import grpc
from aiohttp import web
from prometheus_client import CollectorRegistry

from sidecar.admission import AdmissionState
from sidecar.config import SidecarConfig, split_address
from sidecar.controller import AdmissionController
from sidecar.decisions import DecisionServer
from sidecar.grpc_proxy import GrpcProxy
from sidecar.headroom import HeadroomChain, HeadroomSource, SourceFailed, SourceInputs, build_sources
from sidecar.http_proxy import Admin, HttpProxy
from sidecar.lane_control import LaneControl
from sidecar.metrics import SidecarMetrics
from sidecar.stream_path import stream_path
from sidecar.nginx_front import (
    FrontAddresses, NativeFrontUnavailable, NginxFront, NginxInstall, decision_socket, find_nginx,
)
from sidecar.tasks import stop_step
from sidecar.admission_prompts import load_counters
from sidecar.upstream import UpstreamHealth
from tritongen.core.sidecar_policy.schema import PolicyError, SidecarPolicy
from tritongen.errors import BadInput
from tritongen.shared.policy_file import load_policy
from tritongen.shared.processes import free_port
from tritongen.shared.reach import METRICS, unreachable_message

log = logging.getLogger("tritongen.sidecar")


# How often the loop-lag timer fires. Every wake of an idle process costs CPU, far more on a
# virtual machine than its Python work: a bare uvloop timer loop cost 2 / 7 / 18 ms of CPU per second
# at 10 / 40 / 200 Hz on the 2-vCPU VM of 2026-12-05 (150-200 µs per wake), and this timer at 40 Hz
# was a third of the sidecar's idle CPU. At 10 Hz it still sees every stall longer than 100 ms, and
# a shorter one of L ms with probability L / 100 ms.
LOOP_LAG_PERIOD_S = 0.1


class _QuietBadRequests(logging.Filter):
    """aiohttp logs a malformed request (a header over the size limit, say) as an error with a
    traceback; it is the client's fault and already answered with a 400: one line is enough."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None and type(exc).__module__.startswith("aiohttp.http_exceptions"):
            record.msg, record.args = "malformed HTTP request refused with 400: %s", (str(exc).splitlines()[0][:200],)
            record.exc_info, record.levelno, record.levelname = None, logging.WARNING, "WARNING"
        return True


logging.getLogger("aiohttp.server").addFilter(_QuietBadRequests())

SourceFactory = Callable[[SidecarPolicy, "Sidecar"], Sequence[HeadroomSource]]


def default_sources(policy: SidecarPolicy, sidecar: Sidecar) -> list[HeadroomSource]:
    """The policy's headroom sources (by name, `sidecar.headroom.HEADROOM_SOURCES`), built on the
    sidecar's NVML module, clock and metrics fetcher."""
    inputs = SourceInputs(policy, nvml=sidecar.nvml, clock=sidecar.clock, fetch_triton_metrics=sidecar.fetch_triton_metrics)
    return build_sources(policy.headroom.sources, inputs)


class Sidecar:
    def __init__(
        self,
        config: SidecarConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        sources: SourceFactory | None = None,
        nvml: Any = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.config = config
        self.clock = clock
        self.nvml = nvml
        self._source_factory = sources or default_sources
        self.metrics = SidecarMetrics(registry)
        self.policy: SidecarPolicy | None = None
        self.state: AdmissionState | None = None
        self.controller: AdmissionController | None = None
        self.chain: HeadroomChain | None = None
        self.health: UpstreamHealth | None = None
        self.http: HttpProxy | None = None
        self.grpc: GrpcProxy | None = None
        self.nginx: NginxFront | None = None
        self.decisions: DecisionServer | None = None  # with the native front: its decision socket
        self.lane: LaneControl | None = None
        self.http_port = self.grpc_port = self.metrics_port = 0
        self.last_reload: dict[str, Any] = {}
        self._runners: list[web.AppRunner] = []
        self._grpc_server: grpc.aio.Server | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._side_session: aiohttp.ClientSession | None = None
        self._policy_stat: tuple[int, int] | None = None
        self._stopped = asyncio.Event()
        self._reported_failures: dict[str, int] = {}
        self._reload_lock = asyncio.Lock()

    # -- lifecycle --------------------------------------------------------------------------------

    async def start(self) -> Sidecar:
        try:
            return await self._start()
        except BaseException:
            await self.stop()
            raise

    async def _start(self) -> Sidecar:
        cfg = self.config
        self.policy = load_policy(cfg.policy_path)
        counters = load_counters(self.policy, Path(cfg.policy_path).parent)
        self._policy_stat = self._stat()
        self.state = AdmissionState(self.policy, self.clock)
        self.state.set_token_counters(counters)
        self.controller = AdmissionController(self.state, self.metrics, self.clock)
        self._side_session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2.0))
        self.chain = HeadroomChain(self._source_factory(self.policy, self), self.clock)
        base = cfg.upstream if "://" in cfg.upstream else f"http://{cfg.upstream}"
        ready_url = base.rstrip("/") + "/v2/health/ready"

        async def probe() -> bool:
            assert self._side_session is not None
            async with self._side_session.get(ready_url, timeout=aiohttp.ClientTimeout(total=1.0)) as resp:
                await resp.read()
                return resp.status == 200

        self.health = UpstreamHealth(probe, interval_s=cfg.health_interval_s)
        self.health.on_change(lambda up: self.metrics.upstream_up.set(1 if up else 0))
        policy = lambda: self._policy()
        admin = Admin(token=cfg.token, status=self.status, reload=self.reload)
        self.http = HttpProxy(cfg.upstream, self.controller, self.health, self.metrics, policy, admin)
        await self.http.start()
        limits = self.policy.limits
        install = self._native_install()
        private = install is not None  # nginx faces clients; the Python listeners take what it hands on
        runner = web.AppRunner(
            self.http.application(), handler_cancellation=True, access_log=None,
            max_line_size=limits.max_header_bytes, max_field_size=limits.max_header_bytes,
        )
        await runner.setup()
        self._runners.append(runner)
        host, port = ("127.0.0.1", 0) if private else split_address(cfg.listen, 9000)
        await web.TCPSite(runner, host, port, reuse_address=True).start()
        self.http_port = _bound_port(runner)

        if cfg.grpc_upstream:
            self.grpc = GrpcProxy(cfg.grpc_upstream, self.controller, self.health, self.metrics, policy, token=cfg.token)
            await self.grpc.start()
            server = grpc.aio.server(options=[
                ("grpc.max_receive_message_length", limits.max_body_bytes),
                ("grpc.max_send_message_length", -1),
                ("grpc.max_metadata_size", limits.max_header_bytes),
            ])
            server.add_generic_rpc_handlers((self.grpc.handler(),))
            host, port = ("127.0.0.1", 0) if private else split_address(cfg.grpc_listen, 9001)
            self.grpc_port = server.add_insecure_port(f"{host}:{port}")
            if not self.grpc_port:
                raise OSError(f"cannot bind the gRPC listener on {host}:{port}")
            await server.start()
            self._grpc_server = server

        if install is not None:
            await self._start_native(install)

        metrics_app = web.Application()
        metrics_app.router.add_get("/metrics", self._metrics_handler)
        mrunner = web.AppRunner(metrics_app, access_log=None)
        await mrunner.setup()
        self._runners.append(mrunner)
        host, port = split_address(cfg.metrics_listen, 9002)
        await web.TCPSite(mrunner, host, port, reuse_address=True).start()
        self.metrics_port = _bound_port(mrunner)

        self.metrics.policy_info.labels(self.policy.digest(), self.policy.deployment).set(1)
        await self.health.check()
        self.metrics.upstream_up.set(1 if self.health.up else 0)
        if not self.health.up:  # Triton may start after its sidecar (one pod): wait for it, say where
            log.warning("Triton's HTTP endpoint at %s (--url) does not answer yet: %s; requests get 503 "
                        "until it does", ready_url, self.health.reason)
        await self._poll_headroom_once()
        if self.lane is not None:
            with contextlib.suppress(Exception):  # the sync task retries; the lane starts closed
                await self.lane.sync()
        self.controller.start()
        self.health.start()
        if self.lane is not None:
            self.lane.start()
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._headroom_loop(), name="sidecar-headroom"))
        self._tasks.append(loop.create_task(self._watch_policy(), name="sidecar-policy-watch"))
        self._tasks.append(loop.create_task(self._watch_loop_lag(), name="sidecar-loop-lag"))
        if cfg.install_signal_handlers and threading.current_thread() is threading.main_thread():
            loop.add_signal_handler(signal.SIGHUP, lambda: loop.create_task(self.reload("SIGHUP")))
        log.info(
            "sidecar %s (policy %s, %s loop, %s front) on http %s:%d%s, metrics :%d, upstream %s%s",
            self.policy.deployment, self.policy.digest(), type(loop).__module__.split(".")[0], self.front_kind,
            split_address(cfg.listen, 9000)[0], self.http_port,
            f", grpc :{self.grpc_port}" if self.grpc_port else "", self.metrics_port, cfg.upstream,
            "" if self.health.up else f" (not ready: {self.health.reason})",
        )
        return self

    async def stop(self) -> None:
        loop = asyncio.get_running_loop()
        if self.config.install_signal_handlers and threading.current_thread() is threading.main_thread():
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(signal.SIGHUP)
        for task in self._tasks:
            task.cancel()

        await stop_step("background tasks", asyncio.gather(*self._tasks, return_exceptions=True))
        self._tasks.clear()
        if self.lane is not None:
            await stop_step("the lane", self.lane.stop())
        if self.nginx is not None:  # clients are cut at the front first (bounded on its own: 5 s, then a kill)
            await self.nginx.stop()
            self.nginx = None
        if self.decisions is not None:  # then what nginx's requests held goes back
            await stop_step("the decision socket", self.decisions.stop())
            self.decisions = None
        if self._grpc_server is not None:
            await stop_step("the gRPC listener", self._grpc_server.stop(grace=1.0))
            self._grpc_server = None
        for runner in self._runners:
            await stop_step("an HTTP listener", runner.cleanup())
        self._runners.clear()
        if self.health is not None:
            await stop_step("the upstream probe", self.health.stop())
        if self.controller is not None:
            await stop_step("admission", self.controller.stop())
        if self.http is not None:
            await stop_step("the HTTP upstream pool", self.http.close())
        if self.grpc is not None:
            await stop_step("the gRPC upstream channel", self.grpc.close())
        if self._side_session is not None:
            await stop_step("the metrics session", self._side_session.close())
        if self.chain is not None:
            for source in self.chain.sources:
                close = getattr(source, "close", None)
                if close is not None:
                    close()
        self._stopped.set()

    def request_stop(self) -> None:
        self._stopped.set()

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    # -- the native front -------------------------------------------------------------------------

    def _native_install(self) -> NginxInstall | None:
        """The nginx to put in front, or None for the Python listeners (config.front)."""
        kind = self.config.front  # one of FRONTS: SidecarConfig checked it
        if kind == "python":
            return None
        install, why = find_nginx()
        if install is None:
            if kind == "native":
                raise NativeFrontUnavailable(f"--front native: {why}")
            log.info("front: python (%s)", why)
        return install

    async def _start_native(self, install: NginxInstall) -> None:
        """nginx on the public ports, handing what the lane does not carry to the private ones."""
        cfg = self.config
        assert self.policy is not None and self.state is not None and self.controller is not None
        assert self.health is not None

        def joined(host: str, port: int) -> str:
            return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"  # nginx writes IPv6 in brackets

        def public(text: str, default: int) -> str:
            host, port = split_address(text, default)
            return joined(host, port or free_port())

        def upstream(text: str) -> str:
            return joined(*split_address(text, 80))

        http_listen = public(cfg.listen, 9000)
        grpc_listen = public(cfg.grpc_listen, 9001) if self.grpc_port else None
        addresses = FrontAddresses(
            http_listen=http_listen, triton_http=upstream(cfg.upstream), sidecar_http=f"127.0.0.1:{self.http_port}",
            grpc_listen=grpc_listen, triton_grpc=upstream(cfg.grpc_upstream) if grpc_listen and cfg.grpc_upstream
            else None, sidecar_grpc=f"127.0.0.1:{self.grpc_port}" if grpc_listen else None,
        )
        self.nginx = NginxFront(install, addresses, self.policy)
        assert self.http is not None
        self.decisions = DecisionServer(decision_socket(self.nginx.work), self.http, self.grpc, self.controller,
                                        self.health)
        await self.decisions.start()  # before nginx takes requests: it asks here about every model stream
        self.nginx.on_restart = lambda: self.decisions.release_all("front_restarted")  # type: ignore[union-attr]
        await self.nginx.start()
        self.http_port = int(http_listen.rsplit(":", 1)[1])
        if grpc_listen:
            self.grpc_port = int(grpc_listen.rsplit(":", 1)[1])
        self.lane = LaneControl(self.nginx, self.state, self.controller.accounting,
                                lambda: bool(self.health and self.health.up), self.controller.dispatch)
        self.controller.on_queued = self.lane.queued
        self.decisions.lane_overflow = self.lane.overflowed
        self.controller.reclaim = self.lane.reclaim

    @property
    def front_kind(self) -> str:
        """Who faces clients: "native" (nginx, sidecar/nginx_front.py) or "python" (the sidecar's own)."""
        return "native" if self.nginx is not None else "python"

    # -- policy -----------------------------------------------------------------------------------

    def _policy(self) -> SidecarPolicy:
        assert self.policy is not None
        return self.policy

    def _stat(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.config.policy_path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size)

    async def reload(self, why: str) -> tuple[bool, str]:
        """Read the policy file again; a policy that does not validate is refused, the old one stays."""
        async with self._reload_lock:
            assert self.state is not None and self.policy is not None
            self._policy_stat = self._stat()
            try:
                new = load_policy(self.config.policy_path)
                counters = load_counters(new, Path(self.config.policy_path).parent)
            except PolicyError as err:
                message = f"policy reload ({why}) refused; keeping policy {self.policy.digest()}: {err}"
                log.error("%s", message)
                self.metrics.reloads.labels("refused").inc()
                self.last_reload = {"ok": False, "why": why, "message": str(err), "at": time.time()}
                return False, message
            old = self.policy
            if new.digest() == old.digest():
                self.last_reload = {"ok": True, "why": why, "message": "unchanged", "at": time.time()}
                return True, f"policy {old.digest()} unchanged"
            if new.limits != old.limits:
                log.warning("policy reload: `limits` (body and header sizes) take effect at the next start")
            self.policy = new
            self.state.apply_policy(new)
            self.state.set_token_counters(counters)
            assert self.controller is not None
            self.controller.dispatch()
            self.controller.wake()
            if self.lane is not None:
                self.lane.policy_changed()
            if self.nginx is not None:
                try:
                    self.nginx.reconfigure(new)
                except BadInput as err:
                    log.error("policy reload: nginx keeps its configuration: %s", err)
            if self.chain is not None:
                self.chain.sources = list(self._source_factory(new, self))
            self.metrics.policy_info.labels(old.digest(), old.deployment).set(0)
            self.metrics.policy_info.labels(new.digest(), new.deployment).set(1)
            self.metrics.reloads.labels("ok").inc()
            message = f"policy reloaded ({why}): {old.digest()} -> {new.digest()}"
            log.warning("%s", message)
            self.last_reload = {"ok": True, "why": why, "message": message, "at": time.time()}
            return True, message

    async def _watch_loop_lag(self, period_s: float = LOOP_LAG_PERIOD_S) -> None:
        """A busy or blocked event loop delays every request before the sidecar can stamp its
        arrival, so its own latency histograms cannot see it; this timer's lateness can."""
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + period_s
            await asyncio.sleep(period_s)
            self.metrics.loop_lag.observe(max(0.0, loop.time() - due))

    async def _watch_policy(self) -> None:
        while True:
            await asyncio.sleep(self.config.watch_interval_s)
            stat = self._stat()
            if stat is not None and stat != self._policy_stat:
                await self.reload("file changed")

    # -- headroom ---------------------------------------------------------------------------------

    async def fetch_triton_metrics(self) -> str:
        assert self._side_session is not None
        url = self.config.metrics_url()
        try:
            async with self._side_session.get(url) as resp:
                if resp.status != 200:
                    raise RuntimeError(f"GET {url} answered {resp.status}")
                return await resp.text()
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as err:
            reason = f"{type(err).__name__}: {err}"
            raise SourceFailed(unreachable_message(METRICS, url, self.config.metrics_how(), reason)) from None

    async def _poll_headroom_once(self) -> None:
        assert self.chain is not None and self.state is not None and self.controller is not None
        snapshot = await self.chain.sample()
        self.state.observe_headroom(snapshot)
        self.controller.dispatch()
        m = self.metrics
        for source in self.chain.sources:
            failed = source.name in snapshot.failures
            m.source_up.labels(source.name).set(0 if failed else 1)
            total = self.chain.failures_total.get(source.name, 0)
            delta = total - self._reported_failures.get(source.name, 0)
            if delta > 0:
                m.source_failures.labels(source.name).inc(delta)
            self._reported_failures[source.name] = total
        now = self.clock()
        m.headroom.clear()
        m.capacity.clear()
        for scope in self.state.scopes():
            reading = self.state.reading(scope, now)
            cap = self.state.capacity(scope, now)
            if reading is None or cap is None:
                continue
            m.capacity.labels(scope, reading.source).set(cap)
            m.headroom.labels(scope, reading.source).set(cap - self.state.reserved_scope(scope))
        for device, util in snapshot.gpu_utilization.items():
            m.gpu_utilization.labels(device).set(util)

    async def _headroom_loop(self) -> None:
        while True:
            await asyncio.sleep(self._policy().headroom.poll_interval_ms / 1000)
            try:
                await self._poll_headroom_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("headroom poll failed")

    # -- status and metrics -----------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        assert self.state is not None and self.policy is not None and self.health is not None
        out = dict(self.state.status())
        out["policy"] = {"digest": self.policy.digest(), "deployment": self.policy.deployment,
                         "path": str(self.config.policy_path)}
        out["last_reload"] = self.last_reload
        out["upstream"] = {"up": self.health.up, "reason": self.health.reason, "http": self.config.upstream,
                           "grpc": self.config.grpc_upstream}
        out["headroom_sources"] = dict(self.chain.state) if self.chain else {}
        out["front"] = {"kind": self.front_kind, "lane": self.lane.status() if self.lane is not None else {},
                        "carried": self.decisions.status() if self.decisions is not None else {},
                        "grpc_streams": stream_path(self.policy, self.nginx is not None).status()}
        return out

    async def _metrics_handler(self, request: web.Request) -> web.Response:
        if self.controller is not None:
            self.controller.publish()
        return web.Response(body=self.metrics.exposition(request.query.getall("name[]", [])),
                            content_type="text/plain", charset="utf-8")


def _bound_port(runner: web.AppRunner) -> int:
    for site in runner.sites:
        server = getattr(site, "_server", None)
        if server is not None and server.sockets:
            return int(server.sockets[0].getsockname()[1])
    raise RuntimeError("the listener is not bound")
