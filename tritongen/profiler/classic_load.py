"""The classic load driver: N concurrent single-row HTTP requests (tritonclient's asyncio client, one
event loop: 32 clients cost a fraction of a core), so Triton's dynamic batcher forms real batches.

It keeps the contract of the load drivers (`tritongen.profiler.load`): a level runs continuously, the
caller's loop cuts it into windows by completion time, and Ctrl-C or a stop request cancels what is
in flight and closes the connections.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager

import numpy as np

from tritongen.client import RequestInputs, request_parameters_of
from tritongen.profiler.load import ModelFailed, RequestRecord, Window, WindowCallback, failing, model_errors, shorten


def _aio_inputs(inputs: Mapping[str, np.ndarray]):
    import tritonclient.http.aio as aioclient
    from tritonclient.utils import np_to_triton_dtype

    out = []
    for name, value in inputs.items():
        dtype = "BYTES" if value.dtype == np.object_ else np_to_triton_dtype(value.dtype)
        tensor = aioclient.InferInput(name, list(value.shape), dtype)
        tensor.set_data_from_numpy(value, binary_data=True)
        out.append(tensor)
    return out


def _quiet_about_interrupts(loop: asyncio.AbstractEventLoop, context: dict) -> None:
    """Drop asyncio's report of a task that ended with Ctrl-C; pass every other report on.

    A SIGINT can land inside a task the load does not own (aiohttp's body writer, seen in CI).
    That task ends with the KeyboardInterrupt as its exception, and when it is collected asyncio
    prints "Task exception was never retrieved" with the whole traceback, after the CLI's clean
    "interrupted" message. The interrupt is already reported; real errors still reach the log.
    A CancelledError is the teardown's own doing (close cancels what is pending), never news.
    """
    if isinstance(context.get("exception"), (KeyboardInterrupt, asyncio.CancelledError)):
        return
    loop.default_exception_handler(context)


@contextmanager
def _sigint_cancels(loop: asyncio.AbstractEventLoop, task: asyncio.Task) -> Iterator[Callable[[], bool]]:
    """While the load runs, Ctrl-C cancels the level task instead of raising inside whatever code
    the signal happens to land in (aiohttp's or tritonclient's tasks, where a KeyboardInterrupt
    once became a failed request and the profile ran to its end); the caller raises
    KeyboardInterrupt once the loop has stopped. Yields whether Ctrl-C came. Only the main thread
    can set a handler, and a handler someone else installed is left alone."""
    came = False

    def on_sigint(signum, frame) -> None:
        nonlocal came
        came = True
        loop.call_soon_threadsafe(task.cancel)

    own = threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    previous = signal.signal(signal.SIGINT, on_sigint) if own else None
    try:
        yield lambda: came
    finally:
        if own:
            signal.signal(signal.SIGINT, previous)


class ClassicLoad:
    """Closed-loop single-request clients on one asyncio loop; use as a context manager."""

    def __init__(
        self,
        url: str,
        model: str,
        inputs: Mapping[str, np.ndarray],
        outputs: Sequence[str],
        request_timeout_s: float = 30.0,
    ) -> None:
        self.url = url
        self.model = model
        self.inputs = RequestInputs(inputs, request_parameters_of(inputs))  # with the budget where it travels in parameters
        self.outputs = list(outputs)
        self.request_timeout_s = request_timeout_s
        self.loop: asyncio.AbstractEventLoop | None = None
        self.client = None
        self._tasks: list[asyncio.Task] = []
        self._level_task: asyncio.Task | None = None
        self._stop = False

    def __enter__(self) -> "ClassicLoad":
        import tritonclient.http.aio as aioclient

        self.loop = asyncio.new_event_loop()
        self.loop.set_exception_handler(_quiet_about_interrupts)

        async def make():
            return aioclient.InferenceServerClient(self.url, conn_limit=256, conn_timeout=self.request_timeout_s)

        self.client = self.loop.run_until_complete(make())
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        loop = self.loop
        if loop is None:
            return
        self._stop = True
        # After a Ctrl-C the level task and its workers are still pending: cancel them and let
        # them unwind on the loop (a coroutine closed without its loop would raise in `finally`).
        tasks = [t for t in [*self._tasks, self._level_task] if t is not None]
        pending = [t for t in tasks if not t.done()]
        for task in pending:
            task.cancel()
        try:
            if pending:
                loop.run_until_complete(asyncio.wait(pending, timeout=5))
            # The task the Ctrl-C landed in (ours or aiohttp's) ended with the KeyboardInterrupt;
            # _quiet_about_interrupts keeps asyncio from printing it when the task is collected.
            if self.client is not None:
                loop.run_until_complete(self.client.close())
        except BaseException:  # noqa: BLE001 - closing on Ctrl-C: best effort, never hide the cause
            pass
        finally:
            loop.close()
            self.loop = None
            self.client = None

    async def _worker(self, records: list[RequestRecord]) -> None:
        import tritonclient.http.aio as aioclient

        tensors = _aio_inputs(self.inputs)
        wanted = [aioclient.InferRequestedOutput(name, binary_data=True) for name in self.outputs]
        while not self._stop:
            start = time.perf_counter()
            error = None
            try:
                await self.client.infer(self.model, tensors, outputs=wanted, timeout=int(self.request_timeout_s * 1e6),
                                        parameters=request_parameters_of(self.inputs))
            except asyncio.CancelledError:
                raise
            except Exception as err:  # server-side errors and lost connections alike: count, go on
                error = shorten(str(err) or type(err).__name__)
            end = time.perf_counter()
            records.append(RequestRecord(end=end, latency_s=end - start, error=error))
            if error is not None:
                await asyncio.sleep(0.01)  # a failing model answers fast: do not spin

    def run_level(
        self,
        concurrency: int,
        warmup_s: float,
        window_s: float,
        decide: Callable[[list[float]], bool],
        on_window: WindowCallback | None = None,
    ) -> tuple[list[RequestRecord], list[Window], float, dict | None]:
        """Run `concurrency` clients; after warm-up, cut windows until `decide(rates)` says stop.

        Returns every record, the windows, where measurement started (perf_counter) and the
        model's statistics at that moment (so the caller can leave the warm-up's executions out).
        Raises ModelFailed when errors dominate a window.
        """
        assert self.loop is not None, "use ClassicLoad as a context manager"
        self._level_task = self.loop.create_task(self._level(concurrency, warmup_s, window_s, decide, on_window))
        with _sigint_cancels(self.loop, self._level_task) as interrupted:
            try:
                result = self.loop.run_until_complete(self._level_task)
            except asyncio.CancelledError:
                if interrupted():
                    raise KeyboardInterrupt from None
                raise
        if interrupted():  # the level ended on its own just as Ctrl-C came
            raise KeyboardInterrupt
        return result

    async def _stats(self) -> dict | None:
        try:
            stats = await self.client.get_inference_statistics(self.model)
        except Exception:  # noqa: BLE001 - the caller falls back to its own snapshot
            return None
        return (stats.get("model_stats") or [None])[0]

    async def _level(self, concurrency, warmup_s, window_s, decide, on_window):
        records: list[RequestRecord] = []
        self._stop = False
        self._tasks = [asyncio.ensure_future(self._worker(records)) for _ in range(concurrency)]
        windows: list[Window] = []
        measure_start = time.perf_counter() + warmup_s
        stats_at_start = None
        try:
            await asyncio.sleep(warmup_s)
            stats_at_start = await self._stats()
            while True:
                w_start = measure_start + len(windows) * window_s
                await asyncio.sleep(max(0.0, w_start + window_s - time.perf_counter()))
                ok = sum(1 for r in records if r.error is None and w_start <= r.end < w_start + window_s)
                ended = [r.error for r in records if r.error is not None and w_start <= r.end < w_start + window_s]
                bad = model_errors(ended)  # a queue rejection is the served config's, counted by the level
                window = Window(len(windows), w_start, window_s, ok, len(ended), ok / window_s)
                windows.append(window)
                if on_window is not None:
                    on_window(window)
                if failing(ok, len(bad)):
                    raise ModelFailed(
                        f"model {self.model!r} failed {len(bad)} of {ok + len(ended)} requests at concurrency "
                        f"{concurrency}: {bad[0]}"
                    )
                if decide([w.rate for w in windows]):
                    break
        finally:
            self._stop = True
            if any(t.cancelled() for t in self._tasks):  # being torn down: do not wait for replies
                for task in self._tasks:
                    task.cancel()
            done, pending = await asyncio.wait(self._tasks, timeout=self.request_timeout_s)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=5)
            self._tasks = []
        return records, windows, measure_start, stats_at_start
