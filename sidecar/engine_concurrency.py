"""How many requests an engine that queues may hold at once, found from what it answers. Pure.

An engine that grows its KV cache and preempts (vLLM, TensorRT-LLM's guaranteed_no_evict) never
runs out of memory: past its own sequence limit it queues requests inside itself, where the sidecar
can neither order them by class nor refuse the ones that cannot make their target. So the sidecar
holds what the engine runs at once, and one more (a slot the engine frees is taken at its next step,
not after a round trip); the rest wait in the sidecar's queue. The policy's figure (vLLM's
max_num_seqs) is only the start: a policy may be rendered from other files or a pool measured wrong,
so the limit follows what the engine shows on the streams the sidecar sees:

* A request still without a first token `wait_steps` decode steps (the inter-token gap) past the
  engine's baseline time to first token waits for a slot inside the engine: the engine is full, and
  what it runs is the requests past their first token. The limit goes to that count plus one, by at
  most `decrease_fraction` per judgement, after `full_judgements` in a row, and never below what
  the engine ran with none late in the last `proven_judgements` (`proven`): on a CPU engine a
  prefill takes several steps, prompts admitted together make the last of them late with room for
  all, and the law without that floor fell to 5 at 0.7x of the real vLLM's capacity (median 14) and
  to 3 at 1.5x (bench_llm_guard, 2026-12-03). Each knob's why is on QueueingEnginePolicy.
* While requests wait in the sidecar for the limit and none is late, the engine starts what it
  gets: the limit grows by a fraction of itself, by one request for `KNEE_STEPS` moves after the
  engine first showed it full. Growth needs that demand; without it the limit drops only on two
  late requests (one alone may be a long prompt's prefill).
* Never more than the engine's pool holds blocks (each running sequence holds one), when known.

The wait is judged in engine steps, not milliseconds, so the law holds on any device. Engines that
kill when their pool runs dry are not governed by this: each request's footprint is reserved
against the pool (sidecar/admission.py).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from tritongen.core.sidecar_policy.sections import FIRST_TOKENS_KEPT, QueueingEnginePolicy

KNEE_STEPS = 3  # moves of one request up after the engine showed it full, before fractions again


@dataclass
class EngineConcurrency:
    """The in-flight limit of one model whose engine queues; `limit` is what admission reads."""

    cfg: QueueingEnginePolicy
    start: int  # the policy's figure (max_inflight): what the engine is said to run
    ceiling: int | None = None  # the engine's pool in blocks, when known
    floor: int = 1
    value: float = 0.0
    last: str = "hold"  # the last judgement and why, for status
    signals: dict[str, float | None] = field(default_factory=dict)
    _ttft: deque[float] = field(default_factory=lambda: deque(maxlen=FIRST_TOKENS_KEPT))  # admission -> first token, s
    _gaps: deque[float] = field(default_factory=lambda: deque(maxlen=256))  # mean inter-token gap per stream, s
    _last_judged: float = -math.inf  # when the last judgement was made
    _ups_in_row: int = 0
    _full_seen: bool = False
    _running_held: dict[int, float] = field(default_factory=dict)  # seconds at each count past first token, this interval
    _running_level: tuple[int, float] | None = None  # the count past first token now, and since when
    _proven: deque[int] = field(default_factory=deque)  # what ran in each recent judgement with none late
    _full_in_row: int = 0  # judgements in a row that found the engine full

    def __post_init__(self) -> None:
        self.value = self._bounded(float(self.start + 1))

    @property
    def limit(self) -> int:
        return max(self.floor, math.floor(self.value))

    def _bounded(self, value: float) -> float:
        top = self.ceiling if self.ceiling is not None else math.inf
        return min(max(float(self.floor), value), float(top))

    def observe_first_token(self, upstream_ttft_s: float) -> None:
        self._ttft.append(upstream_ttft_s)

    def observe_running(self, running: int, now: float) -> None:
        """The model's requests past their first token, each time that count changes."""
        if self._running_level is not None:
            level, since = self._running_level
            self._running_held[level] = self._running_held.get(level, 0.0) + max(0.0, now - since)
        self._running_level = (running, now)

    def _ran(self, now: float, running: int) -> int:
        """What the engine ran since the last judgement: the most past their first token for at least
        `running_share` of that time (QueueingEnginePolicy.running_share says why); `running`, the
        count now, when nothing was observed."""
        self.observe_running(running, now)
        held, self._running_held = self._running_held, {}
        total = sum(held.values())
        covered = 0.0
        for level in sorted(held, reverse=True):
            covered += held[level]
            if covered >= self.cfg.running_share * total > 0:
                return level
        return running

    def observe_gap(self, gap_s: float) -> None:
        if gap_s > 0:
            self._gaps.append(gap_s)

    def due(self, now: float) -> bool:
        """Whether `update` would judge now (at most once per interval)."""
        return (now - self._last_judged) * 1000 >= self.cfg.interval_ms

    def late_after_s(self) -> float | None:
        """Seconds after admission past which a request without a first token waits for a slot
        inside the engine; None until enough first tokens and token gaps were measured."""
        if len(self._ttft) < self.cfg.min_samples or not self._gaps:
            return None
        baseline = _quantile(self._ttft, self.cfg.baseline_quantile)
        return baseline + self.cfg.wait_steps * _quantile(self._gaps, 0.5)

    def update(self, now: float, demand: bool, pending_ages: Sequence[float], running: int) -> str:
        """One judgement per interval: 'down', 'up' or 'hold' (and why, in `last`).

        `demand`: requests of the model waited in the sidecar (or were refused) for this limit since
        the last judgement. `pending_ages`: how long each of the model's requests at the engine that
        has no first token yet has been there. `running`: its requests past their first token now;
        the engine is judged full at what ran since the last judgement (`_ran`), not at this
        instant's count."""
        cfg = self.cfg
        if not self.due(now):
            return "hold"
        late_after = self.late_after_s()
        if late_after is None:
            self.last = "hold: too few first tokens and token gaps measured yet"
            return "hold"
        # One judgement per interval, whatever it finds: what ran since the last one, the history of
        # what ran with none late, and the run of full judgements all count intervals, not ticks.
        self._last_judged = now
        late = sum(1 for age in pending_ages if age > late_after)
        running = self._ran(now, running)
        self._proven.append(running if late == 0 else 0)
        while len(self._proven) > cfg.proven_judgements:
            self._proven.popleft()
        proven = max(self._proven)
        self.signals = {"late_after_s": late_after, "late_at_engine": float(late), "running": float(running),
                        "proven": float(proven)}
        # Without demand a lone late request may be a long prompt's prefill; two are the engine's queue.
        full = late >= (1 if demand else 2)
        self._full_in_row = self._full_in_row + 1 if full else 0
        if not demand and not full:
            self.last = "hold: nothing waited for the limit"
            return "hold"
        before = self.value
        if full and self._full_in_row < cfg.full_judgements:
            self.last = (f"hold: {late} request(s) late at the engine while {running} ran; a full engine keeps them "
                         "late at the next judgement, a clump of prefills does not")
            return "hold"
        if full:
            # Full at what runs now: hold that, and one more to take the next free slot at once.
            self._full_seen, self._ups_in_row = True, 0
            step_floor = self.value * (1.0 - cfg.decrease_fraction)
            self.value = self._bounded(min(self.value, max(float(running + 1), float(proven + 1), step_floor)))
            if self.value < before:
                self.last = (f"down: {late} request(s) waited at the engine past {late_after * 1000:.0f} ms for a "
                             f"slot while {running} ran")
                return "down"
            self.last = (f"hold: the engine is full at {running} running" if proven <= running else
                         f"hold: {late} late, but the engine ran {proven} with none late lately")
            return "hold"
        self._ups_in_row += 1
        creep = self._full_seen and self._ups_in_row <= KNEE_STEPS
        self.value = self._bounded(self.value + (1.0 if creep else max(1.0, self.value * cfg.increase_fraction)))
        if self.value > before:
            self.last = "up: requests waited here while the engine started all it got"
            return "up"
        self.last = "hold at the pool's bound"
        return "hold"

    def status(self) -> dict[str, object]:
        return {"limit": self.limit, "ceiling": self.ceiling, "last": self.last,
                **{k: (round(v, 4) if v is not None else None) for k, v in self.signals.items()}}


def _quantile(values: deque[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(q * len(ordered))))]
