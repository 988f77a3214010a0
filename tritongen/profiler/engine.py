"""Measure the engine behind a decoupled LLM from outside, through the interface it speaks.

What the simulator's engine model (`tritongen.core.engine`) needs, each labelled with its source:
  - prefill cost versus prompt length: single requests at three or four prompt lengths while one
    long stream decodes; the long stream's token gap that holds a request's prefill grows by that
    prefill's engine time;
  - the request path (`request_overhead_ms`): what is left of those requests' time to first token
    after Triton's queue time, the prefill and half a running step (the wait for the step under way);
  - decode step versus running sequences: each concurrent stream's span from first to last token,
    less the other streams' prefills that landed inside it, over its gaps;
  - KV capacity: from the engine's own metrics where it exports them (TensorRT-LLM block gauges,
    vLLM's `kv_cache_usage_perc` while every stream holds a known number of blocks, a model's
    `*_kv_blocks_total`), else an opt-in probe that doubles, then bisects, the concurrency of long
    requests until the first out-of-memory answer or preemption.

Prompts are sized in tokens with the model's bytes per token: the spec's, else the backend's own
token count (vLLM's `num_input_tokens`), else 4 (labelled "assumed"). A model of token ids is sent
one id per token (`llm_token_ids`): its prompt lengths are exact, with nothing to measure or assume,
and its responses' tokens are counted from their ids.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tritongen.client import RequestInputs, numpy_inputs
from tritongen.core.engine_inference import bytes_per_token_from_counts, counter_delta, tokens_added_per_prompt
from tritongen.core.engine_metrics import PROMPT_TOKENS_COUNTER
from tritongen.core.llm_interface import LLMInterface, UnknownInterface
from tritongen.core.llm_interface_config import interface_from_config
from tritongen.core.llm_token_ids import TOKEN_IDS_SOURCE
from tritongen.core.prompts import TEXT_WORDS, TextWords, prompt_of, to_be_salted
from tritongen.core.profile_types import DecodeSample, EngineMeasurement, MeasurementGap, PrefillSample
from tritongen.errors import BadInput, RunFailed, TritongenError
from tritongen.profiler.engine_fits import (
    decode_step_ms,
    decode_steps_ms,
    fit_line,
    gap_growth,
    mean_gap_ms,
    nearest_token_ms,
    prefill_runs_in_step,
)
from tritongen.profiler.engine_capacity import EngineCapacity
from tritongen.profiler.first_output import first_output_int
from tritongen.profiler.load import ModelFailed, StreamLoad, StreamRecord, first_error, unique_prompt
from tritongen.profiler.prefix_probe import probe_prefix_cache, text_inputs

ASSUMED_BYTES_PER_TOKEN = 4.0
ASSUMED_CONTEXT = 1024
WORD_REPEATS = (2, 6)  # a shared-text word counted repeated this often, then this: two lengths, within any context
"""A model's context where neither its files nor the spec state it: probes send prompts up to half of
it. A model with a smaller context refuses the longer ones with its own error, which costs those
samples only (a failed request is never a sample)."""


def assumed_bytes_per_token_gap(unseen: str) -> MeasurementGap:
    """The gap of a model whose tokens per prompt byte could not be seen (`unseen`: why), and what
    every profile then takes instead."""
    return MeasurementGap(
        measurement="token counts", unseen=f"{unseen}: its tokens per prompt byte could not be seen",
        inferred=f"assumed {ASSUMED_BYTES_PER_TOKEN:g} bytes per token to size prompts (state `bytes_per_token` in "
                 "the spec to replace it)",
    )


def interface_of(name: str, config: dict) -> LLMInterface:
    try:
        return interface_from_config(config, model=name)
    except UnknownInterface as err:
        raise BadInput(str(err)) from None


def stream_inputs(interface: LLMInterface, prompt_tokens: int, max_tokens: int, bytes_per_token: float,
                  count_input_tokens: bool = False, salt_surplus: int = 0) -> RequestInputs:
    """One request's arrays in the model's interface, with the request parameters that carry its
    budget where no tensor does (a model of token ids: `prompt_tokens` ids, whatever `bytes_per_token`).
    `salt_surplus`: the tokens a salt adds (`EngineMeasurement.salt_surplus_tokens`), left out of the
    text so that the stream worker's salted prompt holds `prompt_tokens`."""
    bpt = interface.sizing_bytes_per_token(bytes_per_token)
    text = prompt_of(prompt_tokens, bpt) if interface.speaks_token_ids else to_be_salted(prompt_tokens, bpt, salt_surplus)
    arrays = numpy_inputs(interface.request(text, max_tokens, stream=True, count_input_tokens=count_input_tokens))
    return RequestInputs(arrays, interface.request_parameters(max_tokens))


# ---------------------------------------------------------------------------------------------
# The live part


def _decoding(worker) -> StreamRecord | None:
    """The worker's current request once it has a few tokens (decoding), else None after a wait."""
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        current = worker.current
        if current is not None and len(current.token_times) >= 4:
            return current
        if worker.fatal:
            raise ModelFailed(f"the long stream failed: {worker.fatal}")
        time.sleep(0.005)
    return None


@dataclass
class EngineSettings:
    prefill_lengths: list[int]
    prefill_repeats: int
    concurrency_levels: list[int]
    prompt_tokens: int
    output_tokens: int
    capacity_probe: bool = False


def engine_settings(max_context: int | None, prompt: int, output: int, quick: bool, levels: Sequence[int],
                    capacity_probe: bool = False) -> EngineSettings:
    """Three (quick) or four prompt lengths up to half the context, and the decode levels."""
    top = max(8, min((max_context or ASSUMED_CONTEXT) // 2, max(4 * prompt, 64), 1024))
    fractions = (0.1, 0.5, 1.0) if quick else (0.05, 0.25, 0.6, 1.0)
    lengths = sorted({max(4, int(round(top * f))) for f in fractions})
    return EngineSettings(
        prefill_lengths=lengths,
        prefill_repeats=3 if quick else 5,
        concurrency_levels=sorted(set(levels)) if len(set(levels)) >= 2 else [1, 4],
        prompt_tokens=prompt,
        output_tokens=output,
        capacity_probe=capacity_probe,
    )


class EngineProfiler(EngineCapacity):
    """One model's engine measurement. `admin` is the profiler's TritonAdmin (stats, metrics)."""

    def __init__(self, admin, grpc_url: str, model: str, config: dict, settings: EngineSettings,
                 bytes_per_token: float | None, run_level: Callable, update: Callable[[str], None],
                 max_context: int | None = None, engine_args: dict | None = None) -> None:
        self.max_context = max_context
        self.engine_args = engine_args  # the backend's own files (vLLM model.json), where readable
        self.admin = admin
        self.grpc_url = grpc_url
        self.model = model
        self.settings = settings
        self.interface = interface_of(model, config)
        self.spec_bytes_per_token = bytes_per_token
        self.run_level = run_level  # (StreamLoad, concurrency) -> (records, windows, start)
        self.update = update
        self.notes: list[str] = []
        self.gaps: list[MeasurementGap] = []  # optional measurements the model did not support
        # Model tokens per prompt token sent, at worst: 1 where the bytes per token were counted or
        # stated; where they were assumed, every byte may be a token (a byte-level tokenizer), so a
        # request is sized to fit the model's context even then.
        self.worst_tokens_per_token = 1.0
        self.prompt_added_tokens: int | None = None  # what the engine adds to every prompt (bytes_per_token)
        self.salt_surplus_tokens: int | None = None  # what a salt adds to a prompt's tokens (bytes_per_token)

    # -- pieces ---------------------------------------------------------------------------------

    def _stream(self, inputs) -> StreamLoad:
        return StreamLoad.of(self.grpc_url, self.model, inputs, self.interface)

    def _request(self, prompt_tokens: int, max_tokens: int, bpt: float) -> RequestInputs:
        """A request the stream workers salt, holding `prompt_tokens` once salted where the salt's
        surplus was measured (`bytes_per_token` runs first)."""
        return stream_inputs(self.interface, prompt_tokens, max_tokens, bpt, salt_surplus=self.salt_surplus_tokens or 0)

    def _counter(self, name: str) -> float | None:
        values = [s.value for s in self._families() if s.name == name]
        return sum(values) if values else None

    def bytes_per_token(self) -> tuple[float, str]:
        """The spec's ratio, else the engine's own token counts of prompts of two sizes (the
        backend's `num_input_tokens`, else its prompt-token counter's growth), else assumed; for a
        model of token ids, 1: each prompt is sent as one id per token, its length exact."""
        if self.interface.speaks_token_ids:
            return 1.0, TOKEN_IDS_SOURCE
        if self.spec_bytes_per_token:
            return self.spec_bytes_per_token, "spec"
        output = self.interface.input_token_count_output
        sizes = (128, 512)  # bytes, at one byte per token (a prompt within any context)
        if self.max_context:
            sizes = tuple(min(size, max(8, self.max_context // 2)) for size in sizes)
        counted: list[tuple[int, float]] = []
        by_counter: list[tuple[int, float]] = []
        last: tuple[RequestInputs, float | None, float | None] | None = None
        for sent in sorted(set(sizes)):
            prompt_bytes = len(prompt_of(sent, 1.0))
            tensors = stream_inputs(self.interface, sent, 1, 1.0, count_input_tokens=bool(output))
            try:
                count, grown = self._prompt_tokens(tensors, output)
            except ModelFailed as err:  # optional: a count the model will not give is a gap, not a failure
                self.notes.append(f"bytes per token: a {sent}-byte prompt was refused: {err}")
                continue
            if count:
                counted.append((prompt_bytes, count))
            if grown:
                by_counter.append((prompt_bytes, grown))
            last = (tensors, count, grown)
        if last is not None:
            self.salt_surplus_tokens = self._salt_surplus(*last, output)
        found = bytes_per_token_from_counts(counted)
        if found:
            self.prompt_added_tokens = tokens_added_per_prompt(counted)
            return round(found, 4), "backend token counts"
        found = bytes_per_token_from_counts(by_counter)
        if found:
            self.prompt_added_tokens = tokens_added_per_prompt(by_counter)
            return round(found, 4), f"the engine's {PROMPT_TOKENS_COUNTER} against the prompt bytes sent"
        self.gaps.append(assumed_bytes_per_token_gap(
            f"the model returns no prompt token count (no num_input_tokens output) and exports no {PROMPT_TOKENS_COUNTER}"))
        return ASSUMED_BYTES_PER_TOKEN, f"assumed ({ASSUMED_BYTES_PER_TOKEN:g})"

    def text_words(self) -> TextWords | None:
        """The engine's tokens for each word of shared texts (core.prompts.TEXT_WORDS): the growth of its
        count from WORD_REPEATS[0] to [1] repeats, and what is left at the start beyond the tokens it adds
        to every prompt. None for token ids or an engine that counts none (sized by bytes per token)."""
        if self.interface.speaks_token_ids:
            return None
        output = self.interface.input_token_count_output
        low, high = WORD_REPEATS
        spaced: dict[str, float] = {}
        leading: dict[str, float] = {}
        for word in TEXT_WORDS:
            counts = []
            for repeats in (low, high):
                try:
                    count, grown = self._prompt_tokens(text_inputs(self.interface, " ".join([word] * repeats), bool(output)), output)
                except ModelFailed as err:  # optional: shared texts are then sized by bytes per token
                    self.notes.append(f"shared-text words: a prompt of {word!r} x {repeats} was refused: {err}")
                    return None
                counts.append(count or grown)
            if not counts[0] or not counts[1] or counts[1] <= counts[0]:
                return None
            spaced[word] = round((counts[1] - counts[0]) / (high - low), 3)
            leading[word] = round(counts[0] - low * spaced[word] - (self.prompt_added_tokens or 0), 3)
        return TextWords(spaced=spaced, leading=leading)

    def _prompt_tokens(self, tensors: RequestInputs, output: str | None) -> tuple[float | None, float | None]:
        """(the backend's count of the prompt's tokens, its prompt-token counter's growth) for one
        request of `tensors`; either None where the model gives none."""
        before = self._counter(PROMPT_TOKENS_COUNTER)
        count = first_output_int(self.grpc_url, self.model, tensors, output or self.interface.text_output,
                                 want_int=bool(output), parameters=tensors.parameters)
        after = self._wait_counter(PROMPT_TOKENS_COUNTER, before)
        return (float(count) if output and count else None), counter_delta(before, after)

    def _salt_surplus(self, tensors: RequestInputs, count: float | None, grown: float | None,
                      output: str | None) -> int | None:
        """Tokens a salted prompt holds beyond the same-sized unsalted one (core.prompts.salted: the
        salt's digit words tokenize denser than the filler they replace): what every load's prompt
        carries beyond its nominal size, which the load generator takes off its filler
        (`LoadTarget.salt_surplus_tokens`). None where the engine counts no tokens."""
        try:
            salted_count, salted_grown = self._prompt_tokens(unique_prompt(tensors, self.interface.text_input), output)
        except ModelFailed:
            return None
        if count and salted_count:
            return int(round(salted_count - count))
        if grown and salted_grown:
            return int(round(salted_grown - grown))
        return None

    def _wait_counter(self, name: str, before: float | None, timeout_s: float = 2.0) -> float | None:
        """The counter once it moved past `before` (a backend publishes its metrics from a thread of
        its own, a moment after the response), or its last value."""
        deadline = time.monotonic() + timeout_s
        value = self._counter(name)
        while value is not None and before is not None and value <= before and time.monotonic() < deadline:
            time.sleep(0.05)
            value = self._counter(name)
        return value

    def _queue_totals(self) -> tuple[int, int]:
        stats = self.admin.stats(self.model).get("inference_stats") or {}
        queue = stats.get("queue") or {}
        return int(queue.get("ns", 0)), int(queue.get("count", 0))

    def _singles(self, inputs) -> list[StreamRecord]:
        """Single requests one after another (StreamLoad.singles); a failed one is the model's error."""
        records = self._stream(inputs).singles(self.settings.prefill_repeats)
        failed = [r.error for r in records if r.error not in (None, "stopped")]
        if failed:
            raise ModelFailed(f"model {self.model!r} failed a single request: {failed[0]}")
        return records

    def _long_running(self, worker) -> StreamRecord:
        """The long stream's request once it decodes; its own error, verbatim, when it failed."""
        current = _decoding(worker)
        if current is not None:
            return current
        said = first_error(worker)
        if said:
            raise ModelFailed(f"model {self.model!r} refused the long request the prefill measurement runs beside: {said}")
        raise ModelFailed(f"model {self.model!r}: a long request made no tokens within 5 s")

    def _worst_tokens(self, prompt_tokens: int) -> int:
        """What the model may count for a prompt of `prompt_tokens` tokens, at worst."""
        return int(-(-prompt_tokens * self.worst_tokens_per_token // 1))

    def _longest_prompt(self) -> int:
        """The longest prompt a probe may send: half the model's context (half the assumed one where
        it is unknown, as the prefill lengths take it), counted at the worst tokens per byte."""
        return max(4, int((self.max_context or ASSUMED_CONTEXT) // 2 / self.worst_tokens_per_token))

    def _fit_context(self) -> None:
        """Shrink the prompt lengths, and the decode levels' prompt and budget, to what fits the
        model's context at the worst token count (`worst_tokens_per_token`)."""
        if not self.max_context:
            return
        s = self.settings
        longest = max(4, int((self.max_context - 2) / self.worst_tokens_per_token))
        lengths = sorted({min(length, longest) for length in s.prefill_lengths})
        prompt, output = s.prompt_tokens, s.output_tokens
        if self._worst_tokens(prompt) + output > self.max_context:
            prompt = max(1, min(prompt, int(self.max_context / 2 / self.worst_tokens_per_token)))
            output = max(1, min(output, self.max_context - self._worst_tokens(prompt)))
        if (lengths, prompt, output) != (s.prefill_lengths, s.prompt_tokens, s.output_tokens):
            self.notes.append(
                f"the bytes per token are assumed, so every prompt byte may be a token: prompts and budgets were "
                f"sized to fit the model's context of {self.max_context} tokens even then (prefill lengths "
                f"{lengths}, decode at {prompt} + {output} tokens)"
            )
            self.settings = EngineSettings(**{**s.__dict__, "prefill_lengths": lengths, "prompt_tokens": prompt,
                                              "output_tokens": output})

    def prefill(self, bpt: float) -> list[PrefillSample]:
        """At each prompt length: single requests (max_tokens 1) on an idle engine, whose time to
        first token grows with the prompt by the prefill's cost per token; then the same beside a
        long stream, whose gap that holds a single's prefill grows by the engine time it added,
        and whose next token shows whether that prefill ran inside the decode step."""
        probe_prompt = 8
        room = (self.max_context - self._worst_tokens(probe_prompt) - 1) if self.max_context else 512
        long_load = self._stream(self._request(probe_prompt, max(16, min(512, room)), bpt))
        samples = []
        for length in self.settings.prefill_lengths:
            self.update(f"prefill at {length} prompt tokens")
            inputs = self._request(length, 1, bpt)
            ns0, n0 = self._queue_totals()
            idle = [r for r in self._singles(inputs) if r.ttft_s is not None]
            ns1, n1 = self._queue_totals()
            long_workers, long_stop = long_load.start(1)
            try:
                self._long_running(long_workers[0])
                records = self._singles(inputs)
            finally:
                StreamLoad.finish(long_workers, long_stop)
            runs = [list(r.token_times) for r in long_workers[0].records]
            measured = [(grown, r) for r in records if r.ttft_s is not None and (grown := gap_growth(runs, r)) is not None]
            if not idle:
                raise ModelFailed(f"model {self.model!r}: no single {length}-token request made a token on an idle engine")
            queue_ms = (ns1 - ns0) / max(1, n1 - n0) / 1e6
            ttft = statistics.median(r.ttft_s * 1000.0 for r in idle)
            if not measured:
                # optional: an engine that does not prefill a newcomer while another stream runs (it
                # finishes one batch before the next) shows its prefill only on an idle engine
                if not any(g.measurement == "prefill beside a stream" for g in self.gaps):
                    self.gaps.append(MeasurementGap(
                        measurement="prefill beside a stream",
                        unseen=f"no single request was prefilled while a long stream ran (first at {length} tokens): "
                               "the engine may not batch continuously",
                        inferred="the prefill's engine time is the idle time to first token less Triton's queue; "
                                 "whether a prefill stalls running streams is unknown",
                    ))
                samples.append(PrefillSample(
                    prompt_tokens=length, prompt_bytes=len(prompt_of(length, bpt)), requests=len(idle),
                    ttft_ms=round(ttft, 3), queue_ms=round(queue_ms, 3), engine_ms=round(max(0.0, ttft - queue_ms), 3),
                    step_wait_ms=0.0, path_ms=0.0, lag_steps=None,
                ))
                continue
            engine = statistics.median(g for (g, _), _ in measured)
            usual = statistics.median(u for (_, u), _ in measured)
            lags = [lag for (_, u), r in measured if (lag := nearest_token_ms(runs, r)) is not None and u > 0]
            samples.append(PrefillSample(
                prompt_tokens=length, prompt_bytes=len(prompt_of(length, bpt)), requests=len(idle),
                ttft_ms=round(ttft, 3), queue_ms=round(queue_ms, 3), engine_ms=round(engine, 3),
                step_wait_ms=round(usual / 2.0, 3), path_ms=0.0,
                lag_steps=round(statistics.median(lags) / usual, 3) if lags and usual > 0 else None,
            ))
        return samples

    def decode(self, bpt: float, prefill_ms: float) -> list[DecodeSample]:
        s = self.settings
        load = self._stream(self._request(s.prompt_tokens, s.output_tokens, bpt))
        out = []
        for c in s.concurrency_levels:
            self.update(f"decode at {c} stream(s)")
            records, windows, start = self.run_level(load, c)
            end = start + sum(w.duration_s for w in windows)
            gap, n = mean_gap_ms(records, start, end)
            if gap is None:
                self.notes.append(f"decode at {c} streams: no stream finished with 3 or more tokens")
                continue
            step = decode_steps_ms(records, start, end)
            if step is None:  # no gap free of newcomers: the expected share of prefills per step
                step = decode_step_ms(gap, c, s.output_tokens, prefill_ms)
            cap = self._max_num_seqs()
            out.append(DecodeSample(concurrency=c, requests=n, mean_gap_ms=round(gap, 3), step_ms=round(step, 3),
                                    running_seen=float(cap) if cap is not None and c > cap else None))
        return out

    def _max_num_seqs(self) -> int | None:
        """The engine's running limit where its files state it: streams above it wait, so a level
        above it measures a step of that many sequences, not of its streams."""
        return self._stated().get("max_num_seqs")  # type: ignore[return-value]

    # -- all of it ------------------------------------------------------------------------------

    def measure(self) -> EngineMeasurement:
        bpt, bpt_source = self.bytes_per_token()
        words = self.text_words()
        if bpt_source.startswith("assumed"):
            self.worst_tokens_per_token = bpt
            self._fit_context()
        if self.interface.speaks_token_ids and self.interface.exclude_input_input is None:
            self.notes.append(
                f"tokens were counted from the ids in {self.interface.text_output}: streamed responses hold new ids; a model "
                "that repeats the prompt's ids in a response (TensorRT-LLM's when not streaming, without "
                "exclude_input_in_output) would have its prompt counted too, and that cannot be told from outside")
        preempt0 = self._preemptions()
        prefill = self.prefill(bpt)
        lengths = [p.prompt_tokens for p in prefill]
        # the prefill's cost per token from the idle time to first token; its fixed engine part from
        # the running stream's gap growth (what the request path cannot hold)
        idle_fixed, per_token = fit_line(lengths, [p.ttft_ms - p.queue_ms for p in prefill])
        grown_fixed, _ = fit_line(lengths, [p.engine_ms for p in prefill])
        fixed = min(grown_fixed, idle_fixed)
        in_step = prefill_runs_in_step([p.lag_steps for p in prefill])
        decode = self.decode(bpt, fixed + per_token * self.settings.prompt_tokens)
        if len(decode) < 2:
            raise RunFailed(f"model {self.model!r}: the decode step could not be measured at two concurrencies ({self.notes})")
        d_fixed, d_per_seq = fit_line([d.running_seen or d.concurrency for d in decode], [d.step_ms for d in decode])
        # an in-step prefill's first token waits for the step that decodes it alone on an idle engine
        first_step = (d_fixed + d_per_seq) if in_step else 0.0
        overhead = idle_fixed - fixed - first_step
        if overhead < 0:
            self.notes.append(
                f"the idle time to first token ({idle_fixed:.2f} ms + prompt) is below the engine time the steps "
                f"model ({fixed + first_step:.2f} ms): the request path is taken as 0"
            )
            overhead = 0.0
        prefill = [p.model_copy(update={"path_ms": round(p.ttft_ms - p.queue_ms - fixed - per_token * p.prompt_tokens - first_step, 3)})
                   for p in prefill]
        cache = probe_prefix_cache(self.grpc_url, self.model, self.interface, bpt, lengths[-2:], per_token, self.update,
                                   longest=self._longest_prompt(), salt_surplus=self.salt_surplus_tokens or 0,
                                   rounds=self.settings.prefill_repeats)
        if cache.caches is None:
            self.gaps.append(MeasurementGap(
                measurement="prefix cache", unseen=f"whether the engine caches prompt prefixes: {cache.evidence}",
                inferred="the engine's files (vLLM enable_prefix_caching, TensorRT-LLM block reuse), the spec's "
                         "engine.prefix_caching, else the backend's default",
            ))
        self.update("KV capacity")
        try:
            capacity, block, source, detail, names = self.capacity(bpt, idle_fixed + per_token * self.settings.prompt_tokens)
        except TritongenError as err:  # optional: the probe failing is a gap, the rest of the profile stands
            capacity, block, source, detail, names = None, None, None, None, []
            self.gaps.append(MeasurementGap(
                measurement="kv capacity", unseen=f"the KV capacity measurement failed: {err}",
                inferred="nothing: state `engine: {kv_capacity_tokens: N}` in the spec, or give simulate "
                         "--engine kv_capacity_tokens=N",
            ))
        else:
            if capacity is None:
                self.gaps.append(MeasurementGap(
                    measurement="kv capacity",
                    unseen="the engine exports no KV metrics and its files state no pool"
                           + ("" if self.settings.capacity_probe else " (the capacity probe was not asked for)"),
                    inferred="nothing: simulate takes the spec's engine section or --engine kv_capacity_tokens=N; "
                             + ("the probe found no level that failed" if self.settings.capacity_probe
                                else "profile with --kv-capacity-probe to measure it"),
                ))
        return EngineMeasurement(
            interface=self.interface.describe(),
            interface_kind=self.interface.kind,
            bytes_per_token=bpt,
            bytes_per_token_source=bpt_source,
            request_overhead_ms=overhead,
            prefill=prefill,
            decode=decode,
            prefill_fixed_ms=round(fixed, 4),
            prefill_ms_per_token=round(per_token, 6),
            prefill_in_step=in_step,
            idle_ttft_fit=(round(idle_fixed, 4), round(per_token, 6)),
            decode_fixed_ms=round(d_fixed, 4),
            decode_ms_per_seq=round(d_per_seq, 5),
            decode_context_tokens=self.settings.prompt_tokens + self.settings.output_tokens / 2,
            prompt_added_tokens=self.prompt_added_tokens,
            salt_surplus_tokens=self.salt_surplus_tokens,
            text_words=words,
            kv_capacity_tokens=capacity,
            kv_block_tokens=block,
            kv_capacity_source=source,
            kv_capacity_detail=detail,
            kv_policy_seen=self.policy_seen.kv_policy if self.policy_seen else None,
            kv_policy_evidence=self.policy_seen.evidence if self.policy_seen else None,
            prefix_cache=cache,
            engine_metrics=names,
            preemptions_seen=int(self._preemptions() - preempt0),
            notes=self.notes,
        )
