"""The KV-capacity half of `EngineProfiler` (tritongen.profiler.engine): how many tokens the
engine's pool holds, from its own metrics, its files, vLLM's usage gauge, or an opt-in probe.

A mixin, because it shares the engine profiler's state: `admin`, `model`, `settings`, `notes`,
`engine_args`, `update`, `_stream` and `_request`, which `EngineProfiler` sets and defines."""

from __future__ import annotations

import time

from tritongen.core.engine_inference import (ProbeRun, UsageRead, bisect_fit, capacity_from_probe, capacity_from_usage,
                                             double_until_fail, only_timing_says_no, policy_from_probe, run_fits)
from tritongen.core.engine_metrics import TRTLLM_BLOCK_TYPE, TRTLLM_KV_BLOCKS, VLLM_USAGE_GAUGES, is_out_of_memory
from tritongen.core.engine_sources import VLLM_DEFAULT_BLOCK_SIZE, EngineSourceError, vllm_stated
from tritongen.core.prometheus import kv_gauges, parse_prometheus
from tritongen.profiler.load import StreamLoad

PROBE_MAX_STREAMS = 512  # the capacity probe's last doubling; an engine that holds this many is not bracketed
VLLM_CACHE_INFO = "vllm:cache_config_info"  # vLLM's own server: labels num_gpu_blocks and block_size


class EngineCapacity:
    policy_seen = None  # the KV policy the capacity probe saw (core.engine_inference.PolicySeen), if it ran
    # -- KV capacity ----------------------------------------------------------------------------

    def _families(self) -> list:
        """This model's samples (and those with no model label, e.g. an engine's server-wide gauges)."""
        text = self.admin.metrics()
        samples = parse_prometheus(text) if text else []
        return [x for x in samples if x.labels.get("model", self.model) == self.model]

    def capacity(self, bpt: float, prefill_ms: float = 0.0) -> tuple[int | None, int | None, str | None, str | None, list[str]]:
        """(capacity tokens, block tokens, source, detail, engine metric families seen).
        `prefill_ms`: the idle time to first token of the probe's prompt, which the probe allows
        streams sent together to stagger by."""
        samples = self._families()
        names = sorted({s.name for s in samples if s.name.startswith(("vllm:", "nv_trt_llm_")) or "_kv_" in s.name})
        trt = {s.labels.get(TRTLLM_BLOCK_TYPE): s.value for s in samples if s.name == TRTLLM_KV_BLOCKS}
        if trt.get("max") and trt.get("tokens_per"):
            tokens = int(trt["max"] * trt["tokens_per"])
            return tokens, int(trt["tokens_per"]), "trt-llm metrics", f"{trt['max']:.0f} blocks x {trt['tokens_per']:.0f} tokens", names
        gauges = kv_gauges(samples, self.model)
        if gauges.blocks_total and gauges.block_tokens:
            return (gauges.blocks_total * gauges.block_tokens, gauges.block_tokens, "model metrics",
                    f"{gauges.blocks_total} blocks x {gauges.block_tokens} tokens (*_kv_blocks_total)", names)
        info = next((s for s in samples if s.name == VLLM_CACHE_INFO), None)
        if info is not None and info.labels.get("num_gpu_blocks", "").isdigit() and info.labels.get("block_size", "").isdigit():
            blocks, size = int(info.labels["num_gpu_blocks"]), int(info.labels["block_size"])
            if blocks and size:
                return blocks * size, size, "vllm metrics", f"{VLLM_CACHE_INFO}: {blocks} blocks x {size} tokens", names
        files = self._capacity_from_files()
        if files is not None:
            return (*files, names)
        if any(n in VLLM_USAGE_GAUGES for n in names):
            found = self._vllm_capacity(bpt)
            if found is not None:
                return found[0], VLLM_DEFAULT_BLOCK_SIZE, "vllm metrics", found[1], names
        if self.settings.capacity_probe:
            found = self._probe(bpt, prefill_ms / 1000.0)
            if found is not None:
                return found[0], None, "capacity probe", found[1], names
        return None, None, None, None, names

    def _stated(self) -> dict[str, object]:
        """What the engine's own files state (vLLM's model.json, where the profile sees the
        repository), read as simulate's resolver reads them; nothing where a value is no count."""
        if not self.engine_args:
            return {}
        try:
            return vllm_stated(self.model, self.engine_args)
        except EngineSourceError:
            return {}

    def _capacity_from_files(self):
        """The pool the engine's own files fix: `num_gpu_blocks_override` x `block_size`."""
        stated = self._stated()
        blocks = stated.get("kv_pool_blocks")
        if not blocks:
            return None
        size = stated.get("kv_block_tokens")
        if not size:
            size = VLLM_DEFAULT_BLOCK_SIZE
            self.notes.append(f"model.json sets no block_size: vLLM's default {size} assumed")
        return blocks * size, size, "engine files", f"model.json: num_gpu_blocks_override {blocks} x block_size {size}"

    def _usage(self) -> float | None:
        for s in self._families():
            if s.name in VLLM_USAGE_GAUGES:
                return s.value
        return None

    def _settled_usage(self, timeout_s: float = 10.0) -> float:
        """The usage gauge once the engine let go of earlier, cancelled streams (0), or after `timeout_s`:
        a busy engine frees their blocks steps later, and the probe counted them as its own (the vLLM
        stand-in's pool read 1,493 of 2,688 tokens beside another test module, 2026-12-05)."""
        deadline, usage = time.monotonic() + timeout_s, self._usage() or 0.0
        while usage > 0 and time.monotonic() < deadline:
            time.sleep(0.05)
            usage = self._usage() or 0.0
        return usage

    def _vllm_capacity(self, bpt: float, block: int = VLLM_DEFAULT_BLOCK_SIZE) -> tuple[int, str] | None:
        """Hold streams whose prompts fill exactly 4 blocks and read the usage gauge while each
        makes its next few tokens: every stream then holds exactly 5 blocks (its 5th fills while it
        makes tokens 2 to block + 1), so capacity = streams x 5 / usage, whatever the client's lag
        (core.engine_inference.capacity_from_usage, which also allows for the gauge's own lag).
        vLLM's default block size (16): the metric does not say the block size."""
        s = self.settings
        streams = max(s.concurrency_levels)
        prompt = 4 * block
        load = self._stream(self._request(prompt, 4 * block, bpt))
        tokens = None
        for _attempt in range(3):
            before = self._settled_usage()  # what the probe's streams add to it is theirs
            reads: list[UsageRead] = []
            workers, stop = load.start(streams, limit=1, together=True)
            try:
                deadline = time.monotonic() + 30.0
                while any(w.is_alive() for w in workers) and time.monotonic() < deadline:
                    counts = [len(w.current.token_times) for w in workers if w.current is not None]
                    if len(counts) < streams or min(counts) < 2:
                        time.sleep(0.002)
                        continue
                    usage = self._usage()
                    after = tuple(len(w.current.token_times) for w in workers if w.current is not None)
                    if usage is not None and usage >= 0.98:  # the pool is smaller: it preempts
                        streams = max(1, streams // 2)
                        break
                    if max(after) > block // 2 + 2:  # past the window: a stream may have taken its 6th block
                        break
                    if usage is not None:
                        reads.append(UsageRead(usage - before, after))
                    time.sleep(0.002)
            finally:
                StreamLoad.finish(workers, stop)
            tokens = capacity_from_usage(reads, streams, block)
            if tokens is not None:
                break
        if tokens is None:
            self.notes.append("vLLM metrics: the usage gauge could not be read while every stream held 5 blocks")
            return None
        return tokens, f"kv_cache_usage_perc while {streams} streams held 5 blocks of {block} each"

    def _preemptions(self) -> float:
        return sum(s.value for s in self._families() if s.name == "vllm:num_preemptions_total")

    def _probe(self, bpt: float, prefill_s: float) -> tuple[int, str] | None:
        """Raise the concurrency of long requests sent together (doubling, then bisecting) until
        one level does not run whole: an out-of-memory answer, a counted preemption, or, where the
        engine counts none, a stream parked for many steps (`core.engine_inference.run_fits`)."""
        s = self.settings
        prompt, output = s.prompt_tokens, s.output_tokens
        load = self._stream(self._request(prompt, output, bpt))
        counted = self._counter("vllm:num_preemptions_total") is not None
        runs: list[ProbeRun] = []

        def fits(streams: int) -> bool:
            self.update(f"KV capacity probe: {streams} streams")
            run = measured(streams)
            if only_timing_says_no(run):
                self.update(f"KV capacity probe: {streams} streams again (a stream parked)")
                run = measured(streams)
            runs.append(run)
            return run_fits(run)

        def measured(streams: int) -> ProbeRun:
            before = self._preemptions()
            workers, stop = load.start(streams, limit=1, together=True)
            for w in workers:
                w.join(60.0)
            StreamLoad.finish(workers, stop)
            records = [r for w in workers for r in w.records]
            errors = [r.error for r in records if r.error and r.error != "stopped"]
            oom = [r for r in records if r.error and r.error != "stopped" and is_out_of_memory(r.error)]
            return ProbeRun(
                streams=streams, prompt=prompt, output=output,
                token_times=tuple(tuple(r.token_times) for r in records if r.token_times),
                starts=tuple(r.start for r in records if r.token_times),
                out_of_memory=any(is_out_of_memory(e) for e in errors),
                oom_after_tokens=any(bool(r.token_times) for r in oom) if oom else None,
                preemptions=(self._preemptions() - before) if counted else None,
                prefill_s=prefill_s,
            )

        fit, failed = double_until_fail(fits, PROBE_MAX_STREAMS)
        if not fit or failed is None:
            return None
        bisect_fit(fits, fit, failed, slack=lambda low: max(1, low // 8))
        verdict = capacity_from_probe(runs)
        self.policy_seen = policy_from_probe(runs)
        return None if verdict is None else (verdict.capacity_tokens, verdict.detail)
