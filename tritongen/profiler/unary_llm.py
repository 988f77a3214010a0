"""Measure an LLM that is not decoupled: one response holds the whole completion.

Such a model (Hugging Face `generate()` behind a Python backend, the simplest way users serve an
LLM) is scheduled by Triton's dynamic batcher like any classic model, and the classic profile
measures that; what it cannot see is what makes it an LLM:
  - whether the model reads the token budget where tritongen sends it (a tensor, a JSON tensor or
    the request's parameters): a budget of N must take longer than a budget of 1;
  - how many requests of a given size one batch may hold before the engine runs out of memory. A
    static batch holds every request's KV until its longest is done, and an engine that allocates
    as it goes fails the whole batch, so `max_batch_size` must come from this, not from a guess:
    batches of requests sent together (doubling, then bisecting) up to the served max_batch_size,
    until one gets an out-of-memory answer.
Its time to first token is its end-to-end time: the first token reaches the client with the last.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext

import numpy as np

from tritongen.client import RequestInputs, infer_inputs, request_parameters_of
from tritongen.core.engine_inference import bisect_fit, double_until_fail
from tritongen.core.engine_metrics import is_out_of_memory
from tritongen.core.llm_interface import LLMInterface
from tritongen.core.profile_types import MeasurementGap, UnaryLLMMeasurement
from tritongen.profiler.engine import stream_inputs
from tritongen.profiler.load import ModelFailed, unique_prompt

BUDGET_REPEATS = 3  # single requests per budget; the median is read
HONOURED_GROWTH = 0.25  # a budget of N must take this much longer than a budget of 1 (and 0.5 ms) to count as read


def unary_inputs(interface: LLMInterface, prompt_tokens: int, max_tokens: int, bytes_per_token: float,
                 rows: int | None = None) -> RequestInputs:
    """One request's arrays (stream off: the model answers once), `rows` copies along the batch
    dimension where the model has one."""
    one = stream_inputs(interface, prompt_tokens, max_tokens, bytes_per_token)
    arrays = {name: (np.repeat(value, rows, axis=0) if rows and interface.batched else value) for name, value in one.items()}
    if interface.stream_input is not None:
        arrays[interface.stream_input] = np.zeros_like(arrays[interface.stream_input])
    return RequestInputs(arrays, one.parameters)


class UnaryLLMProfiler:
    """Budget check and static-batch probe of one model, over HTTP (`http_url`)."""

    def __init__(self, http_url: str, model: str, interface: LLMInterface, max_batch_size: int, prompt_tokens: int,
                 output_tokens: int, bytes_per_token: float, update: Callable[[str], None]) -> None:
        self.http_url = http_url
        self.model = model
        self.interface = interface
        self.max_batch_size = max_batch_size
        self.prompt_tokens = prompt_tokens
        self.output_tokens = max(2, output_tokens)
        self.bytes_per_token = bytes_per_token
        self.update = update
        self.gaps: list[MeasurementGap] = []
        # Where the profile may reload the model (--repo, --allow-reload): a context in which the
        # served config's batcher waits long enough for a burst to meet in one batch.
        self.batch_window: Callable[[], AbstractContextManager] = nullcontext

    # -- requests ----------------------------------------------------------------------------

    def _send(self, inputs: Mapping[str, np.ndarray], gate: threading.Barrier | None = None) -> tuple[float, str | None]:
        """(seconds, the model's error verbatim or None) of one request on a connection of its own;
        with `gate`, the connection is opened first and the request waits for the others' at the gate.
        Its prompt is salted as every load's is (profiler.load.unique_prompt): a cache cannot serve
        it, and it holds the words a load's prompt of its size holds (an unsalted one held fewer, so
        batches this probe sized ran out of memory under the load generator's prompts)."""
        import tritonclient.http as httpclient

        inputs = unique_prompt(inputs, self.interface.text_input)

        client = httpclient.InferenceServerClient(self.http_url, connection_timeout=60.0, network_timeout=60.0)
        try:
            if gate is not None:
                try:
                    client.is_server_live()  # opens the connection, so the requests leave together
                    gate.wait(30.0)
                except Exception:  # noqa: BLE001 - a broken gate or a failed check: send all the same
                    pass
            start = time.perf_counter()
            try:
                client.infer(self.model, infer_inputs(httpclient, inputs), parameters=request_parameters_of(inputs))
            except Exception as err:  # noqa: BLE001 - the model's own answer, kept verbatim
                said = err.message() if hasattr(err, "message") else str(err)
                return time.perf_counter() - start, str(said)
            return time.perf_counter() - start, None
        finally:
            client.close()

    def _batches_run(self) -> dict[int, int]:
        """Executions per batch size so far (Triton's batch_stats); empty where it cannot be read."""
        import tritonclient.http as httpclient

        client = httpclient.InferenceServerClient(self.http_url)
        try:
            stats = (client.get_inference_statistics(self.model).get("model_stats") or [{}])[0]
        except Exception:  # noqa: BLE001 - statistics are optional: the probe then trusts what it sent
            return {}
        finally:
            client.close()
        return {int(b["batch_size"]): int((b.get("compute_infer") or {}).get("count", 0)) for b in stats.get("batch_stats") or []}

    def _together(self, n: int, inputs: Mapping[str, np.ndarray]) -> list[str | None]:
        """`n` requests released at once (so Triton's batcher may put them in one batch); their errors."""
        results: list[str | None] = [None] * n
        gate = threading.Barrier(n + 1)

        def one(i: int) -> None:
            results[i] = self._send(inputs, gate)[1]

        threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
        for t in threads:
            t.start()
        try:
            gate.wait(30.0)
        except threading.BrokenBarrierError:
            pass
        for t in threads:
            t.join(120.0)
        return results

    # -- the two measurements ----------------------------------------------------------------

    def _budget(self) -> tuple[list[tuple[int, float]], bool | None, float | None]:
        latencies: list[tuple[int, float]] = []
        for budget in (1, self.output_tokens):
            self.update(f"end-to-end time at a budget of {budget} token(s)")
            inputs = unary_inputs(self.interface, self.prompt_tokens, budget, self.bytes_per_token, rows=1)
            self._send(inputs)  # warms the path
            runs = [self._send(inputs) for _ in range(BUDGET_REPEATS)]
            errors = [e for _, e in runs if e is not None]
            if errors:
                raise ModelFailed(f"model {self.model!r} failed a single request (budget {budget}): {errors[0]}")
            latencies.append((budget, round(statistics.median(s for s, _ in runs) * 1000.0, 3)))
        (b1, t1), (bn, tn) = latencies
        honoured = tn - t1 > max(HONOURED_GROWTH * t1, 0.5)
        slope = (tn - t1) / (bn - b1) if honoured else None
        if not honoured:
            self.gaps.append(MeasurementGap(
                measurement="token budget",
                unseen=f"a budget of {bn} tokens took {tn:.1f} ms against {t1:.1f} ms for 1: the model may not read "
                       f"the budget where tritongen sends it ({self.interface.describe()})",
                inferred="the load levels ran at the model's own default budget; say where the budget goes in the "
                         "spec's inputs if the config does not show it",
            ))
        return latencies, honoured, slope

    def _batches(self) -> tuple[list[tuple[int, bool]], int | None, int | None, str | None]:
        ceiling = max(1, self.max_batch_size)
        inputs = unary_inputs(self.interface, self.prompt_tokens, self.output_tokens, self.bytes_per_token, rows=1)
        tried: dict[int, bool] = {}
        sample: list[str] = []

        short: list[int] = []  # batch sizes the batcher did not form although the requests all ran

        def fits(n: int) -> bool:
            self.update(f"static batch probe: {n} request(s) together")
            before = self._batches_run()
            errors = [e for e in self._together(n, inputs) if e is not None]
            after = self._batches_run()
            formed = max((size for size, count in after.items() if count > before.get(size, 0)), default=None)
            oom = [e for e in errors if is_out_of_memory(e)]
            other = [e for e in errors if not is_out_of_memory(e)]
            if other and not oom:
                raise ModelFailed(f"model {self.model!r} failed {len(other)} of {n} requests sent together: {other[0]}")
            if oom and not sample:
                sample.append(oom[0])
            if not oom and formed is not None and formed < n:
                # the requests did not meet in one batch (a busy host staggers them): only the batch
                # that formed is known to fit, and a larger one was not tried
                tried[formed] = True
                short.append(n)
                return False
            tried[n] = not oom
            return not oom

        fit, stopped = double_until_fail(fits, ceiling)
        fail = stopped if stopped is not None and stopped not in short else None
        if short and fail is None:
            fit = max([fit, *(size for size, ok in tried.items() if ok)])
            self.gaps.append(MeasurementGap(
                measurement="static batch capacity",
                unseen=f"{short[0]} requests sent together did not meet in one batch (Triton formed at most {fit}): "
                       "larger batches could not be driven from here",
                inferred=f"a batch of {fit} is known to fit; the load levels stop at the first out-of-memory answer "
                         "(profile with --repo, or --allow-reload, to probe on a batcher that waits for the burst)",
            ))
            return sorted(tried.items()), (fit or None), None, None
        if fit and fail:
            fit, fail = bisect_fit(fits, fit, fail)
        return sorted(tried.items()), (fit or None), fail, (sample[0] if sample else None)

    def measure(self) -> UnaryLLMMeasurement:
        latencies, honoured, slope = self._budget()
        if self.max_batch_size > 0:
            with self.batch_window():
                fits, fit, fail, sample = self._batches()
        else:
            fits, fit, fail, sample = [], None, None, None
            self.gaps.append(MeasurementGap(
                measurement="static batch capacity",
                unseen="max_batch_size is 0: Triton hands the model one request per execution, so no batch was probed",
                inferred="nothing: one request's memory is all a run holds",
            ))
        per_request = self.prompt_tokens + self.output_tokens
        if self.max_batch_size > 0 and fail is None and not any(g.measurement == "static batch capacity" for g in self.gaps):
            self.gaps.append(MeasurementGap(
                measurement="static batch capacity",
                unseen=f"no batch up to the served max_batch_size {self.max_batch_size} ran out of memory at "
                       f"{self.prompt_tokens} + {self.output_tokens} tokens per request",
                inferred=f"the served max_batch_size holds requests of this size ({fit} x {per_request} tokens is a "
                         "lower bound on the KV the engine holds); longer requests may not fit",
            ))
        return UnaryLLMMeasurement(
            interface=self.interface.describe(),
            interface_kind=self.interface.kind,
            budget_honoured=honoured,
            latency_ms_by_budget=latencies,
            ms_per_output_token=None if slope is None else round(slope, 4),
            probe_prompt_tokens=self.prompt_tokens,
            probe_max_tokens=self.output_tokens,
            batch_fits=fits,
            largest_batch_that_fits=fit,
            smallest_batch_that_fails=fail,
            kv_capacity_tokens=fit * per_request if fit else None,
            failure_sample=sample,
        )
