"""The limits that move with what admission sees: the adaptive concurrency limit (memory and Triton's
queueing delay) and the share of an LLM its lower classes may fill (the top class's first tokens).
An engine that queues has a third, its own law (sidecar/engine_concurrency.py). Pure, clock passed in.
"""

from __future__ import annotations

import math
from collections import deque

from tritongen.core.admission_tuning import (
    SHARE_DECREASE,
    SHARE_INCREASE,
    SHARE_MIN_SAMPLES,
    SHARE_QUANTILE,
    SHARE_SAMPLES_KEPT,
    SHARE_STEP_S,
    SHARE_WINDOW_S,
)
from tritongen.core.sidecar_policy.sections import ConcurrencyPolicy, ModelPolicy
from tritongen.core.sidecar_policy.tuning import LowerSharePolicy


def engine_queues(model: ModelPolicy) -> bool:
    """An LLM whose engine grows and preempts (never kills): its in-flight limit follows the engine
    (EngineConcurrency) and no KV is reserved for it."""
    return model.kv is not None and model.kv.kv_policy == "grow_preempt" and model.max_inflight is not None


def pool_blocks(model: ModelPolicy) -> int | None:
    """The engine's pool in whole blocks: no engine runs more sequences than that."""
    kv = model.kv
    if kv is None or not kv.engine_pool_bytes or kv.bytes_per_token <= 0:
        return None
    return max(1, int(kv.engine_pool_bytes // (kv.block_tokens * kv.bytes_per_token))) * model.engines


class AdaptiveLimit:
    """Slides between [min, max]: down (multiplicatively) when the memory watermark or Triton's
    queueing delay is high, up (additively) when both are low and requests are waiting for it;
    nothing in between (the band between low and high is the hysteresis), at most one change per
    interval, and no step up for `increase_hold_ms` after a step down."""

    def __init__(self, cfg: ConcurrencyPolicy, now: float) -> None:
        self.cfg = cfg
        self.value = cfg.initial if cfg.initial is not None else cfg.max
        self._last_change = now
        self._last_decrease = -math.inf

    def reconfigure(self, cfg: ConcurrencyPolicy) -> None:
        self.cfg = cfg
        self.value = min(max(self.value, cfg.min), cfg.max)

    def update(self, now: float, watermark: float, queue_delay_s: float | None, demand: bool) -> str:
        """Returns 'down', 'up' or 'hold'."""
        cfg = self.cfg
        if (now - self._last_change) * 1000 < cfg.adjust_interval_ms:
            return "hold"
        delay_ms = None if queue_delay_s is None else queue_delay_s * 1000
        high = watermark >= cfg.high_watermark or (delay_ms is not None and delay_ms >= cfg.queue_delay_high_ms)
        low = watermark <= cfg.low_watermark and (delay_ms is None or delay_ms <= cfg.queue_delay_low_ms)
        if high and self.value > cfg.min:
            self.value = max(cfg.min, min(self.value - 1, math.floor(self.value * cfg.decrease_factor)))
            self._last_change = self._last_decrease = now
            return "down"
        held = (now - self._last_decrease) * 1000 < cfg.increase_hold_ms
        if low and demand and not held and self.value < cfg.max:
            self.value = min(cfg.max, self.value + cfg.increase_step)
            self._last_change = now
            return "up"
        return "hold"


class LowerShare:
    """How much of one LLM's rooms its lower classes may fill, from the top class's latency.

    A decoupled model takes every request at once, so Triton's priority levels never reach its
    engine, and an engine busy with batch sequences is slow to start an interactive one (each step
    takes longer, and the prefill waits for the step). Reserving a fixed share for the top class
    would waste it when there is no interactive traffic; so the share moves: down
    (multiplicatively) while the top class's recent first-token latency nears its target, back up
    (additively) when it is well inside it or the top class is quiet. The engine keeps all its
    room whenever interactive requests are served in time, which is what keeps goodput.

    The latency judged is arrival to first token as the sidecar sees it (queue wait included).
    The share never goes below the policy's `admission.lower_share.min` (half by default): what
    lower classes lose is throughput, and the engine must stay busy (issue 15: never fewer requests
    served than without the sidecar). `cfg` is the policy's, replaced when a reload changes it."""

    def __init__(self, cfg: LowerSharePolicy) -> None:
        self.cfg = cfg
        self.value = 1.0
        self._samples: deque[tuple[float, float]] = deque(maxlen=SHARE_SAMPLES_KEPT)  # (when, first-token latency)
        self._last_move = -math.inf

    def observe(self, now: float, latency_s: float) -> None:
        self._samples.append((now, latency_s))

    def recent_p90(self, now: float) -> float | None:
        while self._samples and self._samples[0][0] < now - SHARE_WINDOW_S:
            self._samples.popleft()
        if len(self._samples) < SHARE_MIN_SAMPLES:
            return None
        ordered = sorted(latency for _, latency in self._samples)
        return ordered[min(len(ordered) - 1, int(SHARE_QUANTILE * len(ordered)))]

    def update(self, now: float, target_s: float) -> str:
        if now - self._last_move < SHARE_STEP_S:
            return "hold"
        cfg = self.cfg
        p90 = self.recent_p90(now)
        if p90 is not None and p90 > cfg.high * target_s and self.value > cfg.min:
            self.value = max(cfg.min, self.value * SHARE_DECREASE)
            self._last_move = now
            return "down"
        if (p90 is None or p90 < cfg.low * target_s) and self.value < 1.0:
            self.value = min(1.0, self.value + SHARE_INCREASE)
            self._last_move = now
            return "up"
        return "hold"
