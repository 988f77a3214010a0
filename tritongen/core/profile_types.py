"""The versioned profile a `tritongen profile` run writes, one JSON file per model.

Pure pydantic types, no I/O: `plan`/`tune` and the sidecar read profiles through these models, and
the profiler writes them. `schema_version` changes whenever a field changes meaning; readers reject
versions they do not know instead of guessing.

Units are in the field names: `_ms` milliseconds, `_bytes` bytes, `_mb` MiB, `_per_s` per second.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tritongen.core.prompts import TextWords
from tritongen.core.spec import EngineSection, ModelSpec

SCHEMA_VERSION = 1


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ProfileSettings(_Model):
    """How the run measured; a profile is only comparable with one measured the same way."""

    quick: bool = Field(description="Short windows and fewer levels (tests, smoke runs).")
    concurrency_levels: list[int] = Field(description="Closed-loop clients per load level (classic models).")
    stream_concurrency_levels: list[int] = Field(description="Concurrent streams per level (streaming models).")
    warmup_s: float = Field(description="Seconds of load discarded at the start of each level.")
    window_s: float = Field(description="Length of one measurement window.")
    min_windows: int = Field(description="Windows measured per level at least.")
    max_windows: int = Field(description="Windows per level at most, agreement or not.")
    agreement: float = Field(description="Two consecutive windows agree when throughputs differ by at most this fraction.")
    prompt_tokens: int | None = Field(default=None, description="Streaming: prompt length of the load requests.")
    output_tokens: int | None = Field(default=None, description="Streaming: max_tokens of the load requests.")
    prefill_prompt_lengths: list[int] = Field(default_factory=list, description="Prompt lengths of the prefill scan.")
    prefill_repeats: int = Field(default=0, description="Requests per prompt length in the prefill scan.")
    pad_margin: float = Field(description="Safety pad = prefill peak at the longest context x this margin.")
    kv_probe_mb: float = Field(description="Size of the KV-pool resize probe (0: not run).")
    batch_scan_rows: list[int] = Field(
        default_factory=list, description="Classic: rows per request of the client-side batch scan (one request in flight)."
    )
    scaling_instances: list[int] = Field(
        default_factory=list, description="Classic: instance counts of the scaling levels (loaded through the model load API)."
    )
    seed: int = Field(description="Seed of the random input features.")


class CurvePoint(_Model):
    """Triton's own per-batch-size statistics (`batch_stats`), summed over the whole run."""

    batch_size: int
    count: int = Field(description="Executions of this batch size.")
    compute_infer_ms: float = Field(description="Mean compute_infer time per execution.")
    compute_total_ms: float = Field(description="Mean compute_input + compute_infer + compute_output.")


class CurveFit(_Model):
    """compute_infer_ms(b) = overhead_ms + per_item_ms x b, with a bend at `breakpoint` if piecewise."""

    kind: Literal["linear", "piecewise"]
    overhead_ms: float = Field(description="Fixed cost of one execution (the intercept).")
    per_item_ms: float = Field(description="Cost of each item in the batch (below the breakpoint).")
    breakpoint: float | None = Field(default=None, description="Piecewise: batch size where the slope changes.")
    per_item_ms_after: float | None = Field(default=None, description="Piecewise: per-item cost above the breakpoint.")
    max_rel_error: float = Field(description="Largest |fit - measured| / measured over the points.")
    mean_rel_error: float = Field(description="Mean |fit - measured| / measured over the points.")
    points: int = Field(description="Curve points the fit used.")
    alternative: str | None = Field(default=None, description="The other candidate and its errors, for the record.")

    def predict(self, batch_size: float) -> float:
        y = self.overhead_ms + self.per_item_ms * batch_size
        if self.kind == "piecewise" and self.breakpoint is not None and batch_size > self.breakpoint:
            y += ((self.per_item_ms_after or 0.0) - self.per_item_ms) * (batch_size - self.breakpoint)
        return y


class LoadLevel(_Model):
    """One concurrency level of closed-loop single-row requests, measured client-side."""

    concurrency: int
    requests: int = Field(description="Successful requests in the measured windows.")
    errors: int = Field(description="Requests the model (or the transport) failed in the measured windows.")
    rejected: int = Field(default=0, description="Requests the served config's queue policy turned away (REJECT "
                          "timeout, max_queue_size): the config's finding, never the model's error.")
    duration_s: float = Field(description="Measured time (warm-up excluded).")
    windows: int
    converged: bool = Field(description="The last two windows agreed on throughput.")
    window_throughputs: list[float] = Field(description="Inferences/s of each window.")
    throughput_per_s: float = Field(description="Successful inferences per second over the measured windows.")
    p50_ms: float | None
    p90_ms: float | None
    p99_ms: float | None
    mean_batch_size: float | None = Field(default=None, description="Server side: inferences / executions.")
    error_samples: list[str] = Field(default_factory=list, description="Up to three distinct error messages.")


class Knee(_Model):
    """The first level where p99 grows faster than throughput (log-log slopes between levels)."""

    concurrency: int | None = Field(description="None: latency never outgrew throughput over the levels run.")
    latency_slopes: list[float | None] = Field(description="d log p99 / d log concurrency, per level (first: None).")
    throughput_slopes: list[float | None] = Field(description="d log throughput / d log concurrency, per level.")


class KVMeasurement(_Model):
    """One way of measuring KV bytes per token, next to the analytic figure."""

    source: Literal["rss", "nvml", "metrics", "blocks"]
    bytes_per_token: float
    relative_difference: float | None = Field(description="(measured - analytic) / analytic; None without a spec.")
    detail: str = Field(description="How it was obtained, with the raw numbers.")


class PrefillPoint(_Model):
    """Transient memory of a single request's prefill, over the instance's steady value."""

    prompt_tokens: int
    steady_bytes: int = Field(description="Memory of the model's instances at idle, before the scan.")
    peak_bytes: int = Field(description="Highest memory seen while requests of this length ran.")
    peak_delta_bytes: int = Field(description="peak_bytes - steady_bytes (never below 0).")
    samples: int = Field(description="Memory samples taken (every ~2 ms) over the repeats.")
    method: str = Field(description="'sampled', or 'sampled+hwm' when the kernel's peak RSS could be reset and read.")


class MemorySection(_Model):
    probe: str = Field(description="Memory source: 'rss' (stub processes), 'nvml' (GPU), or 'none'.")
    instances: int | None = Field(default=None, description="Instance processes found for the model.")
    base_bytes: int | None = Field(default=None, description="Memory of the model's instances at idle (weights, runtime, any pre-allocated pool).")
    weights_bytes_analytic: int | None = Field(default=None, description="From the spec's `weights`.")
    kv_bytes_per_token_analytic: int | None = Field(default=None, description="kv_shape(architecture, kv_dtype, tp).")
    kv_bytes_per_token_measured: float | None = Field(default=None, description="The preferred measurement (nvml > rss > metrics).")
    kv_relative_difference: float | None = Field(default=None, description="(measured - analytic) / analytic.")
    kv_measurements: list[KVMeasurement] = Field(default_factory=list)
    kv_block_tokens: int | None = None
    kv_pool_blocks: int | None = None
    kv_blocks_used: int | None = Field(default=None, description="Blocks held while `kv_streams` streams were open.")
    kv_tokens_in_flight: int | None = Field(default=None, description="Prompt + generated tokens of those streams (client view).")
    kv_streams: int | None = None
    kv_pool_bytes_measured: int | None = Field(default=None, description="Pool tokens x measured bytes per token.")
    prefill: list[PrefillPoint] = Field(default_factory=list)
    prefill_peak_bytes_at_longest: int | None = None
    pad_margin: float | None = None
    recommended_kv_safety_pad_mb: float | None = Field(
        default=None, description="Prefill peak at the longest context x pad_margin, MiB: the spec's policy.kv_safety_pad_mb."
    )
    notes: list[str] = Field(default_factory=list, description="Why a probe was skipped, and similar.")


class StreamLevel(_Model):
    """Concurrent gRPC streams in closed loop; latencies per token, client-side."""

    concurrency: int
    requests: int = Field(description="Streams completed in the measured windows.")
    errors: int = Field(description="Streams the model (or the transport) failed in the measured windows.")
    rejected: int = Field(default=0, description="Streams the served config's queue policy turned away (REJECT "
                          "timeout, max_queue_size): the config's finding, never the model's error.")
    tokens: int = Field(description="Tokens received in the measured windows.")
    duration_s: float
    windows: int
    converged: bool
    window_tokens_per_s: list[float]
    tokens_per_s: float = Field(description="All streams together.")
    stream_tokens_per_s_p50: float | None = Field(description="One stream's decode rate after its first token.")
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    itl_p50_ms: float | None
    itl_p99_ms: float | None
    error_samples: list[str] = Field(default_factory=list)


class StreamingSection(_Model):
    prompt_tokens: int
    max_tokens: int
    levels: list[StreamLevel] = Field(default_factory=list)


class PrefillSample(_Model):
    """One prompt length: what a single request sees, and what its prefill costs the engine.

    Two measurements. On an idle engine, single requests' time to first token: its growth with the
    prompt is the prefill's cost per token, and what one stream sees. While a long stream runs,
    the token gap in which a request was prefilled grows by the engine time it added (the fixed
    part of a prefill), and whether its first token lands with the long stream's token (the
    prefill ran inside the decode step) or before it. What is left of the idle time to first token
    is the request's path (client, transport, server, backend IPC)."""

    prompt_tokens: int = Field(description="Prompt tokens (prompt bytes / bytes_per_token).")
    prompt_bytes: int
    requests: int
    ttft_ms: float = Field(description="Median client-side time to first token on an idle engine.")
    queue_ms: float = Field(description="Mean queue time Triton reported for these requests.")
    engine_ms: float = Field(description="Median growth of the running stream's token gap: the prefill's engine time.")
    step_wait_ms: float = Field(description="Half the running stream's usual gap: the wait for the step under way.")
    path_ms: float = Field(description="ttft_ms - queue_ms - the modelled engine time of the first token: the request's way in and its first token's way out.")
    lag_steps: float | None = Field(
        default=None,
        description="Median time from the request's first token to the running stream's nearest token, in the "
        "stream's usual gaps: near 0 when the prefill ran inside the decode step; a prefill run before the decode "
        "lands it apart by the prefill or the decode, whichever is shorter.",
    )


class DecodeSample(_Model):
    """Token gaps of concurrent streams: one decode step per token while all of them run."""

    concurrency: int
    requests: int
    mean_gap_ms: float = Field(description="Median over streams of (last token - first token) / (tokens - 1).")
    step_ms: float = Field(description="The decode step: the median token gap among those no newcomer's first token fell in (engine_fits.decode_steps_ms), else mean_gap_ms less the expected share of newcomers' prefills.")
    running_seen: float | None = Field(
        default=None, description="Sequences that ran, where fewer than the streams could (the engine's max_num_seqs); "
        "the decode fit reads the step at this many.")


class MeasurementGap(_Model):
    """An optional measurement the model did not support: what could not be seen, and what the
    profile took instead. A profile goes on past each of these (issue 43); simulate, render and
    the sidecar read the inferred value, and the user reads why."""

    measurement: Literal["token counts", "final flag", "metrics", "kv capacity", "prefill beside a stream",
                         "token budget", "static batch capacity", "streaming", "prefix cache",
                         "model kind"] = Field(
        description="Which optional measurement.")
    unseen: str = Field(description="What could not be seen, and why.")
    inferred: str = Field(description="What the profile took instead (or 'nothing', and how to supply it).")


class UnaryLLMMeasurement(_Model):
    """An LLM that is not decoupled: one response holds the whole completion, so its first token
    reaches the client with its last (TTFT is the end-to-end time), and Triton's dynamic batcher
    forms its batches (static batching: a batch runs until its longest request is done)."""

    interface: str = Field(description="The LLM interface the profile spoke (LLMInterface.describe).")
    interface_kind: Literal["generic", "vllm", "trtllm", "token_ids"] | None = Field(
        default=None, description="The interface's family (LLMInterface.kind), as EngineMeasurement.interface_kind; "
        "None in profiles written before it was recorded.")
    budget_honoured: bool | None = Field(
        description="Whether a larger token budget made a request take longer (the model reads the budget where "
        "tritongen sends it); None: could not be told.")
    latency_ms_by_budget: list[tuple[int, float]] = Field(
        default_factory=list, description="(max_tokens, median end-to-end ms of single requests on an idle server).")
    ms_per_output_token: float | None = Field(
        default=None, description="Slope of the end-to-end time over the budget: one decode step at batch 1.")
    probe_prompt_tokens: int = Field(description="Prompt tokens (as sent) of the static-batch probe's requests.")
    probe_max_tokens: int = Field(description="Budget of the static-batch probe's requests.")
    batch_fits: list[tuple[int, bool]] = Field(
        default_factory=list, description="(requests sent together, whether every one succeeded) per probe step.")
    largest_batch_that_fits: int | None = Field(
        default=None, description="The largest batch of probe requests that ran whole; None: none did.")
    smallest_batch_that_fails: int | None = Field(
        default=None, description="The smallest batch that failed with an out-of-memory answer; None: none did "
        "up to the served max_batch_size.")
    kv_capacity_tokens: int | None = Field(
        default=None, description="Tokens a batch may hold at most: the largest batch that fit x (prompt + budget) "
        "tokens; a lower bound where no batch failed.")
    failure_sample: str | None = Field(default=None, description="The model's own error for the batch that failed, verbatim.")


class PrefixCacheSample(_Model):
    """One prompt length of the prefix-cache probe: the first token of a fresh prompt against the
    same prompt sent again at once (medians over `pairs`)."""

    prompt_tokens: int
    pairs: int
    fresh_ttft_ms: float
    repeat_ttft_ms: float
    fresh_spread_ms: float = Field(description="max - min of the fresh prompts' first tokens: the noise the saving must beat.")


class ArrivalBurst(_Model):
    """What arrivals that begin with a cached prefix cost the engine (`profiler.prefix_probe`):
    `burst` requests sent at once, each the same cached `shared_tokens` followed by `own_tokens` of
    its own, against one alone; the makespans' difference over `burst - 1` is one more arrival's
    engine time (`marginal_ms`), which `core.cached_prefill` fits."""

    shared_tokens: int = Field(description="Prompt tokens every request shares with a prompt the engine has cached.")
    own_tokens: int = Field(description="Prompt tokens each request has of its own after them (0: the whole prompt repeats).")
    burst: int
    rounds: int
    single_ms: float = Field(description="Median time from sending one such request to its first token.")
    burst_ms: float = Field(description="Median time from sending the burst to its last first token.")
    burst_spread_ms: float = Field(description="max - min of the bursts' makespans.")
    counted_tokens: int | None = Field(
        default=None, description="One request's prompt tokens as the engine counted them (its own leading tokens "
        "included); None where the model returns no count (the nominal sizes stand).")
    counted_shared_tokens: int | None = Field(default=None, description="The shared prefix's tokens as the engine counted them.")

    @property
    def marginal_ms(self) -> float:
        return (self.burst_ms - self.single_ms) / max(1, self.burst - 1)


class PrefixCacheProbe(_Model):
    """Whether the engine serves a repeated prompt's prefix from a cache, as timing shows it
    (`core.prefix_evidence.judge_prefix_cache`), and what an arrival with a cached prefix costs."""

    caches: bool | None = Field(description="True: a repeat's first token came as the cache predicts; None: could not be told.")
    evidence: str
    samples: list[PrefixCacheSample] = Field(default_factory=list)
    arrivals: list[ArrivalBurst] = Field(
        default_factory=list, description="Bursts of arrivals with a cached prefix (only where the engine caches).")


class EngineMeasurement(_Model):
    """The engine behind a decoupled model, measured from outside: what simulate and tune use."""

    interface: str = Field(description="The LLM interface the profile spoke (llm_interface.LLMInterface.describe).")
    interface_kind: Literal["generic", "vllm", "trtllm", "token_ids"] = Field(
        description="The interface's family (LLMInterface.kind); token_ids: prompts were sent as ids, one per token, "
        "so the profile's prompt lengths are exact token counts and its output tokens were counted from the ids."
    )
    bytes_per_token: float = Field(description="Prompt bytes per token used to size prompts.")
    prompt_added_tokens: int | None = Field(
        default=None, description="Tokens the engine adds to every prompt whatever its text (a BOS token, a chat "
        "template), from its token counts at two prompt sizes; None where it counts none (or the model takes ids).")
    salt_surplus_tokens: int | None = Field(
        default=None, description="Tokens a salted prompt (tritongen's loads start each prompt with a unique salt) "
        "holds beyond an unsalted one of the same bytes, by the engine's count: the load generator takes them off "
        "its filler so a prompt of N tokens holds N; None where the engine counts none.")
    text_words: TextWords | None = Field(
        default=None, description="The engine's tokens for each word the load generator writes shared texts with "
        "(core.prompts.TEXT_WORDS), from its counts of each word repeated at two lengths: a shared prefix of N "
        "tokens is written to hold N. None where the engine counts none (or the model takes ids).")
    bytes_per_token_source: str = Field(description="'backend token counts', 'spec', 'assumed (4)', or 'token ids' "
                                        "(1 by construction: the model was sent one id per token).")
    request_overhead_ms: float = Field(description="A request's time outside the engine: the idle time to first token's intercept less the modelled engine time of a first token.")
    prefill: list[PrefillSample] = Field(default_factory=list)
    decode: list[DecodeSample] = Field(default_factory=list)
    prefill_fixed_ms: float
    prefill_ms_per_token: float
    decode_fixed_ms: float
    decode_ms_per_seq: float
    decode_context_tokens: float = Field(description="Mean cached tokens per sequence during the decode levels (the per-seq cost holds there).")
    prefill_in_step: bool = Field(
        default=False,
        description="A newcomer's first token came with a running stream's token (its prefill ran inside the decode "
        "step: vLLM V1, TensorRT-LLM in-flight batching), not a step before it (LLMCurve.prefill_in_step).",
    )
    idle_ttft_fit: tuple[float, float] | None = Field(
        default=None,
        description="(ms, ms per prompt token): time to first token of one request on an idle engine, less Triton's "
        "queue, fitted over the prefill lengths; what the costs reproduce at one stream.",
    )
    kv_capacity_tokens: int | None = Field(default=None, description="Tokens the KV pool holds, where it could be measured.")
    kv_block_tokens: int | None = None
    kv_capacity_source: str | None = Field(default=None, description="'vllm metrics', 'trt-llm metrics', 'model metrics', 'capacity probe'.")
    kv_capacity_detail: str | None = None
    kv_policy_seen: Literal["reserve_wait", "reserve_kill", "grow_preempt", "grow_kill"] | None = Field(
        default=None, description="What the engine did when the capacity probe ran it out of KV memory; None: not seen.")
    kv_policy_evidence: str | None = Field(default=None, description="What the probe saw that says so.")
    prefix_cache: PrefixCacheProbe | None = Field(default=None, description="The prefix-cache probe; None: not run.")
    engine_metrics: list[str] = Field(default_factory=list, description="Engine metric families found on the endpoint.")
    preemptions_seen: int = Field(default=0, description="Preemptions the engine counted during the profile.")
    notes: list[str] = Field(default_factory=list)


class StatedEngine(_Model):
    """Engine values the spec stated for the profiled model (its `engine:` section), kept beside
    what was measured. A profile is all `simulate` reads besides the config, and a Python backend's
    config need not say its KV policy: carried here, the spec's values reach simulate without the
    user repeating them as `--engine` (which still wins over them)."""

    section: EngineSection = Field(description="The spec model's `engine:` section as stated.")
    source: str = Field(description="Where it was stated: the spec file and its model.")

    @classmethod
    def of(cls, model: ModelSpec, spec_path: object) -> StatedEngine | None:
        """What spec model `model` (of the spec file at `spec_path`) states of its engine, if anything:
        one label for the section wherever it travels (a profile, simulate SPEC)."""
        return None if model.engine is None else cls(section=model.engine, source=f"{spec_path}, model {model.name!r}")


class ScalingLevel(_Model):
    """Closed-loop load on N instances of one device, each request `rows` rows, no dynamic batching."""

    instances: int
    rows: int = Field(description="Rows per request (1 for a model without a batch dimension).")
    concurrency: int = Field(description="Requests kept in flight (2 per instance: one running, one waiting).")
    requests: int
    errors: int
    executions_per_s: float = Field(description="Executions (= requests) per second.")
    execution_ms: float | None = Field(default=None, description="Triton's mean compute time per execution at this level.")
    p50_ms: float | None = None
    p99_ms: float | None = None


class DevicePart(_Model):
    """The device part of an execution of `rows` rows, fitted from the levels of that size."""

    rows: int
    device_ms: float = Field(description="0: throughput grew in proportion to instances, no shared part seen.")
    execution_ms: float = Field(description="Mean compute time per execution on one instance.")
    one_instance_per_s: float = Field(description="Executions per second of one instance.")
    saturates_at: float | None = Field(description="Instances where the device binds: 1 / (device part x one instance's rate).")
    max_rel_error: float = Field(description="Largest |fit - measured| / measured throughput over the levels.")


class InstanceScaling(_Model):
    """How throughput grows with instances on one device, and the device part that caps it.

    Model: an execution is a host part, which overlaps across instances, and a device part, which
    the instances of a device take in turns; N instances deliver min(N x X1, 1 / device part)
    executions per second (X1: one instance's rate). Measured at a small and a large batch, the
    device part is a line in the rows (`device_fixed_ms + device_per_row_ms x rows`), which the
    simulator takes as the model's `device_curve`."""

    levels: list[ScalingLevel]
    parts: list[DevicePart]
    device_fixed_ms: float
    device_per_row_ms: float
    detail: str = Field(description="The fit in words.")


class MeasuredOverheads(_Model):
    """Costs outside the curve, fitted from Triton's own statistics during the load levels
    (`simulator.fit_overheads`): what simulate and tune use for this server by default."""

    request_ms: float = Field(description="Mean client-side latency less Triton's request duration (client, HTTP, loopback).")
    batch_ms: float = Field(description="Instance time per execution outside the curve (backend IPC, tensor copies); "
                            "negative, down to -request_exec_ms, where the curve already holds one request's "
                            "per-request cost.")
    request_exec_ms: float = Field(description="The same per request in an execution.")
    levels: int = Field(description="Load levels the fit used.")
    detail: str = Field(description="What could and could not be separated.")


class Profile(_Model):
    """What one model measured on one server. Written as `<out>/<model>.json`."""

    schema_version: Literal[1] = SCHEMA_VERSION
    model: str
    kind: Literal["classic", "streaming"] = Field(description="'streaming': a decoupled model (one response per token).")
    spec_model: str | None = Field(default=None, description="The spec's model this entry comes from.")
    server_version: str
    server_url: str
    created_at: datetime
    tritongen_version: str
    complete: bool = Field(description="False: the run stopped early; what is here was measured.")
    error: str | None = Field(default=None, description="Why the run stopped early.")
    duration_s: float
    max_batch_size: int
    settings: ProfileSettings
    curve: list[CurvePoint] = Field(default_factory=list)
    fit: CurveFit | None = None
    load_levels: list[LoadLevel] = Field(default_factory=list)
    knee: Knee | None = None
    memory: MemorySection | None = None
    streaming: StreamingSection | None = None
    engine: EngineMeasurement | None = None
    stated_engine: StatedEngine | None = Field(
        default=None, description="Streaming: the engine values the spec stated (profiles from a spec with `engine:`)."
    )
    overheads: MeasuredOverheads | None = Field(default=None, description="Classic: overheads fitted on this server.")
    scaling: InstanceScaling | None = Field(default=None, description="Classic: instance scaling on one device.")
    variant: str | None = Field(
        default=None, description="Classic: the config the load levels ran on, when not the served one (loaded through the load API)."
    )
    llm: UnaryLLMMeasurement | None = Field(
        default=None, description="Classic: an LLM that is not decoupled, measured as one (TTFT = end-to-end).")
    gaps: list[MeasurementGap] = Field(
        default_factory=list, description="Optional measurements the model did not support, and what was inferred.")
    notes: list[str] = Field(default_factory=list, description="What was measured how, and what could not be.")
    served_config: dict[str, Any] | None = Field(
        default=None, description="The model's config as the server reported it (GET /v2/models/M/config, its "
        "auto-completed fields included): what `simulate` runs when no --config is given, so a model profiled "
        "through --url alone can be simulated without its repository.")


def read_profile(text: str) -> Profile:
    """Parse a profile; a schema_version this code does not know fails validation."""
    return Profile.model_validate_json(text)
