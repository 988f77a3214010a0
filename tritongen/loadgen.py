"""Open-loop load: replay an arrival list against a live Triton and time every request.

Open loop means each request is sent at its scheduled time whether or not earlier ones came back,
as real users do (a closed loop, N clients each waiting for its answer, hides queueing: it slows
down exactly when the server does). The arrival list is the same `Arrivals` the simulator runs,
so a prediction and a measurement see the same requests. What a run returns is
`tritongen.load_result.LoadResult`.

* Classic models: HTTP/REST through tritonclient's asyncio client (one event loop, pooled
  connections), each request a `[rows, ...]` tensor of random features, the class's Triton
  priority on the request.
* Streaming (decoupled) models: one gRPC bidirectional stream per request (tritonclient's asyncio
  gRPC client); time to first token is the first non-empty response, the request ends with the
  final-response flag.

Bounded and self-stopping: at most `max_in_flight` requests are outstanding (one over the bound
is not sent and is recorded as a client drop), each has a deadline, and the run ends at the last
arrival plus `drain_s` whatever is still outstanding (recorded as client timeouts). Connections
and streams are closed before `run_load` returns, on errors and on Ctrl-C too. An endpoint that
does not answer before the clock starts stops the run with one error naming its address.

Per-request records (times relative to the start of the run, seconds): scheduled send, actual
send, response (`done`), first token, status (the simulator's status codes), tokens, and the first
few distinct error messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import math
import secrets
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass

import aiohttp
import numpy as np

from tritongen.core.simulator import OK, OOM, QUEUE_FULL, TIMEOUT
from tritongen.client import TokenReader, aio_stream_infer, infer_inputs, numpy_inputs, sample_input
from tritongen.core.llm_interface import LLMInterface
from tritongen.core.prompts import RUN_STRIDE, TextWords, arrival_prompt
from tritongen.core.plan import TensorView
from tritongen.core.traffic import Arrivals
from tritongen.load_result import LoadResult
from tritongen.shared.reach import GRPC, HTTP, grpc_reason, grpc_unreached, unreachable

CLIENT_ERROR = 7  # anything else: transport errors, client drops, client timeouts


def classify_error(message: str) -> int:
    """The simulator's status for an error message from Triton (or the model)."""
    text = message.lower()
    if "exceeds maximum queue size" in text or "[429]" in text or "resource_exhausted" in text:
        return QUEUE_FULL  # Triton's queue cap, or the sidecar's "try later" (HTTP 429 / gRPC)
    if "request timeout expired" in text:
        return TIMEOUT
    if "out of memory" in text:
        return OOM
    return CLIENT_ERROR


@dataclass(frozen=True)
class LoadTarget:
    """Where a request goes and what it carries."""

    model: str
    streaming: bool = False
    batched: bool = True  # max_batch_size > 0: tensors carry a leading batch dimension
    # classic models: the model's own inputs (its config's `input` list; optional ones are left out),
    # each filled with a plausible value (`client.sample_input`). Without them, one tensor named by
    # the three fields below (the example ranker's, for the test rigs that drive it).
    inputs: tuple[TensorView, ...] = ()
    input_name: str = "FEATURES"
    input_dims: tuple[int, ...] = (32,)
    input_dtype: str = "FP32"
    # Through the policy sidecar: send the class name as this request parameter (e.g. "traffic_class").
    class_parameter: str | None = None
    # Through the policy sidecar, streams: send the class name in this header (HTTP) or metadata key
    # (gRPC), where the sidecar reads it as the stream opens (nginx carries a gRPC stream it decided
    # by its metadata: it cannot read the parameters of the requests inside it).
    class_header: str | None = None
    # An LLM that is not decoupled (streaming False): its interface makes each request LLM-shaped (the
    # arrivals' prompt and budget) instead of random tensors from the config.
    # Streaming models: the LLM interface the model speaks (`llm_interface`, required): it builds
    # every request (stream on, max_tokens where that interface carries it). Prompts are sized in
    # tokens x `bytes_per_token`.
    interface: LLMInterface | None = None
    bytes_per_token: float = 1.0
    # LLMs: the tokens a salted prompt holds beyond its size (the profile's engine section measures
    # them, `salt_surplus_tokens`), taken off each prompt's filler so it holds the tokens the arrivals say.
    salt_surplus_tokens: int = 0
    # LLMs: the words shared texts are made of (`core.prompts.TextWords`) in the engine's tokens (the
    # profile's `text_words`), so a shared prefix holds the tokens the arrivals say; None: sized by
    # `bytes_per_token`.
    text_words: TextWords | None = None
    # Streaming models: "grpc" (bidirectional stream per request) or "http" (POST
    # /v2/models/M/generate_stream, server-sent events).
    protocol: str = "grpc"

    def prompt(self, arrivals: Arrivals, i: int, salt0: int) -> str:
        """Request i's text in run `salt0`: its own, or sharing what the arrivals say it shares
        (core.prompts), sized by what the profile measured; for a model of token ids, one character
        per token (the interface sends one id per character)."""
        bpt = self.interface.sizing_bytes_per_token(self.bytes_per_token) if self.interface else self.bytes_per_token
        return arrival_prompt(arrivals, i, bpt, salt0, self.salt_surplus_tokens, self.text_words)


# ---------------------------------------------------------------------------------------------


def _features(target: LoadTarget, rows: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """One request's tensors: the model's own inputs, or the single tensor the legacy fields name."""
    batch = rows if target.batched else None
    if target.inputs:
        return {t.name: sample_input(t, batch, rng, "hello", 8) for t in target.inputs if not t.optional}
    shape = ([rows] if target.batched else []) + list(target.input_dims)
    dtype = {"FP32": np.float32, "FP16": np.float16, "FP64": np.float64, "INT32": np.int32, "INT64": np.int64}[target.input_dtype]
    return {target.input_name: rng.standard_normal(shape).astype(dtype)}


class _Runner:
    def __init__(
        self,
        http_url: str | None,
        grpc_url: str | None,
        arrivals: Arrivals,
        route: Callable[[int], LoadTarget | None],
        max_in_flight: int,
        request_timeout_s: float,
        drain_s: float,
        seed: int,
        prewarm: int = 32,
        stop: threading.Event | None = None,
    ) -> None:
        self.prewarm = prewarm
        self.stop = stop
        self.offered = len(arrivals)  # how many were sent before `stop`, or all
        self.http_url = http_url
        self.grpc_url = grpc_url
        self.arr = arrivals
        self.route = route
        self.max_in_flight = max_in_flight
        self.request_timeout_s = request_timeout_s
        self.drain_s = drain_s
        n = len(arrivals)
        self.send_t = np.full(n, np.nan)
        self.done_t = np.full(n, np.nan)
        self.first_t = np.full(n, np.nan)
        self.status = np.zeros(n, dtype=np.int64)
        self.tokens = np.zeros(n, dtype=np.int64)
        self.errors: list[str] = []
        self.messages: list[str | None] = [None] * n
        self.in_flight = 0
        self.rng = np.random.default_rng(seed)
        # Each LLM request's prompt starts uniquely (core.prompts.salted), from a random base so
        # that a second run against the same server meets no prompt of the first in a prefix cache;
        # prompts the traffic says share a prefix or a conversation share it within the run.
        self.salt0 = secrets.randbelow(1000) * RUN_STRIDE
        self._tensor_cache: dict[tuple[str, int], np.ndarray] = {}
        self.t0 = 0.0
        self.sse: aiohttp.ClientSession | None = None  # for HTTP generate_stream targets
        self.sse_base = ""
        self.sse_wanted = False

    def _prompt(self, i: int, target: LoadTarget) -> str:
        return target.prompt(self.arr, i, self.salt0)

    def _error(self, i: int, message: str, now: float) -> None:
        self.status[i] = classify_error(message)
        self.done_t[i] = now
        folded = " ".join(message.split())
        self.messages[i] = folded[:300]
        short = folded[:200]
        if len(self.errors) < 5 and short not in self.errors:
            self.errors.append(short)

    def _now(self) -> float:
        return time.perf_counter() - self.t0

    def _class_headers(self, i: int, target: LoadTarget) -> dict[str, str]:
        if target.class_header is None:
            return {}
        return {target.class_header: self.arr.class_names[int(self.arr.cls[i])]}

    def _class_parameters(self, i: int, target: LoadTarget) -> dict[str, str] | None:
        if target.class_parameter is None:
            return None
        return {target.class_parameter: self.arr.class_names[int(self.arr.cls[i])]}

    async def _classic(self, i: int, target: LoadTarget, http) -> None:
        import tritonclient.http.aio as aioclient

        priority = int(self.arr.class_priority[int(self.arr.cls[i])])
        parameters = self._class_parameters(i, target)
        if target.interface is not None:
            # an LLM that is not decoupled: its prompt and budget as the interface carries them, one response
            budget = int(self.arr.output[i])
            tensors = infer_inputs(aioclient, numpy_inputs(target.interface.request(self._prompt(i, target), budget,
                                                                                    stream=False)))
            parameters = {**target.interface.request_parameters(budget), **(parameters or {})} or None
        else:
            rows = int(self.arr.rows[i])
            key = (target.model, rows)
            data = self._tensor_cache.get(key)
            if data is None:
                data = _features(target, rows, self.rng)
                self._tensor_cache[key] = data
            tensors = infer_inputs(aioclient, data)
        self.send_t[i] = self._now()
        try:
            await asyncio.wait_for(
                http.infer(target.model, tensors, priority=priority, parameters=parameters), self.request_timeout_s
            )
        except asyncio.TimeoutError:
            self._error(i, f"client timeout after {self.request_timeout_s:.0f} s", self._now())
            return
        except Exception as err:  # tritonclient raises InferenceServerException for 4xx/5xx
            self._error(i, str(err), self._now())
            return
        self.done_t[i] = self._now()
        self.status[i] = OK

    async def _stream(self, i: int, target: LoadTarget, grpc) -> None:
        import tritonclient.grpc.aio as grpcaio

        assert target.interface is not None  # run_load refuses streaming targets without one
        text_value = self._prompt(i, target)
        tensors = target.interface.request(text_value, int(self.arr.output[i]), stream=True)
        inputs = infer_inputs(grpcaio, numpy_inputs(tensors))
        reader = TokenReader.of(target.interface)
        priority = int(self.arr.class_priority[int(self.arr.cls[i])])
        finished = asyncio.Event()

        request = {"model_name": target.model, "inputs": inputs, "priority": priority}
        parameters = {**target.interface.request_parameters(int(self.arr.output[i])), **(self._class_parameters(i, target) or {})}
        if parameters:
            request["parameters"] = parameters

        async def requests():
            yield request
            await finished.wait()  # keep our side open until the last response

        self.send_t[i] = self._now()
        stream = aio_stream_infer(grpc, requests(), tuple(self._class_headers(i, target).items()))
        try:
            async with asyncio.timeout(self.request_timeout_s) if hasattr(asyncio, "timeout") else _null():
                async for result, error in stream:
                    now = self._now()
                    if error is not None:
                        self._error(i, str(error), now)
                        return
                    tokens = reader.tokens(result)
                    if tokens:
                        if math.isnan(self.first_t[i]):
                            self.first_t[i] = now
                        self.tokens[i] += tokens
                    final = result.get_response().parameters.get("triton_final_response")
                    if final is not None and final.bool_param:
                        self.done_t[i] = now
                        self.status[i] = OK
                        return
            self._error(i, "stream ended without a final response", self._now())
        except (asyncio.TimeoutError, TimeoutError):
            self._error(i, f"client timeout after {self.request_timeout_s:.0f} s", self._now())
        except Exception as err:
            self._error(i, str(err), self._now())
        finally:
            finished.set()
            try:
                stream.cancel()
            except Exception:
                pass

    async def _sse(self, i: int, target: LoadTarget) -> None:
        """One request over HTTP generate_stream: each server-sent event is one response."""
        assert target.interface is not None and self.sse is not None
        body = target.interface.generate_body(
            self._prompt(i, target), int(self.arr.output[i]), stream=True
        )
        parameters = self._class_parameters(i, target)
        if parameters:
            body["parameters"] = {**body.get("parameters", {}), **parameters}
        reader = TokenReader.of(target.interface)
        self.send_t[i] = self._now()
        try:
            async with asyncio.timeout(self.request_timeout_s):
                async with self.sse.post(f"{self.sse_base}/v2/models/{target.model}/generate_stream",
                                         data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json",
                                                  **self._class_headers(i, target)}) as response:
                    if response.status != 200:
                        text = (await response.read()).decode("utf-8", "replace")
                        self._error(i, f"[{response.status}] {text}", self._now())
                        return
                    async for raw in response.content:  # one line at a time
                        if not raw.startswith(b"data:"):
                            continue
                        line = raw.decode("utf-8", "replace")
                        now = self._now()
                        event = json.loads(line[5:])
                        if "error" in event:
                            self._error(i, str(event["error"]), now)
                            return
                        tokens = reader.event_tokens(event)
                        if tokens:
                            if math.isnan(self.first_t[i]):
                                self.first_t[i] = now
                            self.tokens[i] += tokens
            self.done_t[i] = self._now()
            self.status[i] = OK
        except (asyncio.TimeoutError, TimeoutError):
            self._error(i, f"client timeout after {self.request_timeout_s:.0f} s", self._now())
        except Exception as err:  # transport errors, a broken event
            self._error(i, f"{type(err).__name__}: {err}", self._now())

    async def _one(self, i: int, target: LoadTarget, http, grpc) -> None:
        self.in_flight += 1
        try:
            if target.streaming and target.protocol == "http":
                await self._sse(i, target)
            elif target.streaming:
                await self._stream(i, target, grpc)
            else:
                await self._classic(i, target, http)
        finally:
            self.in_flight -= 1

    async def run(self) -> None:
        http = grpc = None
        tasks: set[asyncio.Task] = set()
        try:
            if self.http_url:
                import tritonclient.http.aio as aioclient

                http = aioclient.InferenceServerClient(self.http_url, conn_limit=max(16, self.max_in_flight))
                # Open the pooled connections before the clock starts: a TCP connect in the middle
                # of a burst would show up as server latency.
                await _reached(HTTP, f"http://{self.http_url}", *(http.is_server_live() for _ in range(self.prewarm)))
            if self.grpc_url:
                import tritonclient.grpc.aio as grpcaio

                grpc = grpcaio.InferenceServerClient(self.grpc_url)
                await _reached(GRPC, self.grpc_url, grpc.is_server_live(client_timeout=self.request_timeout_s))
            if self.http_url and self.sse_wanted:
                # aiohttp, not httpx: httpx's per-request CPU could not keep up with a few hundred
                # streams a second on this host (its own clock lag became the measured TTFT)
                self.sse_base = f"http://{self.http_url}"
                self.sse = aiohttp.ClientSession(
                    connector=aiohttp.TCPConnector(limit=max(16, self.max_in_flight)),
                    timeout=aiohttp.ClientTimeout(total=None), auto_decompress=False,
                )
            times = self.arr.t
            self.t0 = time.perf_counter() - float(times[0]) + 0.05 if len(times) else time.perf_counter()
            for i in range(len(times)):
                delay = float(times[i]) - self._now()
                if delay > 0.0005:
                    await asyncio.sleep(delay)
                if self.stop is not None and self.stop.is_set():
                    self.offered = i
                    break
                target = self.route(i)
                if target is None:
                    self._error(i, "no model for this request", self._now())
                    continue
                if self.in_flight >= self.max_in_flight:
                    self._error(i, f"client drop: {self.max_in_flight} requests already in flight", self._now())
                    continue
                task = asyncio.get_running_loop().create_task(self._one(i, target, http, grpc))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            if tasks:
                done, pending = await asyncio.wait(set(tasks), timeout=self.drain_s)
                for task in pending:
                    task.cancel()
                if pending:
                    await asyncio.gather(*pending, return_exceptions=True)
            for i in np.nonzero(self.status == 0)[0]:
                self._error(int(i), f"client: no answer {self.drain_s:.0f} s after the last arrival", self._now())
        finally:
            for task in list(tasks):
                task.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
            if http is not None:
                await http.close()
            if grpc is not None:
                await grpc.close()
            if self.sse is not None:
                await self.sse.close()


async def _reached(what: str, address: str, *calls: Awaitable[object]) -> None:
    """Await the calls that open an endpoint's connections; one that cannot connect stops the run
    before its clock starts, naming the address (not one transport error per request)."""
    from tritonclient.utils import InferenceServerException

    try:
        await asyncio.gather(*calls)
    except (OSError, asyncio.TimeoutError, aiohttp.ClientError) as err:
        raise unreachable(what, address, None, f"{type(err).__name__}: {err}") from None
    except InferenceServerException as err:
        if grpc_unreached(err):  # any other error is an answer: the requests will say what it is
            raise unreachable(what, address, None, grpc_reason(err)) from None


class _null:
    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        return False


@contextlib.contextmanager
def no_gc_pauses() -> Iterator[None]:
    """Keep Python's cyclic garbage collector out of a timed run.

    An open-loop generator must send on time. On the embedded server a full (generation 2)
    collection in the client took 45-60 ms in about one run in four at 300 req/s: every request
    scheduled meanwhile went out late, the lateness counted as latency, and the run's P99 rose by
    a third or more (Triton's trace showed the arrivals stop, then a burst). Reference counting still
    frees almost everything; the cycles wait until the run ends.
    """
    was_enabled = gc.isenabled()
    gc.collect()
    gc.freeze()  # what exists now is never scanned again during the run
    gc.disable()
    try:
        yield
    finally:
        gc.unfreeze()
        if was_enabled:
            gc.enable()


def run_load(
    arrivals: Arrivals,
    targets: Mapping[str, LoadTarget] | Callable[[int], LoadTarget | None],
    http_url: str | None = None,
    grpc_url: str | None = None,
    max_in_flight: int = 1024,
    request_timeout_s: float = 60.0,
    drain_s: float = 30.0,
    seed: int = 0,
    prewarm_connections: int = 32,
    stop: threading.Event | None = None,
) -> LoadResult:
    """Send `arrivals` open-loop and wait for the answers; blocks until done (bounded).

    `targets`: class name -> target, or a function of the request index (lanes route by prompt).
    `stop`: once set, no more arrivals are sent (those in flight are drained) and the result holds
    only the ones sent: a load that must last exactly as long as something else runs (a doctor
    window on a slow host) without padding its schedule with guessed seconds.
    """
    if callable(targets):
        route = targets
    else:
        names = arrivals.class_names
        by_class = [targets.get(name) for name in names]
        missing = [n for n, t in zip(names, by_class) if t is None]
        if missing:
            raise ValueError(f"no load target for classes {missing}")

        def route(i: int) -> LoadTarget | None:
            return by_class[int(arrivals.cls[i])]

    known = list(targets.values()) if not callable(targets) else []
    if any(t.streaming and t.protocol != "http" for t in known) and not grpc_url:
        raise ValueError("streaming targets need a gRPC url")
    if any(t.streaming and t.interface is None for t in known):
        raise ValueError("streaming targets need the model's LLM interface (LoadTarget.interface)")
    runner = _Runner(http_url, grpc_url, arrivals, route, max_in_flight, request_timeout_s, drain_s, seed, prewarm_connections, stop)
    runner.sse_wanted = callable(targets) or any(t.streaming and t.protocol == "http" for t in known)
    start = time.perf_counter()
    with no_gc_pauses():
        asyncio.run(runner.run())
    sent = slice(0, runner.offered)
    return LoadResult(
        scheduled_t=arrivals.t[sent].copy(),
        send_t=runner.send_t[sent],
        done_t=runner.done_t[sent],
        first_t=runner.first_t[sent],
        status=runner.status[sent],
        tokens=runner.tokens[sent],
        cls=arrivals.cls[sent].copy(),
        class_names=list(arrivals.class_names),
        warmup_s=arrivals.warmup_s,
        errors=runner.errors,
        wall_s=time.perf_counter() - start,
        clock_zero=runner.t0,
        messages=runner.messages[sent],
    )
