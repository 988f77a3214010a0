"""The streaming half of `Profiler` (tritongen.profiler.run): the steps of a decoupled LLM's
profile in the order the run module's docstring gives (KV-pool resize probe, prefill scan, KV
hold, TTFT and inter-token latency versus concurrency).

A mixin, not a class of its own, because the steps share the run's state with the classic half:
it uses `admin`, `endpoints`, `settings`, `reporter`, `probe_factory`, `can_reload`,
`kv_capacity_probe`, `_decide` and `_on_window`, which `Profiler` sets and defines."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from tritongen.core import profile_math as pm
from tritongen.core.profile_types import KVMeasurement, MeasurementGap, MemorySection, PrefillPoint, ProfileSettings, StreamingSection, StreamLevel
from tritongen.core.prometheus import kv_gauges, parse_prometheus
from tritongen.errors import RunFailed, TritongenError
from tritongen.profiler.engine import EngineProfiler, engine_settings, interface_of
from tritongen.profiler.load import ModelFailed, StreamLoad, StreamRecord, Window, distinct_errors, model_errors, queue_rejected
from tritongen.profiler.memory import MemoryProbe, PeakSampler, steady_value
from tritongen.profiler.profile_builder import ProfileBuilder
from tritongen.profiler.targets import Target, stream_inputs

KV_HOLD_ATTEMPTS = 3  # KV hold runs before giving up on the gauges
KV_HOLD_QUEUE_ATTEMPTS = 8  # ... when what failed was only the queue policy rejecting a stream


class StreamingSteps:
    def _stream_lengths(self, target: Target) -> tuple[int, int]:
        prompt = target.prompt_tokens or 32
        output = target.output_tokens or 32
        if target.max_prompt_tokens:
            prompt = min(prompt, target.max_prompt_tokens)
        if target.max_context:
            prompt = min(prompt, max(1, target.max_context // 2))
            output = max(1, min(output, target.max_context - prompt))
        return prompt, output

    def _prefill_lengths(self, target: Target) -> list[int]:
        if not target.max_context or target.max_context < 2:
            return []
        longest = target.max_context - 1  # one token generated
        if target.max_prompt_tokens:
            longest = min(longest, target.max_prompt_tokens)
        count = 4 if self.settings.quick else 6
        return pm.prefill_lengths(longest, count=count)

    def _streaming(self, target: Target, builder: ProfileBuilder) -> None:
        s = builder.settings
        interface = interface_of(target.name, target.config)
        target = replace(target, interface=interface)
        stream = StreamLoad.of(self.endpoints.grpc, target.name, {}, interface)
        probe, notes = self.probe_factory(target)
        memory = MemorySection(
            probe=probe.name,
            notes=notes,
            weights_bytes_analytic=target.weights_bytes_analytic,
            kv_bytes_per_token_analytic=target.kv_bytes_per_token_analytic,
            kv_block_tokens=target.int_parameter("kv_block_tokens"),
            kv_pool_blocks=target.int_parameter("kv_pool_blocks"),
            pad_margin=s.pad_margin,
        )
        builder.memory = memory
        memory.instances = probe.refresh() or None

        self.reporter.update(f"{target.name}: KV pool resize probe")
        self._resize_probe(target, probe, memory)
        memory.instances = probe.refresh() or memory.instances
        memory.base_bytes = steady_value(probe)
        self.reporter.update(f"{target.name}: KV pool resize probe", advance=1)

        self._prefill_scan(target, probe, memory, stream, s)
        self.reporter.update(f"{target.name}: prefill scan", advance=1)

        self._kv_hold(target, memory, stream)
        self._summarise_kv(memory)
        self.reporter.update(f"{target.name}: KV gauges", advance=1)

        assert s.prompt_tokens is not None and s.output_tokens is not None
        section = StreamingSection(prompt_tokens=s.prompt_tokens, max_tokens=s.output_tokens)
        builder.streaming = section

        def level(load: StreamLoad, concurrency: int):
            label = f"{target.name}: {concurrency} stream(s)"
            self.reporter.update(f"{label}: warming up")
            found = load.run_level(concurrency, s.warmup_s, s.window_s, self._decide(), self._on_window(label, "tok/s"),
                                   min_finished=concurrency)
            section.levels.append(self._stream_level(concurrency, *found))
            self.reporter.update(label, advance=1)
            return found

        profiler = EngineProfiler(
            self.admin, self.endpoints.grpc, target.name, target.config,
            engine_settings(target.max_context, s.prompt_tokens, s.output_tokens, s.quick, s.stream_concurrency_levels,
                            capacity_probe=self.kv_capacity_probe),
            target.bytes_per_token, level, lambda what: self.reporter.update(f"{target.name}: {what}"),
            max_context=target.max_context,
            engine_args=self._engine_args(target),
        )
        builder.gaps = profiler.gaps  # kept in a partial profile too
        if self.admin.metrics() is None:
            profiler.gaps.append(MeasurementGap(
                measurement="metrics", unseen=f"the metrics endpoint ({self.endpoints.metrics}) did not answer",
                inferred="engine gauges and counters were not read; what they give was measured from the streams "
                         "or assumed (see the other gaps)",
            ))
        builder.engine = profiler.measure()

    def _engine_args(self, target: Target) -> dict | None:
        """The vLLM backend's model.json, where the profile sees the repository (--repo)."""
        if self.repository is None or target.config.get("backend") != "vllm":
            return None
        from tritongen.engine_files import vllm_engine_args

        return vllm_engine_args(Path(self.repository) / target.name)

    def _stream_level(self, concurrency: int, records: list[StreamRecord], windows: list[Window], start: float) -> StreamLevel:
        s = self.settings
        end = start + len(windows) * s.window_s
        finished = [r for r in records if r.end is not None and start <= r.end < end]
        ok = [r for r in finished if r.error is None]
        started = [r for r in records if start <= r.start < end and r.error is None and r.token_times]
        ttfts = [r.ttft_s for r in started if r.ttft_s is not None]
        gaps = [g for r in records for g in pm.inter_token_gaps([t for t in r.token_times if start <= t < end])]
        tokens = sum(1 for r in records for t in r.token_times if start <= t < end)
        rates = [(len(r.token_times) - 1) / (r.token_times[-1] - r.token_times[0]) for r in ok if len(r.token_times) >= 2 and r.token_times[-1] > r.token_times[0]]
        ttft50, ttft99 = pm.percentiles_ms(ttfts, (50, 99))
        itl50, itl99 = pm.percentiles_ms(gaps, (50, 99))
        win_rates = [w.rate for w in windows]
        return StreamLevel(
            concurrency=concurrency,
            requests=len(ok),
            errors=len(model_errors([r.error for r in finished])),
            rejected=sum(1 for r in finished if queue_rejected(r.error)),
            tokens=tokens,
            duration_s=round(end - start, 3),
            windows=len(windows),
            converged=pm.level_done(win_rates, 1, max(1, len(win_rates)), s.agreement)[1],
            window_tokens_per_s=[round(r, 2) for r in win_rates],
            tokens_per_s=tokens / (end - start) if end > start else 0.0,
            stream_tokens_per_s_p50=pm.percentile(rates, 50),
            ttft_p50_ms=ttft50,
            ttft_p99_ms=ttft99,
            itl_p50_ms=itl50,
            itl_p99_ms=itl99,
            error_samples=distinct_errors([r.error for r in finished]),
        )

    # -- memory of streaming models ----------------------------------------------------------------

    def _resize_probe(self, target: Target, probe: MemoryProbe, memory: MemorySection) -> None:
        """Reload with a bigger KV pool and back; the memory delta over the pool-token delta."""
        s = self.settings
        blocks, block_tokens = memory.kv_pool_blocks, memory.kv_block_tokens
        why = None
        if s.kv_probe_mb <= 0:
            why = "KV pool resize probe disabled (--kv-probe-mb 0)"
        elif not self.can_reload:
            why = "KV pool resize probe skipped: it reloads the model, done only on a server tritongen started (--repo)"
        elif blocks is None or block_tokens is None:
            why = "KV pool resize probe skipped: the model has no kv_pool_blocks / kv_block_tokens parameters"
        elif probe.name == "none":
            why = "KV pool resize probe skipped: no memory source for this model"
        if why:
            memory.notes.append(why)
            return
        assert blocks is not None and block_tokens is not None
        guess = target.kv_bytes_per_token_analytic or self._reported_bytes_per_token(target.name) or 512
        extra = pm.probe_blocks(s.kv_probe_mb * pm.MIB, block_tokens, guess)
        original = target.config
        bigger = json.loads(json.dumps(original))
        bigger["parameters"]["kv_pool_blocks"] = {"string_value": str(blocks + extra)}
        readings: dict[str, int] = {}
        try:
            for label, config in (("bigger", bigger), ("original", original)):
                old = probe.instances
                self.admin.load(target.name, config)
                self._wait_ready(target.name)
                self._await_new_instances(probe, old)
                self._await_retired(probe, old)
                value = steady_value(probe, samples=7)
                if value is None:
                    memory.notes.append("KV pool resize probe: the instance memory could not be read after reload")
                    return
                readings[label] = value
        finally:
            if "original" not in readings:  # failed half-way: put the original config back
                try:
                    self.admin.load(target.name, original)
                    self._wait_ready(target.name)
                    probe.refresh()
                except TritongenError:
                    pass
        delta = readings["bigger"] - readings["original"]
        tokens = extra * block_tokens
        bpt = pm.bytes_per_token_from_delta(delta, tokens)
        memory.kv_measurements.append(
            KVMeasurement(
                source="nvml" if probe.name == "nvml" else "rss",
                bytes_per_token=round(bpt, 2),
                relative_difference=pm.relative_difference(bpt, target.kv_bytes_per_token_analytic),
                detail=(
                    f"pool {blocks} -> {blocks + extra} blocks (+{tokens} tokens): instance memory "
                    f"{readings['original']} -> {readings['bigger']} bytes (+{delta})"
                ),
            )
        )

    def _await_new_instances(self, probe: MemoryProbe, old: Sequence[int], timeout_s: float = 10.0) -> None:
        """After a reload the old stub lingers a while: read only the new instance processes."""
        if probe.name != "rss":
            time.sleep(0.5)
            return
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if probe.refresh(exclude=old) > 0:
                time.sleep(0.2)  # let its initialize() settle
                probe.refresh(exclude=old)
                return
            time.sleep(0.05)
        raise RunFailed("after reloading, no new instance process of the model appeared")

    @staticmethod
    def _await_retired(probe: MemoryProbe, old: Sequence[int], timeout_s: float = 15.0) -> None:
        """Let the replaced instances exit (they share the CPU and, on a GPU, the device memory)."""
        alive = getattr(probe, "alive", None)
        if alive is None:
            time.sleep(0.5)
            return
        deadline = time.monotonic() + timeout_s
        while alive(old) and time.monotonic() < deadline:
            time.sleep(0.05)

    def _wait_ready(self, model: str, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.admin.model_ready(model):
                return
            time.sleep(0.05)
        raise RunFailed(f"model {model!r} was not ready {timeout_s:.0f} s after reloading it")

    def _reported_bytes_per_token(self, model: str) -> float | None:
        text = self.admin.metrics()
        return kv_gauges(parse_prometheus(text), model).bytes_per_token if text else None

    def _prefill_scan(self, target: Target, probe: MemoryProbe, memory: MemorySection, stream: StreamLoad, s: ProfileSettings) -> None:
        lengths = s.prefill_prompt_lengths
        if not lengths:
            memory.notes.append("prefill scan skipped: the model's max context is unknown (no spec, no max_context parameter)")
            return
        if probe.name == "none":
            memory.notes.append("prefill scan skipped: no memory source for this model")
            return
        # Warm up first: a fresh instance allocates for good on its first requests (buffers,
        # lazily built state), which is not a prefill transient.
        for _warm in range(2):
            record = self._single(stream, stream_inputs(target, min(16, lengths[0]), 4), memory)
            if record.error is not None:
                raise ModelFailed(f"model {target.name!r} failed a warm-up request: {record.error}")
        steady = steady_value(probe, samples=7)
        if steady is None:
            memory.notes.append("prefill scan skipped: the instance memory could not be read")
            return
        for length in lengths:
            self.reporter.update(f"{target.name}: prefill scan, prompt {length} tokens")
            peak, samples, hwm = steady, 0, False
            for _repeat in range(max(1, s.prefill_repeats)):
                with PeakSampler(probe) as sampler:
                    record = self._single(stream, stream_inputs(target, length, 1), memory)
                if record.error is not None:
                    raise ModelFailed(f"model {target.name!r} failed a single request with a {length}-token prompt: {record.error}")
                peak = max(peak, sampler.peak or steady)
                samples += sampler.samples
                hwm = hwm or sampler.used_hwm
            memory.prefill.append(
                PrefillPoint(
                    prompt_tokens=length,
                    steady_bytes=steady,
                    peak_bytes=peak,
                    peak_delta_bytes=pm.peak_delta(steady, peak),
                    samples=samples,
                    method="sampled+hwm" if hwm else "sampled",
                )
            )
        longest = memory.prefill[-1]
        memory.prefill_peak_bytes_at_longest = longest.peak_delta_bytes
        memory.recommended_kv_safety_pad_mb = pm.recommended_pad_mb(longest.peak_delta_bytes, s.pad_margin)

    @staticmethod
    def _single(stream: StreamLoad, inputs, memory: MemorySection, attempts: int = 3) -> StreamRecord:
        """One request; a queue rejection (timeout, queue full) is retried, anything else is final.

        Triton 2.51 with priority levels holds the odd request in its queue until the queue
        timeout fires even when the server is idle, so a lone request can fail that way."""
        record = stream.one(inputs)
        for _ in range(attempts - 1):
            if not queue_rejected(record.error):
                break
            memory.notes.append(f"a single request was rejected by the queue and retried: {record.error}")
            record = stream.one(inputs)
        return record

    def _kv_hold(self, target: Target, memory: MemorySection, stream: StreamLoad) -> None:
        """Hold a few long streams open and read the model's KV gauges against the tokens in flight."""
        text = self.admin.metrics()
        gauges = kv_gauges(parse_prometheus(text), target.name) if text else None
        if gauges is None or not gauges.present:
            memory.notes.append("the model exports no *_kv_* gauges on the metrics endpoint: KV blocks not read")
            return
        if gauges.bytes_per_token is not None:
            memory.kv_measurements.append(
                KVMeasurement(
                    source="metrics",
                    bytes_per_token=gauges.bytes_per_token,
                    relative_difference=pm.relative_difference(gauges.bytes_per_token, target.kv_bytes_per_token_analytic),
                    detail="the model's own kv_bytes_per_token gauge (what it says it allocates)",
                )
            )
        memory.kv_block_tokens = memory.kv_block_tokens or gauges.block_tokens
        memory.kv_pool_blocks = gauges.blocks_total or memory.kv_pool_blocks
        block = memory.kv_block_tokens
        context = target.max_context or 64
        prompt = max(1, context // 2)
        max_tokens = max(1, context - prompt - 1)
        # Enough streams that the engine's steps take a while: a metrics scrape takes tens of ms
        # (hundreds on a busy host), and a handful of streams on a small model finish within two.
        streams = min(16, target.int_parameter("max_num_seqs") or 16)
        if memory.kv_pool_blocks and block:
            per_stream = -(-context // block)
            streams = max(1, min(streams, memory.kv_pool_blocks // per_stream))
        attempt = 0
        while True:
            attempt += 1
            workers, readings = self._hold_once(target, stream, streams, prompt, max_tokens, block)
            errors = [r.error for w in workers for r in w.records if r.error not in (None, "stopped")]
            if readings:
                break
            # A stream the served config's queue policy rejected never reached the engine, and no
            # reading counts until every stream is in. Triton 2.51 holds the odd request ~500 ms in a
            # batcher with priority levels (see _single), so with many streams one attempt in three
            # can lose one: queue rejections get more attempts than other failures do.
            queue_only = bool(errors) and all(queue_rejected(e) for e in errors)
            if attempt >= (KV_HOLD_QUEUE_ATTEMPTS if queue_only else KV_HOLD_ATTEMPTS):
                break
            self._wait_pool_drained(target.name)
        if errors:
            memory.notes.append(f"KV hold: {len(errors)} of {streams} streams failed: {errors[0]}")
        if not readings:
            if not errors:
                memory.notes.append("KV hold: the streams ended before the gauges could be read")
            return
        # The earliest reading with every stream admitted: later ones may count tokens of a stream
        # that already finished (streams arrive a few engine steps apart) while its blocks are free.
        used, tokens = min(readings, key=lambda r: r[1])
        memory.kv_streams = streams
        memory.kv_blocks_used = int(used)
        memory.kv_tokens_in_flight = int(round(tokens))
        if block and gauges.bytes_per_token:
            paged = pm.paged_bytes_per_token(int(used), block, gauges.bytes_per_token, int(round(tokens)))
            if paged is not None:
                memory.kv_measurements.append(
                    KVMeasurement(
                        source="blocks",
                        bytes_per_token=round(paged, 2),
                        relative_difference=pm.relative_difference(paged, target.kv_bytes_per_token_analytic),
                        detail=(
                            f"{used} blocks x {block} tokens x {gauges.bytes_per_token:g} B held for {tokens:.0f} "
                            f"tokens in flight over {streams} streams of a {prompt}-token prompt (partly filled "
                            f"blocks included; the gauges come from one scrape but are published one by one, so "
                            f"expect a step of slack per stream; whole blocks for those tokens: "
                            f"{pm.blocks_needed([round(tokens / streams)] * streams, block)})"
                        ),
                    )
                )
        self._wait_pool_drained(target.name)

    def _hold_once(self, target: Target, stream: StreamLoad, streams: int, prompt: int, max_tokens: int, block: int | None):
        """Run `streams` long requests; read (blocks used, tokens in flight) while all of them run."""
        text = self.admin.metrics()
        generated_before = kv_gauges(parse_prometheus(text), target.name).generated_tokens if text else None
        admitted = streams * -(-prompt // block) if block else 1
        workers, stop = stream.start(streams, limit=1, inputs=stream_inputs(target, prompt, max_tokens), together=True)
        readings: list[tuple[int, float]] = []
        try:
            # The engine outruns the client (responses arrive in bursts, later than tokens are made),
            # so read the gauges as fast as the endpoint answers while the streams run, and count
            # tokens with the engine's own counter where it has one.
            deadline = time.monotonic() + 30.0
            while any(w.is_alive() for w in workers) and time.monotonic() < deadline:
                before = self._in_flight(workers, prompt)
                text = self.admin.metrics()
                after = self._in_flight(workers, prompt)
                now = kv_gauges(parse_prometheus(text), target.name) if text else None
                if now is None or not now.blocks_used or now.blocks_used < admitted:
                    continue
                if generated_before is not None and now.generated_tokens is not None:
                    generated = now.generated_tokens - generated_before
                    if not streams <= generated <= streams * (max_tokens - 2):
                        continue  # not all admitted yet, or some already finished
                    # a sequence that has produced g tokens holds K/V for prompt + g - 1 of them
                    tokens = streams * (prompt - 1) + generated
                else:
                    tokens = (before + after) / 2
                readings.append((now.blocks_used, tokens))
        finally:
            StreamLoad.finish(workers, stop)
        if any(r.error not in (None, "stopped") for w in workers for r in w.records):
            readings = []  # fewer streams than counted ran: the token count would be wrong
        return workers, readings

    @staticmethod
    def _in_flight(workers, prompt: int) -> int:
        return sum(prompt - 1 + len(w.current.token_times) for w in workers if w.current is not None)

    def _wait_pool_drained(self, model: str, timeout_s: float = 5.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            text = self.admin.metrics()
            used = kv_gauges(parse_prometheus(text), model).blocks_used if text else None
            if not used:
                return
            time.sleep(0.05)

    @staticmethod
    def _summarise_kv(memory: MemorySection) -> None:
        preferred = {m.source: m for m in memory.kv_measurements}
        for source in ("nvml", "rss", "metrics"):
            if source in preferred:
                chosen = preferred[source]
                memory.kv_bytes_per_token_measured = chosen.bytes_per_token
                memory.kv_relative_difference = chosen.relative_difference
                break
        if memory.kv_bytes_per_token_measured and memory.kv_pool_blocks and memory.kv_block_tokens:
            memory.kv_pool_bytes_measured = int(
                memory.kv_bytes_per_token_measured * memory.kv_pool_blocks * memory.kv_block_tokens
            )
