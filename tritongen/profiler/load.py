"""Load drivers: closed-loop clients that keep N requests in flight and time each one.

This module holds what the drivers share (records, windows, when a window is failing) and the
streaming driver:

* `ClassicLoad` (`tritongen.profiler.classic_load`): N concurrent single-row HTTP requests.
* `StreamLoad`: N concurrent gRPC streams (one client and one stream per worker thread), each
  response timestamped on arrival: time to first token and the gaps between tokens.

A level runs continuously; the caller's loop cuts it into windows by completion time and decides
when to stop (see `profile_math.level_done`). Both drivers stop their workers on request and on
Ctrl-C, cancel what is in flight, and close their connections, so a server never waits on them.
"""

from __future__ import annotations

import itertools
import queue
import secrets
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from tritongen.client import RequestInputs, TokenReader, infer_inputs, request_parameters_of
from tritongen.core.llm_token_ids import salted_ids
from tritongen.core.prompts import salted
from tritongen.errors import RunFailed
from tritongen.shared.reach import stream_cause


class ModelFailed(RunFailed):
    """The model answered most requests of a window with errors."""


@dataclass(frozen=True)
class RequestRecord:
    end: float  # perf_counter at completion
    latency_s: float
    error: str | None = None


@dataclass(frozen=True)
class Window:
    index: int
    start: float
    duration_s: float
    ok: int
    errors: int
    rate: float  # successes (or tokens) per second


WindowCallback = Callable[[Window], None]


def shorten(message: str, limit: int = 300) -> str:
    """One line of at most `limit` characters, for windows and tables."""
    message = " ".join(str(message).split())
    return message if len(message) <= limit else message[: limit - 3] + "..."


def failing(window_ok: int, window_errors: int, max_error_fraction: float = 0.5) -> bool:
    """A window where errors dominate: the model is failing, not just slow."""
    total = window_ok + window_errors
    return window_errors >= 2 and window_errors > max_error_fraction * total


QUEUE_REJECTIONS = ("Request timeout expired", "Exceeds maximum queue size")


def queue_rejected(error: str | None) -> bool:
    """The served config's queue policy turned the request away (its REJECT timeout or its
    max_queue_size): the request never reached the model, so it is the config's finding, never the
    model's failure. Triton 2.51 also holds the odd batch ~500 ms in a batcher with queue policies
    (docs/server-behaviour.md), which a shorter REJECT timeout turns into this answer."""
    return error is not None and any(s in error for s in QUEUE_REJECTIONS)


def model_errors(errors: Sequence[str | None]) -> list[str]:
    """The failures that are the model's (or the transport's): every error but queue rejections."""
    return [e for e in errors if e is not None and not queue_rejected(e)]


# ---------------------------------------------------------------------------------------------
# Streaming models: gRPC streams, threads


@dataclass
class StreamRecord:
    start: float
    token_times: list[float] = field(default_factory=list)
    end: float | None = None
    error: str | None = None  # shortened to one line of at most 300 characters, for windows and tables
    error_text: str | None = None  # the server's error as it came, whole (`first_error` reports it)

    @property
    def ttft_s(self) -> float | None:
        return self.token_times[0] - self.start if self.token_times else None


# Salts for prompts: unique in this process, and from a random start so that a second run on the
# same server does not meet the first run's prompts in the engine's prefix cache.
_SALTS = itertools.count(secrets.randbelow(1000) * 10**6)


def unique_prompt(inputs: Mapping[str, np.ndarray], prompt_input: str | None) -> dict[str, np.ndarray]:
    """`inputs` with the prompt tensor's text, or token ids, made unique (core.prompts.salted,
    llm_token_ids.salted_ids); unchanged when there is no such tensor or it holds neither."""
    out = RequestInputs(inputs, request_parameters_of(inputs))
    value = out.get(prompt_input) if prompt_input else None
    if value is None or value.size == 0:
        return out
    if np.issubdtype(value.dtype, np.integer):
        ids = salted_ids(value.reshape(-1).tolist(), next(_SALTS))
        out[prompt_input] = np.asarray(ids, dtype=value.dtype).reshape(value.shape)  # type: ignore[index]
        return out
    first = value.reshape(-1)[0]
    if not isinstance(first, (bytes, str)):
        return out
    text = first.decode("utf-8", "replace") if isinstance(first, bytes) else first
    fresh = value.copy()
    fresh.reshape(-1)[0] = salted(text, next(_SALTS)).encode()
    out[prompt_input] = fresh  # type: ignore[index]
    return out


class StreamWorker(threading.Thread):
    """One gRPC stream sending requests one after another until stopped (or `limit` are done);
    with `prompt_input`, each request's prompt starts uniquely (`unique_prompt`), so an engine's
    prefix cache cannot hide the prefill it measures. `reader` counts each response's tokens
    (`client.TokenReader`: the model's own count, else its ids, else one a response)."""

    def __init__(
        self,
        url: str,
        model: str,
        inputs: Mapping[str, np.ndarray],
        reader: TokenReader,
        stop: threading.Event,
        limit: int | None = None,
        request_timeout_s: float = 60.0,
        go: threading.Event | None = None,
        pause_s: float = 0.0,
        prompt_input: str | None = None,
    ) -> None:
        super().__init__(name=f"tritongen-stream-{model}", daemon=True)
        self.prompt_input = prompt_input
        self.reader = reader
        self.pause_s = pause_s  # between requests (0: closed loop, back to back)
        self.ready = threading.Event()  # connected, stream open
        self.go = go  # when given, the first request waits for it (streams that start together)
        self.url = url
        self.model = model
        self.inputs = RequestInputs(inputs, request_parameters_of(inputs))
        self.stop = stop
        self.limit = limit
        self.request_timeout_s = request_timeout_s
        self.records: list[StreamRecord] = []
        self.current: StreamRecord | None = None
        self.fatal: str | None = None

    def run(self) -> None:
        import tritonclient.grpc as grpcclient

        responses: queue.Queue = queue.Queue()
        try:
            client = grpcclient.InferenceServerClient(self.url)
        except Exception as err:  # noqa: BLE001 - reported through `fatal`
            self.fatal = shorten(str(err))
            self.ready.set()
            return
        try:
            client.start_stream(callback=lambda result, error: responses.put((time.perf_counter(), result, error)))
            tensors = infer_inputs(grpcclient, self.inputs)
            self.ready.set()
            while self.go is not None and not self.go.wait(0.05):
                if self.stop.is_set():
                    return
            sent = 0
            while not self.stop.is_set() and (self.limit is None or sent < self.limit):
                record = StreamRecord(start=time.perf_counter())
                self.current = record
                request_id = f"{self.name}-{sent}"
                sent += 1
                if self.prompt_input:
                    tensors = infer_inputs(grpcclient, unique_prompt(self.inputs, self.prompt_input))
                client.async_stream_infer(self.model, tensors, request_id=request_id, enable_empty_final_response=True,
                                          parameters=request_parameters_of(self.inputs))
                self._collect(record, responses, request_id)
                self.records.append(record)
                self.current = None
                if record.error is not None:
                    self.stop.wait(0.02)  # a failing model answers fast: do not spin
                elif self.pause_s:
                    self.stop.wait(self.pause_s)
        except Exception as err:  # noqa: BLE001 - a broken stream ends this worker; the level sees it
            last = self.records[-1].error if self.records else None
            self.fatal = shorten(f"the gRPC stream to {self.url} failed: {stream_cause(responses, err, last)}")
        finally:
            self.ready.set()
            try:  # a request still in flight (its timeout passed, the worker failed) is cancelled
                client.stop_stream(cancel_requests=self.current is not None)
            except Exception:  # noqa: BLE001
                pass
            try:
                client.close()
            except Exception:  # noqa: BLE001
                pass

    def _collect(self, record: StreamRecord, responses: queue.Queue, request_id: str) -> None:
        """Until the request's final response. A stop does not cut it short: the request runs to its
        end (or its timeout) and is marked "stopped", so that the stream closes with nothing in
        flight. Cancelling in-flight stream requests made tritonserver 2.51 abort (gRPC core's
        "sync.cc:105 ASSERTION FAILED: prior > 0", SIGABRT, 2026-12-05, a load of a few hundred
        in flight cancelled at once), and a profile must never take down the server it measures."""
        deadline = record.start + self.request_timeout_s
        stopped = False
        while True:
            stopped = stopped or self.stop.is_set()
            try:
                arrived, result, error = responses.get(timeout=0.05)
            except queue.Empty:
                if time.perf_counter() > deadline:
                    record.error = "stopped" if stopped else f"no final response after {self.request_timeout_s:.0f} s"
                    record.end = time.perf_counter()
                    return
                continue
            if error is not None:
                record.error_text = str(error)
                record.error = "stopped" if stopped else shorten(record.error_text)
                record.end = arrived
                return
            response = result.get_response()
            if response.id and response.id != request_id:
                continue  # a late response of a cancelled request
            record.token_times.extend([arrived] * self.reader.tokens(result))
            final = response.parameters.get("triton_final_response")
            if final is not None and final.bool_param:
                record.end = arrived
                if stopped:
                    record.error = "stopped"  # ran past the stop: outside what the caller measures
                return


class StreamLoad:
    """N stream workers in closed loop; `run_level` windows their token rate."""

    def __init__(self, url: str, model: str, inputs: Mapping[str, np.ndarray], output: str | TokenReader,
                 request_timeout_s: float = 60.0, prompt_input: str | None = None) -> None:
        self.url = url
        # how a response's tokens are counted: an output's name alone counts one a response
        self.reader = output if isinstance(output, TokenReader) else TokenReader(output)
        self.model = model
        self.inputs = RequestInputs(inputs, request_parameters_of(inputs))
        self.request_timeout_s = request_timeout_s
        self.prompt_input = prompt_input  # the input holding the prompt: each request's is made unique

    @classmethod
    def of(cls, url: str, model: str, inputs: Mapping[str, np.ndarray], interface, salted: bool = True,
           request_timeout_s: float = 60.0) -> StreamLoad:
        """Streams in `interface`'s terms (an `LLMInterface`): its output, ids and token count, and
        each prompt made unique unless `salted` is false (a probe that repeats one prompt on purpose)."""
        return cls(url, model, inputs, TokenReader.of(interface), request_timeout_s,
                   interface.text_input if salted else None)

    def start(
        self,
        concurrency: int,
        limit: int | None = None,
        inputs: Mapping[str, np.ndarray] | None = None,
        together: bool = False,
        pause_s: float = 0.0,
        each: Sequence[Mapping[str, np.ndarray]] = (),
    ) -> tuple[list[StreamWorker], threading.Event]:
        """Start workers; with `together`, every stream connects first and the first requests go
        out at once (connecting takes a few ms per stream, longer than a small model's request).
        `each`: one worker per entry, sending its arrays (`concurrency` and `inputs` unused)."""
        stop = threading.Event()
        go = threading.Event() if together else None
        arrays = list(each) or [inputs or self.inputs] * concurrency
        workers = [
            StreamWorker(self.url, self.model, a, self.reader, stop, limit, self.request_timeout_s, go, pause_s, self.prompt_input)
            for a in arrays
        ]
        for worker in workers:
            worker.start()
        if go is not None:
            deadline = time.monotonic() + 30.0
            for worker in workers:
                worker.ready.wait(max(0.0, deadline - time.monotonic()))
            go.set()
        return workers, stop

    @staticmethod
    def finish(workers: Sequence[StreamWorker], stop: threading.Event, timeout_s: float = 10.0) -> None:
        stop.set()
        deadline = time.monotonic() + timeout_s
        for worker in workers:
            worker.join(max(0.1, deadline - time.monotonic()))

    def singles(self, count: int, timeout_s: float = 60.0) -> list[StreamRecord]:
        """`count` single requests one after another on one stream, a pause between them, after one
        more that only warms the path (a new stream's first request is slower): their records."""
        workers, stop = self.start(1, limit=count + 1, pause_s=0.06)
        workers[0].join(timeout_s)
        StreamLoad.finish(workers, stop)
        return workers[0].records[1:]

    def run_level(
        self,
        concurrency: int,
        warmup_s: float,
        window_s: float,
        decide: Callable[[list[float]], bool],
        on_window: WindowCallback | None = None,
        min_finished: int = 0,
    ) -> tuple[list[StreamRecord], list[Window], float]:
        """Windows count tokens by arrival time; a window's errors are requests that failed in it.
        The level also runs until `min_finished` streams ended inside the windows: a token gap is
        read off finished streams, and how long one takes is the engine's (a slow engine's streams
        outlast a quick profile's windows). Bounded by the request timeout, which every stream
        meets or fails."""
        workers, stop = self.start(concurrency)
        windows: list[Window] = []
        measure_start = time.perf_counter() + warmup_s
        try:
            while True:
                w_start = measure_start + len(windows) * window_s
                w_end = w_start + window_s
                while time.perf_counter() < w_end:
                    time.sleep(min(0.05, max(0.0, w_end - time.perf_counter())))
                    dead = [w.fatal for w in workers if w.fatal]
                    if dead:
                        raise ModelFailed(f"model {self.model!r}: stream failed at concurrency {concurrency}: {dead[0]}")
                records = [r for w in workers for r in list(w.records)]
                current = [w.current for w in workers if w.current is not None]
                tokens = sum(1 for r in records + current for t in list(r.token_times) if w_start <= t < w_end)
                done = sum(1 for r in records if r.error is None and r.end is not None and w_start <= r.end < w_end)
                ended = [r.error for r in records if r.error is not None and r.end is not None and w_start <= r.end < w_end]
                bad = model_errors(ended)
                window = Window(len(windows), w_start, window_s, done, len(ended), tokens / window_s)
                windows.append(window)
                if on_window is not None:
                    on_window(window)
                if failing(done, len(bad)) or (bad and tokens == 0 and done == 0):
                    raise ModelFailed(
                        f"model {self.model!r} failed {len(bad)} of {done + len(ended)} streams at concurrency "
                        f"{concurrency}: {bad[0]}"
                    )
                finished = sum(w.ok for w in windows)
                if decide([w.rate for w in windows]) and (
                        finished >= min_finished or time.perf_counter() - measure_start > self.request_timeout_s):
                    break
        finally:
            self.finish(workers, stop, self.request_timeout_s)
        return [r for w in workers for r in w.records], windows, measure_start

    def one(self, inputs: Mapping[str, np.ndarray]) -> StreamRecord:
        """A single request on its own stream (the prefill scan)."""
        workers, stop = self.start(1, limit=1, inputs=inputs)
        try:
            while workers[0].is_alive():
                workers[0].join(0.05)
        finally:
            self.finish(workers, stop)
        worker = workers[0]
        if worker.records:
            return worker.records[0]
        return StreamRecord(start=time.perf_counter(), error=worker.fatal or "the stream ended without a response")


def first_error(worker: StreamWorker) -> str | None:
    """The error the first of a worker's finished requests that failed carried, whole as the server
    sent it (a model's own message, its traceback included), or None when none failed.

    A request the worker stopped ("stopped") did not fail: the caller ended it. The worker's
    `fatal` (its stream broke) is not a request's error; callers read it themselves.
    """
    for record in list(worker.records):  # the worker's thread appends as requests finish
        if record.error is not None and record.error != "stopped":
            return record.error_text or record.error
    return None


def distinct_errors(errors: Sequence[str | None], limit: int = 3) -> list[str]:
    """The first few different error messages of some records (a stopped request is no error)."""
    out: list[str] = []
    for e in errors:
        if e and e not in out and e != "stopped":
            out.append(e)
        if len(out) >= limit:
            break
    return out
