"""The vLLM backend's metrics, published through Triton's `/metrics` with `pb_utils.MetricFamily`.

`UPSTREAM` is what Triton's own vLLM backend (January 2026) reports, names and meanings read from
its documentation: token counters and request histograms, nothing that shows the engine's queue or
KV pool. `GAUGES` is the opt-in set vLLM's own OpenAI server exports. vLLM calls the stat logger
from its output loop; the Triton calls go through a queue to a thread of their own, so a slow
metrics call never holds the engine's loop.
"""

from __future__ import annotations

import queue
import threading

import triton_python_backend_utils as pb_utils

# kinds by name: pb_utils.MetricFamily exists only once the stub has initialised the model, not while
# auto-complete imports this module
COUNTER, GAUGE, HISTOGRAM = "COUNTER", "GAUGE", "HISTOGRAM"

_TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0]
_TPOT_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5]
_REQUEST_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                    120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]

# name -> (kind, description, buckets; "tokens" = 1-2-5 up to max_model_len)
UPSTREAM = {
    "vllm:prompt_tokens_total": (COUNTER, "Number of prefill tokens processed.", None),
    "vllm:generation_tokens_total": (COUNTER, "Number of generation tokens processed.", None),
    "vllm:time_to_first_token_seconds": (HISTOGRAM, "Histogram of time to first token in seconds.", _TTFT_BUCKETS),
    "vllm:time_per_output_token_seconds": (HISTOGRAM, "Histogram of time per output token in seconds.", _TPOT_BUCKETS),
    "vllm:e2e_request_latency_seconds": (HISTOGRAM, "Histogram of end to end request latency in seconds.", _REQUEST_BUCKETS),
    "vllm:request_prompt_tokens": (HISTOGRAM, "Number of prefill tokens processed.", "tokens"),
    "vllm:request_generation_tokens": (HISTOGRAM, "Number of generation tokens processed.", "tokens"),
    "vllm:request_params_n": (HISTOGRAM, "Histogram of the n request parameter.", [1, 2, 5, 10, 20]),
}
GAUGES = {
    "vllm:num_requests_running": (GAUGE, "Number of requests in model execution batches.", None),
    "vllm:num_requests_waiting": (GAUGE, "Number of requests waiting to be processed.", None),
    "vllm:kv_cache_usage_perc": (GAUGE, "KV-cache usage. 1 means 100 percent usage.", None),
    "vllm:num_preemptions_total": (COUNTER, "Cumulative number of preemption from the engine.", None),
}
CACHE_INFO = "vllm:cache_config_info"  # value 1; labels num_gpu_blocks and block_size, as vLLM's server


def token_buckets(max_model_len: int) -> list[float]:
    """1, 2, 5, 10, 20, 50, ... up to max_model_len (vLLM's build_1_2_5_buckets)."""
    out, exponent = [], 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_model_len:
                return out
            out.append(value)
        exponent += 1


class EngineMetrics:
    """The families and their one labelled metric each; the families must outlive the metrics."""

    def __init__(self, labels: dict[str, str], upstream: bool, gauges: bool) -> None:
        self.labels = labels
        self.wanted = {**(UPSTREAM if upstream else {}), **(GAUGES if gauges else {})}
        self.gauges = gauges
        self.families: dict = {}
        self.metrics: dict = {}
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._publish, name="vllm-metrics", daemon=True)
        self._thread.start()

    def engine_started(self, num_blocks: int, block_size: int, max_model_len: int) -> None:
        for name, (kind, description, buckets) in self.wanted.items():
            family = pb_utils.MetricFamily(name=name, description=description, kind=getattr(pb_utils.MetricFamily, kind))
            self.families[name] = family
            if kind == HISTOGRAM:
                bounds = token_buckets(max_model_len) if buckets == "tokens" else buckets
                self.metrics[name] = family.Metric(labels=self.labels, buckets=bounds)
            else:
                self.metrics[name] = family.Metric(labels=self.labels)
        if self.gauges:
            family = pb_utils.MetricFamily(name=CACHE_INFO, description="Information of the LLM engine's KV cache.",
                                     kind=pb_utils.MetricFamily.GAUGE)
            self.families[CACHE_INFO] = family
            info = family.Metric(labels={**self.labels, "num_gpu_blocks": str(num_blocks), "block_size": str(block_size)})
            info.set(1)
            self.metrics[CACHE_INFO] = info

    def put(self, name: str, op: str, value: float) -> None:
        if name in self.metrics:
            self._queue.put((name, op, value))

    def _publish(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            name, op, value = item
            metric = self.metrics.get(name)
            if metric is None:
                continue
            try:
                getattr(metric, op)(value)
            except Exception:  # noqa: BLE001 - a metric call must never take the engine down
                pass

    def record(self, scheduler_stats, iteration_stats) -> None:
        """One engine step's stats (vLLM's SchedulerStats / IterationStats)."""
        if scheduler_stats is not None:
            self.put("vllm:num_requests_running", "set", scheduler_stats.num_running_reqs)
            self.put("vllm:num_requests_waiting", "set", scheduler_stats.num_waiting_reqs)
            self.put("vllm:kv_cache_usage_perc", "set", scheduler_stats.kv_cache_usage)
        if iteration_stats is None:
            return
        if iteration_stats.num_prompt_tokens:
            self.put("vllm:prompt_tokens_total", "increment", iteration_stats.num_prompt_tokens)
        if iteration_stats.num_generation_tokens:
            self.put("vllm:generation_tokens_total", "increment", iteration_stats.num_generation_tokens)
        if iteration_stats.num_preempted_reqs:
            self.put("vllm:num_preemptions_total", "increment", iteration_stats.num_preempted_reqs)
        for value in iteration_stats.time_to_first_tokens_iter:
            self.put("vllm:time_to_first_token_seconds", "observe", value)
        for value in iteration_stats.inter_token_latencies_iter:
            self.put("vllm:time_per_output_token_seconds", "observe", value)
        for n in iteration_stats.n_params_iter:
            self.put("vllm:request_params_n", "observe", n)
        for done in iteration_stats.finished_requests:
            self.put("vllm:e2e_request_latency_seconds", "observe", done.e2e_latency)
            self.put("vllm:request_prompt_tokens", "observe", done.num_prompt_tokens)
            self.put("vllm:request_generation_tokens", "observe", done.num_generation_tokens)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=2.0)
        self.metrics.clear()
        self.families.clear()


def stat_logger_factory(metrics: EngineMetrics):
    """A vLLM per-engine stat-logger factory ((vllm_config, engine_index) -> StatLoggerBase)."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class TritonStatLogger(StatLoggerBase):
        def __init__(self, vllm_config, engine_index: int = 0) -> None:
            self.vllm_config = vllm_config

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0) -> None:
            metrics.record(scheduler_stats, iteration_stats)

        def log_engine_initialized(self) -> None:
            pass

    return TritonStatLogger
