"""The sidecar's admission state: pure, single-threaded, clock injected. No asyncio, no I/O.
One file (over 1,000 lines): the admission state is owned by one task and every decision reads all of
it; seams if it is ever split: reasons and types / the adaptive limit / the state.

The asyncio code in `sidecar/controller.py` owns one `AdmissionState` and calls it; everything that
decides (admit, queue or refuse; who leaves the queue next; when the concurrency limit moves; what
Retry-After says) lives here so it can be tested exhaustively with a fake clock.

Memory model. A request costs
  * `kv_bytes`: (prompt + output tokens) x KV bytes per token, rounded up to whole blocks; held for
    the request's life; it counts against the model's quota (its KV pool) and, for engines that do
    not pre-allocate their pool, against the device too;
  * `prefill_bytes`: the profiled prefill peak for its prompt length, held on the device only
    until the first token comes back (`end_prefill`);
  * `request_bytes`: a classic model's per-request memory, held on the device for its life.

Limits ("rooms"). Each request is checked against rooms; a room has a capacity, what is already
used of it, and what this request needs:
  * `concurrency_limit`: the adaptive in-flight limit (shared by all models);
  * `model_concurrency_quota:<m>` and `model_memory_quota:<m>`: the model's own quotas;
  * `tenant_concurrency_quota:<t>` and `tenant_memory_quota:<t>`: the tenant's quotas (its own, or
    the policy's `default_tenant` quota for a tenant it does not list), over all models; the
    memory quota counts every byte the tenant's requests hold (KV, prefill, request bytes,
    lingering reservations);
  * `headroom:<scope>`: live headroom of a device (`gpu0`, `cpu`) or a model's KV pool
    (`pool:<m>`), from the latest `HeadroomSnapshot`, minus the safety pad on devices.
A class may fill only `budget_fraction` of every room, which keeps room for higher classes.

Live readings count what the sidecar reserved once: a reading taken while the sidecar held R
bytes on a scope that shows U bytes used means `max(0, U - R)` bytes are held by something else,
so capacity = total - pad - max(0, U - R). Static readings (the plan's arithmetic) do not include
reservations: capacity = total - pad - static used.

Waiting or refused. A request that cannot be admitted at once waits only if it is expected to
leave the queue within its class's wait (its position / the model's drain rate, the top class's
arrivals passing the lower classes). Below the top class "expected" means at the wait's 98th
percentile (WAIT_Z), not its mean: a request queued on the mean near the limit waits its whole
budget about half the time and is then refused late, which tells the client nothing sooner than a
timeout would. The top class waits on the mean (its budget is a few departures long).

Queueing is strict priority with aging: a waiting request is promoted one level for every
`starvation_guard_ms` it has waited, and requests of equal effective level leave in arrival order.
A request blocked by a shared room (device headroom, the concurrency limit) holds everything behind
it, so a large request cannot starve; one blocked by its own model's quota only holds its model.

Tenants. A tenant over its quota is treated the way a model over its quota is: its request waits
in the queue (subject to the class's queue cap, its longest wait and the wait estimate, which
refuse it with 429 naming the tenant limit), and holds only the tenant's own requests behind it,
never another tenant's; so one tenant at its quota cannot block the others. Two approximations:
the wait estimate is the model's (a tenant's own drain rate is not measured), and a tenant's
waiting requests count against its class's queue cap like any other (there is no per-tenant
queue cap, so a tenant that floods the queue can fill its class's cap). A request that could
never fit its tenant's memory quota (its class's share of it) is refused at once (413), and a
class the tenant may not send is refused at once (403). Per-tenant counts are keyed by the name
the request carries and dropped when they reach zero, so tenants the policy does not list cost
nothing once their requests are gone; a reloaded policy re-reads the quotas and keeps the counts.
"""

from __future__ import annotations

import math
from collections import defaultdict, deque
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from sidecar.engine_concurrency import EngineConcurrency
from sidecar.prompt_ratio import LearnedRatio
from sidecar.policy import (
    DEFAULT_TENANT,
    OTHER_TENANTS,
    ClassPolicy,
    ConcurrencyPolicy,
    ModelPolicy,
    SidecarPolicy,
    TenantQuota,
)

Clock = Callable[[], float]

DRAIN_WINDOW_S = 10.0
ARRIVAL_WINDOW_S = 5.0  # arrival rates per level (expected_wait_s), over this window
# A request waits only if it will leave the queue within its class's wait with high confidence:
# the wait's quantile at z standard deviations (`_wait_from`), not its mean. Queued at the mean, half
# of those near the limit would wait their whole budget and then be refused late.
WAIT_Z = 2.0
_Z_PERCENTILE = 100 * 0.5 * (1 + math.erf(WAIT_Z / math.sqrt(2)))  # 97.7 for z = 2, for messages
ARRIVALS_KEPT = 2048  # at most this many of the window's arrivals per model (the oldest go first)
DRAIN_MIN_SAMPLES = 2
SEQ_LEN_ALPHA = 0.2
SERVICE_ALPHA = 0.2
LATENCY_SAMPLES = 64
LATENCY_MIN_SAMPLES = 5
LATENCY_QUANTILE = 0.9
# The share of an LLM's rooms its lower classes may fill (LowerShare): judged on the top class's
# first-token latency over the last window, at most one move per step.
SHARE_WINDOW_S = 3.0
SHARE_STEP_S = 0.5
SHARE_MIN = 0.5  # lower classes keep at least half their room: throughput is what they lose
SHARE_HIGH = 0.8  # top class's recent P90 first-token latency above this share of its target: shrink
SHARE_LOW = 0.5  # below this (or no top-class traffic): grow back
SHARE_DECREASE = 0.7
SHARE_INCREASE = 0.1


_LIMIT_GROUP = ("limit", "llm")  # the queue group the adaptive concurrency limit holds


def _engine_queues(model: ModelPolicy) -> bool:
    """An LLM whose engine grows and preempts (never kills): its in-flight limit follows the engine
    (EngineConcurrency) and no KV is reserved for it."""
    return model.kv is not None and model.kv.kv_policy == "grow_preempt" and model.max_inflight is not None


def _pool_blocks(model: ModelPolicy) -> int | None:
    """The engine's pool in whole blocks: no engine runs more sequences than that."""
    kv = model.kv
    if kv is None or not kv.engine_pool_bytes or kv.bytes_per_token <= 0:
        return None
    return max(1, int(kv.engine_pool_bytes // (kv.block_tokens * kv.bytes_per_token))) * model.engines


class Action(str, Enum):
    ADMIT = "admit"
    QUEUE = "queue"
    REJECT = "reject"


# Reasons a request is refused (Decision.reason); the proxies map them to status codes.
EXCEEDS_BUDGET = "exceeds_budget"  # can never fit this class's share of a static limit
EXCEEDS_CONTEXT = "exceeds_context"  # asks for more tokens than the model's context holds
CLASS_NOT_SERVED = "class_not_served"
TENANT_CLASS_NOT_ALLOWED = "tenant_class_not_allowed"  # the tenant may not send this class
QUEUE_FULL = "queue_full"
QUEUE_WAIT = "queue_wait_exceeds_target"  # the estimated wait is longer than the class may wait
QUEUE_TIMEOUT = "queue_timeout"


@dataclass(frozen=True)
class Cost:
    """What one request holds while it runs. See the module docstring for the three parts."""

    kv_bytes: int = 0
    prefill_bytes: int = 0
    request_bytes: int = 0
    tokens: int = 0  # prompt + output tokens the KV cost was computed for (LLMs)
    prompt_tokens: int = 0
    prompt_bytes: int = 0  # UTF-8 bytes of the prompts the request states (LLMs; the learnt token ratio)
    sequences: int = 1
    # Prompt tokens of each sequence whose prompt the request states (LLMs; the prompt-length
    # histogram). A prompt the sidecar cannot read (shared memory) is charged a full context
    # above but is not listed here: it is not a measured length.
    prompt_lengths: tuple[int, ...] = ()
    # (reason, detail) when the request can never run (cost.py): refused at once, never queued.
    never: tuple[str, str] | None = None

    @property
    def total_bytes(self) -> int:
        return self.kv_bytes + self.prefill_bytes + self.request_bytes


@dataclass(frozen=True)
class Request:
    id: Hashable
    model: str
    klass: str
    cost: Cost
    tenant: str = DEFAULT_TENANT


@dataclass(frozen=True)
class Room:
    """One limit as seen by one request: `need` must fit in `capacity - used`."""

    name: str
    unit: str  # "bytes" | "requests"
    used: float
    capacity: float
    need: float
    shared: bool  # True: blocks every model behind it in the queue; False: see `holds`
    static: bool  # capacity does not change with live readings
    holds: str = "model"  # not shared: whose requests wait behind one it blocks ("model", "tenant", "limit")

    @property
    def free(self) -> float:
        return self.capacity - self.used

    @property
    def fits(self) -> bool:
        return self.need <= self.free


@dataclass(frozen=True)
class Verdict:
    ok: bool
    blocked: Room | None
    headroom_bytes: float | None  # the smallest free memory among the rooms


def _wait_from(terms: tuple[float, float], position: int, z: float = 0.0) -> float:
    """The wait at `position` from `AdmissionState._wait_terms`: the mean, or with `z` > 0 a high
    quantile of it. Leaving takes `n` = position + places departures at `rate`; their sum has mean
    n / rate and spread sqrt(n) / rate (departures roughly Poisson), so (n + z sqrt(n)) / rate."""
    places, rate = terms
    if rate <= 0:
        return math.inf
    n = position + places
    return (n + z * math.sqrt(n)) / rate


def decide(cost: Cost, headroom: Sequence[Room], inflight: Sequence[Room]) -> Verdict:
    """The admission rule itself: the request fits when every memory room (`headroom`) and every
    concurrency room (`inflight`) has room for what it needs. The first room that does not is
    named; concurrency is checked first (it is the cheaper limit to wait for)."""
    free_bytes = min((r.free for r in headroom), default=None)
    if cost.total_bytes < 0:
        raise ValueError(f"a cost cannot be negative: {cost}")
    for room in (*inflight, *headroom):
        if not room.fits:
            return Verdict(False, room, free_bytes)
    return Verdict(True, None, free_bytes)


@dataclass(frozen=True)
class Decision:
    action: Action
    request_id: Hashable
    reason: str  # "admitted", "queued", a limit name, or one of the refusal reasons above
    limit: str | None = None  # the limit that was hit
    limit_capacity: float | None = None
    limit_used: float | None = None
    headroom_bytes: float | None = None
    retry_after_s: float | None = None
    queue_position: int | None = None
    waited_s: float = 0.0
    detail: str = ""

    @property
    def admitted(self) -> bool:
        return self.action is Action.ADMIT


@dataclass(frozen=True)
class Reading:
    """Memory of one scope ('gpu0', 'cpu', 'pool:<model>') from one source."""

    scope: str
    total_bytes: int
    used_bytes: int
    source: str
    live: bool = True


@dataclass(frozen=True)
class HeadroomSnapshot:
    """What the headroom sources said at `taken_at` (the owner's clock)."""

    taken_at: float
    readings: Mapping[str, Reading] = field(default_factory=dict)
    failures: Mapping[str, str] = field(default_factory=dict)  # source -> why it failed
    gpu_utilization: Mapping[str, float] = field(default_factory=dict)  # device id -> 0..1
    queue_delay_s: Mapping[str, float] = field(default_factory=dict)  # model -> Triton's mean queue time
    prompt_tokens_total: Mapping[str, float] = field(default_factory=dict)  # model -> the engine's prompt-token counter


# ------------------------------------------------------------------------------------------------
# The adaptive concurrency limit


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
    The share never goes below half: what lower classes lose is throughput, and the engine must
    stay busy (issue 15: never fewer requests served than without the sidecar)."""

    def __init__(self) -> None:
        self.value = 1.0
        self._samples: deque[tuple[float, float]] = deque(maxlen=256)  # (when, first-token latency)
        self._last_move = -math.inf

    def observe(self, now: float, latency_s: float) -> None:
        self._samples.append((now, latency_s))

    def recent_p90(self, now: float) -> float | None:
        while self._samples and self._samples[0][0] < now - SHARE_WINDOW_S:
            self._samples.popleft()
        if len(self._samples) < 3:
            return None
        ordered = sorted(latency for _, latency in self._samples)
        return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]

    def update(self, now: float, target_s: float) -> str:
        if now - self._last_move < SHARE_STEP_S:
            return "hold"
        p90 = self.recent_p90(now)
        if p90 is not None and p90 > SHARE_HIGH * target_s and self.value > SHARE_MIN:
            self.value = max(SHARE_MIN, self.value * SHARE_DECREASE)
            self._last_move = now
            return "down"
        if (p90 is None or p90 < SHARE_LOW * target_s) and self.value < 1.0:
            self.value = min(1.0, self.value + SHARE_INCREASE)
            self._last_move = now
            return "up"
        return "hold"


# ------------------------------------------------------------------------------------------------
# The state


@dataclass
class _Reservation:
    request: Request
    admitted_at: float
    kv_scopes: tuple[str, ...]
    device_scopes: tuple[str, ...]
    kv_bytes: int
    extra_bytes: int  # prefill + request bytes: device memory outside the KV pool
    prefill_bytes: int
    kv_on_device: bool  # the engine does not pre-allocate its pool: KV bytes are device bytes too
    lingering_until: float | None = None
    first_response_at: float | None = None
    arrived_at: float = 0.0  # when the sidecar first saw it (admitted_at unless it queued)

    @property
    def device_bytes(self) -> int:
        return self.extra_bytes + (self.kv_bytes if self.kv_on_device else 0)

    @property
    def held_bytes(self) -> int:
        return self.kv_bytes + self.extra_bytes


@dataclass
class _Waiting:
    request: Request
    enqueued_at: float
    deadline: float
    priority: int
    seq: int
    # The groups this request holds and is held by (`_groups`): asked for every waiting request on
    # every pass of the queue, so worked out once (again on a policy reload).
    groups: tuple[tuple[str, str], ...] = ()


class _Queue(dict):
    """The waiting requests by id, in arrival order (a request is put in once, when it is queued).
    `rev` counts every change, so a cached walk of the queue (`AdmissionState._order`) knows it is
    stale without each place that adds or removes a request having to say so."""

    rev = 0

    def __setitem__(self, key: Hashable, value: _Waiting) -> None:
        self.rev += 1
        super().__setitem__(key, value)

    def __delitem__(self, key: Hashable) -> None:
        self.rev += 1
        super().__delitem__(key)

    def pop(self, key: Hashable, *default: Any) -> Any:
        self.rev += 1
        return super().pop(key, *default)

    def popitem(self) -> tuple[Hashable, _Waiting]:
        self.rev += 1
        return super().popitem()

    def clear(self) -> None:
        self.rev += 1
        super().clear()

    def update(self, *args: Any, **kwargs: Any) -> None:
        self.rev += 1
        super().update(*args, **kwargs)

    def setdefault(self, key: Hashable, default: Any = None) -> Any:
        self.rev += 1
        return super().setdefault(key, default)


@dataclass(frozen=True)
class Events:
    """What happened to queued requests since the last `take_events()`."""

    granted: list[Decision]
    expired: list[Decision]


class AdmissionState:
    def __init__(self, policy: SidecarPolicy, clock: Clock) -> None:
        self._clock = clock
        self.policy = policy
        self._index()
        self.limit = AdaptiveLimit(policy.concurrency, clock())
        self._reservations: dict[Hashable, _Reservation] = {}
        self._waiting: _Queue = _Queue()
        # `_order`'s last answer, valid while the instant, the queue (its `rev`) and the policy are
        # the same: a tick walks the queue twice (the hopeless, then the pump), and under overload
        # the queue holds hundreds of requests.
        self._order_cache: tuple[float, int, list[_Waiting]] | None = None
        self._reserved_scope: dict[str, int] = defaultdict(int)
        self._reserved_kv: dict[str, int] = defaultdict(int)
        self._inflight_model: dict[str, int] = defaultdict(int)
        self._started_model: dict[str, int] = defaultdict(int)  # of those, past their first response
        self._sequences_model: dict[str, int] = defaultdict(int)
        self._inflight_tenant: dict[str, int] = {}  # no zero entries (see _count_tenant)
        self._reserved_tenant: dict[str, int] = {}
        self._inflight = 0
        self._inflight_llm = 0  # what the adaptive concurrency limit counts
        self._lingering = 0
        self._seq = 0
        self._snapshot: HeadroomSnapshot | None = None
        self._reserved_at_sample: dict[str, int] = {}
        self._completions: dict[str, deque[float]] = defaultdict(lambda: deque(maxlen=512))
        self._lane_reported: dict[str, float] = {}  # when lane_finished last heard of a model
        self._seq_len: dict[str, float] = {}
        self._service_s: dict[str, float] = {}  # EWMA of admitted -> released, per model
        self._upstream_latency: dict[str, deque[float]] = defaultdict(lambda: deque(maxlen=LATENCY_SAMPLES))
        self._lower_share: dict[str, LowerShare] = defaultdict(LowerShare)
        self._engine_limits: dict[str, EngineConcurrency] = {}  # models whose engine queues (_follow_engines)
        self._engine_demand: set[str] = set()  # of those, the ones a request waited for since the last tick
        self._follow_engines()
        self._arrivals: dict[str, deque[tuple[float, int]]] = defaultdict(deque)
        # Per model, how many of `_arrivals` are at each level: a rate is a sum over the few levels,
        # not a walk of the window (thousands of arrivals under a burst, asked on every decision).
        self._arrival_counts: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
        self._arrival_rates: dict[tuple[str, int, float], float] = {}  # see _arrival_rate
        self._token_counters: Mapping[str, Callable[[bytes], int]] = {}
        self._prompt_bytes_sent: dict[str, int] = defaultdict(int)  # per model, of admitted requests
        self._learned_ratio: dict[str, LearnedRatio] = defaultdict(LearnedRatio)
        self._demand = False
        self._granted: list[Decision] = []
        self._expired: list[Decision] = []
        self.last_limit_move = "hold"

    # -- policy and observations ------------------------------------------------------------------

    def apply_policy(self, policy: SidecarPolicy) -> None:
        """A reloaded policy takes effect at once; reservations and waiting requests are kept."""
        self.policy = policy
        self._index()
        self._follow_engines()
        self.limit.reconfigure(policy.concurrency)
        for waiting in self._waiting.values():
            waiting.groups = self._groups(waiting.request)
        self._order_cache = None  # the levels may have moved
        self._pump()

    def set_token_counters(self, counters: Mapping[str, Callable[[bytes], int]]) -> None:
        """The models' tokenizers (sidecar/tokens.py), loaded by the owner; the proxies count with them."""
        self._token_counters = dict(counters)

    def token_counter(self, model: str) -> Callable[[bytes], int] | None:
        """How a prompt of `model` is counted: its tokenizer, else the ratio learnt from the engine's
        own prompt-token counter (sidecar/prompt_ratio.py), else None (the policy's ratio)."""
        counter = self._token_counters.get(model)
        if counter is not None:
            return counter
        found = self.prompt_ratio(model)
        if found is None or found[1] != "learnt":
            return None
        ratio = found[0]
        return lambda text: max(1, math.ceil(len(text) / ratio))

    def prompt_ratio(self, model: str) -> tuple[float, str] | None:
        """(bytes per token, 'learnt' or 'policy') the prompts of an LLM are counted with; None with
        a tokenizer (exact counts) or for a model that is not an LLM."""
        mp = self._models.get(model)
        if model in self._token_counters or mp is None or mp.kv is None:
            return None
        learned = self._learned_ratio.get(model)
        if learned is not None and learned.ratio is not None:
            return learned.ratio, "learnt"
        return mp.kv.prompt_bytes_per_token, "policy"

    def prompt_counting(self, model: str) -> str:
        """How prompts of `model` are counted, in words (status)."""
        if model in self._token_counters:
            return "the model's tokenizer"
        found = self.prompt_ratio(model)
        if found is None:
            return "not an LLM"
        ratio, source = found
        if source == "learnt":
            return f"{ratio:.3g} bytes/token, learnt from the engine's prompt-token counter"
        bound = " (the bound that never under-counts)" if ratio <= 1 else ""
        return f"{ratio:g} bytes/token, the policy's{bound}"

    def observe_headroom(self, snapshot: HeadroomSnapshot) -> None:
        self._snapshot = snapshot
        for model, tokens in snapshot.prompt_tokens_total.items():
            if model in self._models and model not in self._token_counters:
                self._learned_ratio[model].observe(self._prompt_bytes_sent[model], tokens)
        for scope, reading in snapshot.readings.items():
            if reading.live:
                self._reserved_at_sample[scope] = self._reserved_scope.get(scope, 0)
        self._pump()

    # -- lookups ----------------------------------------------------------------------------------

    def _index(self) -> None:
        self._top_level = min(c.priority for c in self.policy.classes)
        self._models = {m.name: m for m in self.policy.models}
        # Each model's most urgent class (1 is the top): whose first tokens LowerShare judges.
        tops = {m.name: min((c for c in self.policy.classes if m.classes is None or c.name in m.classes),
                            key=lambda c: c.priority, default=None) for m in self.policy.models}
        self._top_class = {name: top for name, top in tops.items() if top is not None}
        self._classes = {c.name: c for c in self.policy.classes}
        self._devices = {d.id: d for d in self.policy.devices}
        self._tenants = {t.name: t for t in self.policy.tenants}
        self._unknown_models: dict[str, ModelPolicy] = {}

    def _follow_engines(self) -> None:
        """One EngineConcurrency per model whose engine queues, started at its max_inflight; a
        reloaded policy keeps a law whose starting figure it did not change, and what it learnt."""
        kept = self._engine_limits
        self._engine_limits = {}
        for model in self.policy.models:
            if not _engine_queues(model):
                continue
            assert model.max_inflight is not None
            ceiling = _pool_blocks(model)
            law = kept.get(model.name)
            if law is None or law.start != model.max_inflight or law.ceiling != ceiling:
                law = EngineConcurrency(self.policy.queueing_engines, model.max_inflight, ceiling=ceiling)
            law.cfg = self.policy.queueing_engines
            self._engine_limits[model.name] = law

    def model_policy(self, name: str) -> ModelPolicy:
        found = self._models.get(name)
        if found is not None:
            return found
        # A model the policy does not know: admitted under the global limit only, at no memory cost.
        unknown = self._unknown_models.get(name)
        if unknown is None:
            if len(self._unknown_models) > 1024:
                self._unknown_models.clear()
            unknown = ModelPolicy.model_construct(
                name=name, kind="classic", streaming=False, devices=[d.id for d in self.policy.devices],
                engines=1, kv=None, request_bytes=0, request_bytes_source="analytic", memory_quota_bytes=None,
                max_inflight=None, classes=None, release_grace_ms=0.0,
                priority_levels=16, default_priority=0,
            )
            self._unknown_models[name] = unknown
        return unknown

    def known_model(self, name: str) -> bool:
        return name in self._models

    def _top_priority(self, model: ModelPolicy) -> int:
        """The most urgent class level the model serves (1 is the top)."""
        found = self._top_class.get(model.name)
        return found.priority if found is not None else self._top_level

    def lower_share(self, model: str) -> float:
        """The share of the model's rooms its lower classes may fill now (LowerShare); 1.0 unless the
        top class's first tokens are coming late."""
        found = self._lower_share.get(model)
        return found.value if found is not None else 1.0

    def _counts_for_limit(self, name: str) -> bool:
        """LLMs whose memory the adaptive limit guards; a queueing engine's LLM has its own limit."""
        found = self._models.get(name)
        return found is not None and found.kv is not None and name not in self._engine_limits

    def engine_limit(self, name: str) -> EngineConcurrency | None:
        """The law that holds the in-flight limit of a model whose engine queues (None: not one)."""
        return self._engine_limits.get(name)

    def tenant_quota(self, tenant: str) -> TenantQuota | None:
        """The tenant's own quota, else the policy's `default_tenant` (None: unlimited)."""
        return self._tenants.get(tenant, self.policy.default_tenant)

    def tenant_label(self, tenant: str) -> str:
        """The tenant's metrics label: listed tenants and `default` by name, any other `other`, so a
        client cannot grow the label set by inventing names."""
        return tenant if tenant in self._tenants or tenant == DEFAULT_TENANT else OTHER_TENANTS

    def class_policy(self, name: str | None) -> ClassPolicy:
        found = self._classes.get(name) if name else None
        if found is None:
            found = self._classes[self.policy.default_class]
        return found

    def _now(self) -> float:
        return self._clock()

    def _fresh_snapshot(self, now: float) -> HeadroomSnapshot | None:
        snap = self._snapshot
        if snap is None or (now - snap.taken_at) * 1000 > self.policy.headroom.stale_after_ms:
            return None
        return snap

    def reading(self, scope: str, now: float | None = None) -> Reading | None:
        """The reading in force for a scope: a fresh live one, else the static fallback (devices)."""
        now = self._now() if now is None else now
        snap = self._fresh_snapshot(now)
        if snap is not None and scope in snap.readings:
            return snap.readings[scope]
        device = self._devices.get(scope)
        if device is None:
            return None
        return Reading(
            scope=scope,
            total_bytes=int(device.memory_bytes * device.utilization_cap),
            used_bytes=device.static_used_bytes,
            source="static",
            live=False,
        )

    def capacity(self, scope: str, now: float | None = None) -> float | None:
        """Bytes the sidecar may hold on a scope in all (reservations included); None: unconstrained."""
        reading = self.reading(scope, now)
        if reading is None:
            return None
        pad = self.policy.headroom.safety_pad_bytes if not scope.startswith("pool:") else 0
        if reading.live:
            foreign = max(0, reading.used_bytes - self._reserved_at_sample.get(scope, 0))
            return float(reading.total_bytes - pad - foreign)
        return float(reading.total_bytes - pad - reading.used_bytes)

    # -- rooms ------------------------------------------------------------------------------------

    def _device_need(self, model: ModelPolicy, cost: Cost) -> int:
        need = cost.prefill_bytes + cost.request_bytes
        if model.kv is not None and not model.kv.preallocated:
            need += cost.kv_bytes
        return need

    def rooms(self, request: Request, now: float) -> tuple[list[Room], list[Room]]:
        """(memory rooms, concurrency rooms) for a request, scaled by its class's budget share."""
        model = self.model_policy(request.model)
        klass = self.class_policy(request.klass)
        frac = klass.budget_fraction
        cost = request.cost
        # The tenant's rooms come first in each list: a request over its tenant's quota is named as
        # waiting for its tenant, and so holds only its tenant's requests, not its model's.
        slots, memory = self._tenant_rooms(request, frac)
        if self._counts_for_limit(model.name):
            # The adaptive limit guards LLM memory; a classic model is bounded by what Triton accepts.
            slots.append(Room("concurrency_limit", "requests", self._inflight_llm,
                              max(1, math.floor(self.limit.value * frac)), 1, shared=False, static=False,
                              holds="limit"))
        law = self._engine_limits.get(model.name)
        if law is not None:
            # An engine that queues has no room to keep for the top class: a slot frees within one
            # sequence's run and the queue's order gives it to the most urgent; LowerShare (below)
            # holds the lower classes back when the top class's first tokens come late.
            slots.append(Room(f"model_concurrency_quota:{model.name}", "requests", self._inflight_model[model.name],
                              law.limit, 1, shared=False, static=False))
        elif model.max_inflight is not None:
            slots.append(Room(f"model_concurrency_quota:{model.name}", "requests", self._inflight_model[model.name],
                              max(1, math.floor(model.max_inflight * frac)), 1, shared=False, static=True))
        reserves = model.kv is None or model.kv.reserves
        if model.memory_quota_bytes is not None and reserves:
            memory.append(Room(f"model_memory_quota:{model.name}", "bytes", self._reserved_kv[model.name],
                               math.floor(model.memory_quota_bytes * frac), cost.kv_bytes, shared=False, static=True))
        share = self.lower_share(model.name)
        if share < 1.0 and model.kv is not None and klass.priority != self._top_priority(model):
            # The top class's first tokens are late: lower classes fill less (LowerShare), of the
            # pool where the engine reserves, else of its sequences.
            if model.memory_quota_bytes is not None and reserves:
                memory.append(Room(f"lower_class_share:{model.name}", "bytes", self._reserved_kv[model.name],
                                   math.floor(model.memory_quota_bytes * frac * share), cost.kv_bytes, shared=False,
                                   static=False))
            elif model.max_inflight is not None:
                seqs = law.limit if law is not None else model.max_inflight * frac
                slots.append(Room(f"lower_class_share:{model.name}", "requests", self._inflight_model[model.name],
                                  max(1, math.floor(seqs * share)), 1, shared=False, static=False))
        if model.kv is not None and reserves:
            pool = f"pool:{model.name}"
            cap = self.capacity(pool, now)
            if cap is not None:
                memory.append(Room(f"headroom:{pool}", "bytes", self._reserved_scope[pool],
                                   cap * frac, cost.kv_bytes, shared=False, static=False))
        device_need = self._device_need(model, cost)
        for device in model.devices:
            cap = self.capacity(device, now)
            if cap is None:
                continue
            memory.append(Room(f"headroom:{device}", "bytes", self._reserved_scope[device],
                               cap * frac, device_need, shared=True, static=False))
        return memory, slots

    def _tenant_rooms(self, request: Request, frac: float) -> tuple[list[Room], list[Room]]:
        """(concurrency rooms, memory rooms) of the request's tenant quota; none when unlimited."""
        quota = self.tenant_quota(request.tenant)
        slots: list[Room] = []
        memory: list[Room] = []
        if quota is None:
            return slots, memory
        tenant = request.tenant
        if quota.max_inflight is not None:
            slots.append(Room(f"tenant_concurrency_quota:{tenant}", "requests", self._inflight_tenant.get(tenant, 0),
                              max(1, math.floor(quota.max_inflight * frac)), 1, shared=False, static=True,
                              holds="tenant"))
        if quota.max_reserved_bytes is not None:
            memory.append(Room(f"tenant_memory_quota:{tenant}", "bytes", self._reserved_tenant.get(tenant, 0),
                               math.floor(quota.max_reserved_bytes * frac), request.cost.total_bytes, shared=False,
                               static=True, holds="tenant"))
        return slots, memory

    def verdict(self, request: Request, now: float | None = None) -> Verdict:
        now = self._now() if now is None else now
        memory, slots = self.rooms(request, now)
        return decide(request.cost, memory, slots)

    # -- queue order ------------------------------------------------------------------------------

    def effective_level(self, waiting: _Waiting, now: float) -> int:
        """Promoted one level per starvation guard period waited, but never level with the top class:
        a waiting request of a lower class has a deadline of its own (it is refused, never starved
        for ever), while one promoted beside the top class would, under sustained overload, queue
        every new top-class request behind the whole backlog and see them refused."""
        return self._level_of(now)(waiting)

    def _level_of(self, now: float) -> Callable[[_Waiting], int]:
        """`effective_level` at `now` as a one-argument function, the policy's constants read once:
        the queue's order asks it for every waiting request."""
        top = self._top_level
        guard_s = self.policy.starvation_guard_ms / 1000

        def level(waiting: _Waiting) -> int:
            priority = waiting.priority
            if priority <= top or guard_s <= 0:
                return priority
            return max(top + 1, priority - int((now - waiting.enqueued_at) // guard_s))

        return level

    def _order(self, now: float) -> list[_Waiting]:
        """The waiting requests in the order they leave: effective level, then arrival. A fresh list
        (callers remove from the queue while they walk it)."""
        cached = self._order_cache
        if cached is not None and cached[0] == now and cached[1] == self._waiting.rev:
            return list(cached[2])
        # The queue keeps arrival order (enqueued_at, then seq), so the order is the levels'
        # buckets in turn, each in arrival order, with no sort of the whole queue.
        level_of = self._level_of(now)
        buckets: dict[int, list[_Waiting]] = defaultdict(list)
        for waiting in self._waiting.values():
            buckets[level_of(waiting)].append(waiting)
        order = [w for level in sorted(buckets) for w in buckets[level]]
        self._order_cache = (now, self._waiting.rev, order)
        return list(order)

    @staticmethod
    def _hold_key(request: Request, room: Room) -> tuple[str, str]:
        """The group a request blocked by a non-shared room holds in the queue: its model's requests
        (a model quota or pool), its tenant's (a tenant quota) or every LLM request (the adaptive
        concurrency limit, which only LLM requests count against)."""
        if room.holds == "limit":
            return _LIMIT_GROUP
        return ("tenant", request.tenant) if room.holds == "tenant" else ("model", request.model)

    def _groups(self, request: Request) -> tuple[tuple[str, str], ...]:
        groups = (("model", request.model), ("tenant", request.tenant))
        return (*groups, _LIMIT_GROUP) if self._counts_for_limit(request.model) else groups

    # -- the main entry points --------------------------------------------------------------------

    def submit(self, request: Request) -> Decision:
        """Admit now, queue, or refuse. Queued requests are granted later through `take_events()`."""
        now = self._now()
        if request.id in self._waiting or request.id in self._reservations:
            raise ValueError(f"request id {request.id!r} is already known to the admission state")
        self._expire(now)
        model = self.model_policy(request.model)
        klass = self.class_policy(request.klass)
        if model.classes is not None and klass.name not in model.classes:
            return Decision(
                Action.REJECT, request.id, CLASS_NOT_SERVED,
                detail=f"model {model.name!r} does not serve class {klass.name!r}; it serves {model.classes}",
            )
        quota = self.tenant_quota(request.tenant)
        if quota is not None and quota.classes is not None and klass.name not in quota.classes:
            return Decision(
                Action.REJECT, request.id, TENANT_CLASS_NOT_ALLOWED, limit=f"tenant_classes:{request.tenant}",
                detail=f"tenant {request.tenant!r} may send classes {quota.classes}; class {klass.name!r} is not one "
                "of them",
            )
        if request.cost.never is not None:
            reason, detail = request.cost.never
            return Decision(Action.REJECT, request.id, reason, limit=f"model_context:{model.name}"
                            if reason == EXCEEDS_CONTEXT else f"engine_pool:{model.name}", detail=detail)
        memory, slots = self.rooms(request, now)
        verdict = decide(request.cost, memory, slots)
        never = [r for r in (*memory, *slots) if r.static and r.need > r.capacity]
        if never:
            room = never[0]
            return Decision(
                Action.REJECT, request.id, EXCEEDS_BUDGET, limit=room.name, limit_capacity=room.capacity,
                limit_used=room.used, headroom_bytes=verdict.headroom_bytes,
                detail=f"the request needs {room.need:.0f} {room.unit} but {room.name} allows class "
                f"{klass.name!r} at most {room.capacity:.0f}; it can never be admitted",
            )
        if verdict.ok and not self._waiting:  # the common case: room, and nobody ahead
            self._reserve(request, now)
            self._note_arrival(request.model, klass.priority, now)
            return Decision(Action.ADMIT, request.id, "admitted", headroom_bytes=verdict.headroom_bytes)
        self._seq += 1
        allowed_s = self.allowed_wait_s(request.model, klass)
        waiting = _Waiting(request, now, now + allowed_s, klass.priority, self._seq, self._groups(request))
        self._waiting[request.id] = waiting
        self._pump(now, expire=False)  # expired already above; the newcomer must not expire before it is judged
        granted = [g for g in self._granted if g.request_id == request.id]
        if granted:
            self._granted.remove(granted[0])
            self._note_arrival(request.model, klass.priority, now)
            return granted[0]
        # Not admitted: it waits, unless its queue is full or the wait would exceed the class's.
        del self._waiting[request.id]
        self._demand = True
        blocked = verdict.blocked or self._head_blocker(now, request)
        if blocked is not None and request.model in self._engine_limits and blocked.name in (
                f"model_concurrency_quota:{request.model}", f"lower_class_share:{request.model}"):
            self._engine_demand.add(request.model)
        if blocked is None:
            limit_name, cap, used = "queue_order", None, None
        else:
            limit_name, cap, used = blocked.name, blocked.capacity, blocked.used
        ahead = self._ahead(request.model, (klass.priority, now, self._seq), now)
        same_class = sum(1 for w in self._waiting.values() if w.request.klass == klass.name)
        terms = self._wait_terms(request.model, now, klass.priority)
        wait_s = None if terms is None else _wait_from(terms, ahead + 1)
        # Below the top class a request waits only if it leaves in time with high confidence (WAIT_Z);
        # the top class waits on the mean: its budget is a few departures long, and refusing it on a
        # quantile would hand its share to the classes below.
        z = WAIT_Z if klass.priority > self._top_level else 0.0
        sure_s = None if terms is None else _wait_from(terms, ahead + 1, z)
        common = dict(limit=limit_name, limit_capacity=cap, limit_used=used, headroom_bytes=verdict.headroom_bytes)
        if klass.queue_cap is not None and same_class >= klass.queue_cap:
            return Decision(
                Action.REJECT, request.id, QUEUE_FULL, retry_after_s=self.retry_after_s(wait_s),
                queue_position=ahead + 1, **common,
                detail=f"{limit_name} is reached and class {klass.name!r} already has {same_class} "
                f"requests waiting (its queue cap is {klass.queue_cap})",
            )
        if allowed_s <= 0:
            upstream = self.upstream_latency_s(request.model) or 0.0
            return Decision(
                Action.REJECT, request.id, QUEUE_WAIT, retry_after_s=self.retry_after_s(wait_s),
                queue_position=ahead + 1, **common,
                detail=f"{limit_name} is reached and class {klass.name!r}'s {klass.p99_ms:.0f} ms target leaves "
                f"no time to wait: upstream alone takes {upstream * 1000:.0f} ms (P{LATENCY_QUANTILE * 100:.0f})",
            )
        if sure_s is not None and sure_s > allowed_s:
            assert wait_s is not None
            likely = f" ({sure_s * 1000:.0f} ms at its {_Z_PERCENTILE:.0f}th percentile)" if z else ""
            return Decision(
                Action.REJECT, request.id, QUEUE_WAIT, retry_after_s=self.retry_after_s(wait_s),
                queue_position=ahead + 1, **common,
                detail=f"{limit_name} is reached and the estimated wait, {wait_s * 1000:.0f} ms{likely} for "
                f"{ahead} request(s) ahead, exceeds the {allowed_s * 1000:.0f} ms class {klass.name!r} may wait",
            )
        self._waiting[request.id] = waiting
        self._note_arrival(request.model, klass.priority, now)
        return Decision(Action.QUEUE, request.id, "queued", queue_position=ahead + 1, **common,
                        detail=f"waiting for {limit_name}")

    def _ahead(self, model: str, key: tuple[int, float, int], now: float) -> int:
        level = self._level_of(now)
        return sum(
            1 for w in self._waiting.values()
            if w.request.model == model and (level(w), w.enqueued_at, w.seq) < key
        )

    def _head_blocker(self, now: float, request: Request | None = None) -> Room | None:
        """The limit that holds the queue for a request that would fit itself: a shared one, or one
        that holds its model or its tenant (the requests of its group ahead of it wait for it)."""
        groups = self._groups(request) if request is not None else ()
        for waiting in self._order(now):
            blocked = self.verdict(waiting.request, now).blocked
            if blocked is not None and (blocked.shared or self._hold_key(waiting.request, blocked) in groups):
                return blocked
        return None

    def cancel(self, request_id: Hashable) -> bool:
        """The client gave up while waiting. False if it is not waiting (already granted or gone)."""
        return self._waiting.pop(request_id, None) is not None

    def end_prefill(self, request_id: Hashable) -> None:
        """The first token came back: the prefill peak is no longer held, and the time from
        admission to this first response is a sample of the model's upstream latency."""
        res = self._reservations.get(request_id)
        if res is None:
            return
        if res.first_response_at is None:
            res.first_response_at = self._now()
            self._upstream_latency[res.request.model].append(res.first_response_at - res.admitted_at)
            self._started_model[res.request.model] += 1
            law = self._engine_limits.get(res.request.model)
            if law is not None:
                law.observe_first_token(res.first_response_at - res.admitted_at)
                law.observe_running(self._started_model[res.request.model])
            model = self._models.get(res.request.model)
            if model is not None and model.kv is not None:
                klass = self.class_policy(res.request.klass)
                if klass.priority == self._top_priority(model):
                    self._lower_share[model.name].observe(res.first_response_at, res.first_response_at - res.arrived_at)
        if res.prefill_bytes == 0:
            return
        for scope in res.device_scopes:
            self._reserved_scope[scope] -= res.prefill_bytes
        self._count_tenant(res.request.tenant, reserved=-res.prefill_bytes)
        res.extra_bytes -= res.prefill_bytes
        res.prefill_bytes = 0
        self._pump()

    def release(self, request_id: Hashable, tokens: int | None = None, linger_s: float = 0.0,
                responses: int | None = None) -> bool:
        """The request ended (any way). Idempotent; False if it held nothing.

        `tokens`: the sequence's length (prompt + output); `responses`: the streamed responses it got
        (one a token), whose spacing is the engine's step (EngineConcurrency).

        `linger_s` > 0 keeps its bytes reserved that much longer (a cancelled request the engine may
        still hold memory for); the in-flight count drops at once either way.
        """
        res = self._reservations.get(request_id)
        if res is None or res.lingering_until is not None:
            return False
        now = self._now()
        model = res.request.model
        self._uncount(res)
        self._completions[model].append(now)
        service = now - res.admitted_at
        if res.first_response_at is None and linger_s == 0:
            self._upstream_latency[model].append(service)  # no streamed response: the whole request
        prev_service = self._service_s.get(model)
        self._service_s[model] = service if prev_service is None else prev_service + SERVICE_ALPHA * (service - prev_service)
        law = self._engine_limits.get(model)
        if law is not None and responses is not None and responses > 1 and res.first_response_at is not None and linger_s == 0:
            law.observe_gap((now - res.first_response_at) / (responses - 1))
        if tokens is not None and tokens > 0:
            per_seq = tokens / max(1, res.request.cost.sequences)
            prev = self._seq_len.get(model)
            self._seq_len[model] = per_seq if prev is None else prev + SEQ_LEN_ALPHA * (per_seq - prev)
        if linger_s > 0:
            res.lingering_until = now + linger_s
            self._lingering += 1
        else:
            self._free(request_id)
        self._pump(now)
        return True

    # -- the native lane (sidecar/lane.py) ---------------------------------------------------------

    def lane_may_grow(self, model: str, now: float | None = None) -> bool:
        """Whether the lane may take more slots of `model`: not while a request of the model waits
        here (new lane requests must queue behind it), nor while the queue's head waits for a
        shared room (a device's headroom), which a slot would take from it."""
        if not self._waiting:
            return True
        now = self._now() if now is None else now
        if any(w.request.model == model for w in self._waiting.values()):
            return False
        blocked = self._head_blocker(now)
        return blocked is None or not blocked.shared

    def take_lane_slot(self, slot_id: Hashable, model: str, klass: str) -> bool:
        """Reserve one lane slot of a classic model, as a request of `klass` and the default tenant
        would be reserved, if it fits now and the lane may grow. No arrival is counted: a slot is
        capacity handed to nginx, not a request."""
        now = self._now()
        request = self._lane_request(slot_id, model, klass)
        if request is None or slot_id in self._reservations or not self.lane_may_grow(model, now):
            return False
        memory, slots = self.rooms(request, now)
        if not decide(request.cost, memory, slots).ok:
            return False
        self._reserve(request, now)
        return True

    def lane_overfull(self, model: str, klass: str) -> bool:
        """Whether a room of `model`'s lane slots of `klass` holds more than it may (a reloaded policy
        lowered a quota, or live headroom fell): its idle slots go back."""
        request = self._lane_request(("lane", "probe"), model, klass)
        if request is None:
            return True
        memory, slots = self.rooms(request, self._now())
        return any(room.used > room.capacity for room in (*memory, *slots))

    def _lane_request(self, slot_id: Hashable, model: str, klass: str) -> Request | None:
        """What one lane slot of `model` and `klass` holds: a classic request of the default tenant
        (`cost.cost_for`'s classic cost); None for a model the policy does not list or an LLM."""
        mp = self._models.get(model)
        if mp is None or mp.kv is not None:
            return None
        return Request(slot_id, model, klass, Cost(request_bytes=mp.request_bytes))

    def return_lane_slot(self, slot_id: Hashable) -> bool:
        """Give a lane slot back (nginx no longer counts on it); its room goes to whoever waits.
        Unlike `release`, no completion is recorded: the lane's requests are (`lane_finished`)."""
        res = self._reservations.get(slot_id)
        if res is None:
            return False
        self._uncount(res)
        self._free(slot_id)
        self._pump()
        return True

    def lane_finished(self, model: str, count: int, seconds: float) -> None:
        """`count` lane requests of `model` ended, taking `seconds` in all: they feed the drain rate,
        the service time and the upstream latency that the Python path's wait estimates read."""
        if count <= 0 or model not in self._models:
            return
        now = self._now()
        done = self._completions[model]
        # They ended over the time since the previous report (at most a second): spread them over
        # it, or a window of stamps all at `now` would read as a burst.
        since = max(0.0, min(1.0, now - self._lane_reported.get(model, now)))
        self._lane_reported[model] = now
        kept = min(count, done.maxlen or count)
        done.extend(now - since * (kept - 1 - i) / kept for i in range(kept))
        mean = max(0.0, seconds) / count
        prev = self._service_s.get(model)
        self._service_s[model] = mean if prev is None else prev + SERVICE_ALPHA * (mean - prev)
        self._upstream_latency[model].append(mean)
        self._pump(now)

    def tick(self) -> None:
        """Time passes: lingering reservations end, queue deadlines pass, the limit may move."""
        now = self._now()
        self._expire(now)
        watermark = self.watermark(now)
        delay = self.queue_delay_s(now)
        near_limit = self._inflight >= max(1, self.limit.value - 1)
        self.last_limit_move = self.limit.update(now, watermark, delay, self._demand or near_limit)
        if self.last_limit_move != "hold":
            self._demand = False
        self._refuse_hopeless(now)
        due = [name for name, law in self._engine_limits.items() if law.due(now)]
        if due:
            waited = {w.request.model for w in self._waiting.values()}
            pending: dict[str, list[float]] = defaultdict(list)  # at the engine, no first token yet
            for res in self._reservations.values():
                if res.first_response_at is None and res.lingering_until is None:
                    pending[res.request.model].append(now - res.admitted_at)
            for name in due:
                self._engine_limits[name].update(now, demand=name in self._engine_demand or name in waited,
                                                 pending_ages=pending.get(name, ()),
                                                 running=self._started_model.get(name, 0))
                self._engine_demand.discard(name)
        for name, share in self._lower_share.items():
            top = self._top_class.get(name)
            if top is not None:
                share.update(now, top.p99_ms / 1000)
        self._pump(now)

    @property
    def has_events(self) -> bool:
        return bool(self._granted or self._expired)

    def take_events(self) -> Events:
        events = Events(self._granted, self._expired)
        self._granted, self._expired = [], []
        return events

    # -- internals --------------------------------------------------------------------------------

    def _reserve(self, request: Request, now: float, arrived_at: float | None = None) -> None:
        model = self.model_policy(request.model)
        cost = request.cost
        kv_scopes = (f"pool:{model.name}",) if model.kv is not None else ()
        res = _Reservation(
            request, now, kv_scopes, tuple(model.devices), kv_bytes=cost.kv_bytes,
            extra_bytes=cost.prefill_bytes + cost.request_bytes, prefill_bytes=cost.prefill_bytes,
            kv_on_device=model.kv is not None and not model.kv.preallocated,
            arrived_at=now if arrived_at is None else arrived_at,
        )
        self._reservations[request.id] = res
        for scope in kv_scopes:
            self._reserved_scope[scope] += res.kv_bytes
        for scope in res.device_scopes:
            self._reserved_scope[scope] += res.device_bytes
        self._reserved_kv[request.model] += cost.kv_bytes
        self._prompt_bytes_sent[request.model] += cost.prompt_bytes
        self._inflight += 1
        if self._counts_for_limit(request.model):
            self._inflight_llm += 1
        self._inflight_model[request.model] += 1
        self._sequences_model[request.model] += cost.sequences
        self._count_tenant(request.tenant, inflight=1, reserved=res.held_bytes)

    def _uncount(self, res: _Reservation) -> None:
        """Drop a reservation's in-flight counts (its bytes go with `_free`)."""
        model = res.request.model
        self._inflight -= 1
        if self._counts_for_limit(model):
            self._inflight_llm -= 1
        self._inflight_model[model] -= 1
        if res.first_response_at is not None:
            self._started_model[model] -= 1
        self._sequences_model[model] -= res.request.cost.sequences
        self._count_tenant(res.request.tenant, inflight=-1)

    def _free(self, request_id: Hashable) -> None:
        res = self._reservations.pop(request_id)
        for scope in res.kv_scopes:
            self._reserved_scope[scope] -= res.kv_bytes
        for scope in res.device_scopes:
            self._reserved_scope[scope] -= res.device_bytes
        self._reserved_kv[res.request.model] -= res.kv_bytes
        self._count_tenant(res.request.tenant, reserved=-res.held_bytes)
        if res.lingering_until is not None:
            self._lingering -= 1

    def _count_tenant(self, tenant: str, inflight: int = 0, reserved: int = 0) -> None:
        """Move a tenant's in-flight count and reserved bytes. Entries that reach zero are removed:
        the tenant names clients send are unbounded, the requests holding something are not."""
        for counts, delta in ((self._inflight_tenant, inflight), (self._reserved_tenant, reserved)):
            if delta:
                value = counts.get(tenant, 0) + delta
                if value:
                    counts[tenant] = value
                else:
                    del counts[tenant]

    def _expire(self, now: float) -> None:
        if self._lingering:
            for rid in [r for r, res in self._reservations.items()
                        if res.lingering_until is not None and res.lingering_until <= now]:
                self._free(rid)
        for rid in [r for r, w in self._waiting.items() if w.deadline <= now]:
            waiting = self._waiting.pop(rid)
            klass = self.class_policy(waiting.request.klass)
            wait_s = self.expected_wait_s(waiting.request.model, 1, now)
            verdict = self.verdict(waiting.request, now)
            blocked = verdict.blocked or self._head_blocker(now, waiting.request)
            self._expired.append(Decision(
                Action.REJECT, rid, QUEUE_TIMEOUT, retry_after_s=self.retry_after_s(wait_s),
                waited_s=now - waiting.enqueued_at, headroom_bytes=verdict.headroom_bytes,
                limit=blocked.name if blocked else "queue_order",
                limit_capacity=blocked.capacity if blocked else None,
                limit_used=blocked.used if blocked else None,
                detail=f"waited {1000 * (now - waiting.enqueued_at):.0f} ms, class {klass.name!r}'s "
                f"longest queue wait, without room being made",
            ))

    def _refuse_hopeless(self, now: float) -> None:
        """Refuse now, not at its deadline, a waiting request whose predicted wait (its place in its
        model's queue / the model's drain rate) is well past the time it has left: a client told
        early can retry elsewhere. Well past: 1.5 x, so a wait the estimate gets slightly wrong
        is still served."""
        if not self._waiting:
            return
        places: dict[str, int] = defaultdict(int)
        terms: dict[tuple[str, int], tuple[float, float] | None] = {}
        level = self._level_of(now)
        for waiting in self._order(now):
            model = waiting.request.model
            places[model] += 1
            key = (model, level(waiting))
            if key not in terms:
                terms[key] = self._wait_terms(model, now, key[1])
            found = terms[key]
            predicted = None if found is None else _wait_from(found, places[model])
            left = waiting.deadline - now
            if predicted is None or predicted <= 1.5 * left:
                continue
            del self._waiting[waiting.request.id]
            self._expired.append(Decision(
                Action.REJECT, waiting.request.id, QUEUE_WAIT, retry_after_s=self.retry_after_s(predicted),
                waited_s=now - waiting.enqueued_at, limit="queue_order", queue_position=places[model],
                detail=f"the predicted wait, {predicted * 1000:.0f} ms for place {places[model]} in the queue, is "
                f"far past the {max(0.0, left) * 1000:.0f} ms left of class {waiting.request.klass!r}'s wait",
            ))
            places[model] -= 1

    def _pump(self, now: float | None = None, expire: bool = True) -> None:
        """Grant waiting requests in effective order while they fit."""
        if not self._waiting:
            return
        now = self._now() if now is None else now
        if expire:
            self._expire(now)
        held: set[tuple[str, str]] = set()  # groups (model or tenant) held by a request ahead of them
        for waiting in self._order(now):
            request = waiting.request
            if held and not held.isdisjoint(waiting.groups):
                continue
            memory, slots = self.rooms(request, now)
            verdict = decide(request.cost, memory, slots)
            if verdict.ok:
                del self._waiting[request.id]
                self._reserve(request, now, waiting.enqueued_at)
                self._granted.append(Decision(
                    Action.ADMIT, request.id, "admitted", headroom_bytes=verdict.headroom_bytes,
                    waited_s=now - waiting.enqueued_at,
                ))
                continue
            assert verdict.blocked is not None
            if verdict.blocked.shared:
                break
            held.add(self._hold_key(request, verdict.blocked))

    # -- measurements -----------------------------------------------------------------------------

    def drain_rate(self, model: str, now: float | None = None) -> float | None:
        """Requests of `model` that finish per second, the larger of two readings that each fall short
        of what a busy model drains: in flight / mean service time (Little's law; it does not lag
        behind a burst that follows a quiet spell, but dips whenever departures leave slots empty for
        a moment), and the completions of the last window (steady, but low after a quiet spell). Read
        from the first alone, a wait predicted at a dip refused requests the engine would have served
        in time (measured on a real vLLM at 1.5x its capacity: most of a 10 s class refused while the
        ones served waited 4 s at the P99). None before anything finished."""
        now = self._now() if now is None else now
        inflight = self._inflight_model.get(model, 0)
        service = self._service_s.get(model)
        readings = [self._completion_rate(model, now)]
        if inflight > 0 and service:
            readings.append(inflight / max(service, 1e-3))
        seen = [r for r in readings if r is not None]
        return max(seen) if seen else None

    def _completion_rate(self, model: str, now: float) -> float | None:
        """Completions per second over the last window; None with too few. Counted over one mean
        service time at least: requests that started together end together, and two that just did
        say nothing of a rate."""
        done = self._completions.get(model)
        if not done:
            return None
        while done and done[0] < now - DRAIN_WINDOW_S:
            done.popleft()
        if len(done) < DRAIN_MIN_SAMPLES:
            return None
        return len(done) / max(now - done[0], self._service_s.get(model) or 0.0, 0.05)

    def upstream_latency_s(self, model: str) -> float | None:
        """A high quantile of admission -> first response (streams) or -> end (unary), recent samples."""
        samples = self._upstream_latency.get(model)
        if not samples or len(samples) < LATENCY_MIN_SAMPLES:
            return None
        ordered = sorted(samples)
        return ordered[min(len(ordered) - 1, int(LATENCY_QUANTILE * len(ordered)))]

    def allowed_wait_s(self, model: str, klass: ClassPolicy) -> float:
        """How long a request may wait in the queue: the class's longest wait, and no longer than its
        latency target minus what the upstream part usually takes, so the ones served meet the target."""
        allowed = klass.max_queue_wait_ms / 1000
        upstream = self.upstream_latency_s(model)
        if upstream is not None:
            allowed = min(allowed, klass.p99_ms / 1000 - upstream)
        return max(0.0, allowed)

    def expected_wait_s(self, model: str, position: int, now: float, priority: int | None = None) -> float | None:
        """Seconds until a request at `position` in its model's queue leaves it: position / drain
        rate, where, for a request of a lower class, the top class's requests arriving meanwhile
        (at their recent rate) always pass it, and those of the classes between pass it until the
        starvation guard has promoted it to their level (effective_level). None: no drain measured."""
        terms = self._wait_terms(model, now, priority)
        return None if terms is None else _wait_from(terms, position)

    def _wait_terms(self, model: str, now: float, priority: int | None) -> tuple[float, float] | None:
        """(places added, rate) so that the wait at `position` is (position + places) / rate
        (`expected_wait_s`); rate 0: never (the top class takes it all). None: no drain measured.
        Apart from the position so that a walk of the queue works them out once per level."""
        rate = self.drain_rate(model, now)
        if rate is None or rate <= 0:
            return None
        top = self._top_level
        if priority is None or priority <= top:
            return (0.0, rate)
        passing_top = self._arrival_rate(model, now, below=top + 1)
        passing_mid = self._arrival_rate(model, now, below=priority) - passing_top
        promoted_s = max(0, priority - top - 1) * self.policy.starvation_guard_ms / 1000
        left = rate - passing_top  # what the top class leaves for everyone else
        if left <= 0.05 * rate:
            return (0.0, 0.0)
        return (passing_mid * promoted_s, left)

    def _note_arrival(self, model: str, priority: int, now: float) -> None:
        """A request that is admitted or waits (a refused one takes nothing from the drain)."""
        seen, counts = self._arrivals[model], self._arrival_counts[model]
        if len(seen) >= ARRIVALS_KEPT:
            counts[seen.popleft()[1]] -= 1
        seen.append((now, priority))
        counts[priority] += 1
        self._arrival_rates.clear()

    def _arrival_rate(self, model: str, now: float, below: int) -> float:
        """Requests per second of levels more urgent than `below` (lower numbers), recent window.
        Counted once per model, level and instant: a tick asks it for every waiting request."""
        key = (model, below, now)
        cached = self._arrival_rates.get(key)
        if cached is not None:
            return cached
        if len(self._arrival_rates) > 64:
            self._arrival_rates.clear()
        seen = self._arrivals.get(model)
        rate = 0.0
        if seen:
            counts = self._arrival_counts[model]
            while seen and seen[0][0] < now - ARRIVAL_WINDOW_S:
                counts[seen.popleft()[1]] -= 1
            if len(seen) >= DRAIN_MIN_SAMPLES:
                rate = sum(n for level, n in counts.items() if level < below) / max(now - seen[0][0], 0.5)
        self._arrival_rates[key] = rate
        return rate

    def retry_after_s(self, wait_s: float | None) -> float:
        """Seconds before a retry can expect room: the drain-rate estimate, at least 1, capped."""
        cap = self.policy.limits.max_retry_after_s
        if wait_s is None:
            return 1.0
        if not math.isfinite(wait_s):
            return float(cap)
        return float(min(cap, max(1, math.ceil(wait_s))))

    def queue_delay_s(self, now: float) -> float | None:
        snap = self._fresh_snapshot(now)
        if snap is None or not snap.queue_delay_s:
            return None
        return max(snap.queue_delay_s.values())

    def watermark(self, now: float | None = None) -> float:
        """The fullest device: reserved / capacity over every device a model uses. KV quotas and pools
        are left out: each request's footprint is checked against them exactly, so a full pool is a
        busy engine, not a memory risk, and stepping the limit down for it would only cost goodput."""
        now = self._now() if now is None else now
        worst = 0.0
        for scope in sorted({d for m in self.policy.models for d in m.devices}):
            cap = self.capacity(scope, now)
            if cap is None:
                continue
            used = self._reserved_scope.get(scope, 0)
            worst = max(worst, 1.0 if cap <= 0 else used / cap)
        return worst

    def oom_risk(self, model: str) -> float | None:
        """The leading out-of-memory indicator: in-flight sequences x the KV bytes a sequence of the
        mean length holds (KVCost.bytes_at: bytes per token x length for a classic model), over the
        model's KV budget. Above 1 an engine that allocates as it goes runs out."""
        policy = self.policy.model_named(model)
        if policy is None or policy.kv is None or not policy.memory_quota_bytes:
            return None
        seqs = self._sequences_model.get(model, 0)
        mean = self._seq_len.get(model)
        if mean is None:
            live = [r.request.cost.tokens / max(1, r.request.cost.sequences)
                    for r in self._reservations.values() if r.request.model == model and r.lingering_until is None]
            mean = sum(live) / len(live) if live else 0.0
        return seqs * policy.kv.bytes_at(mean) / policy.memory_quota_bytes

    # -- read-only views --------------------------------------------------------------------------

    @property
    def inflight(self) -> int:
        return self._inflight

    def inflight_of(self, model: str) -> int:
        return self._inflight_model.get(model, 0)

    @property
    def reserved_bytes(self) -> int:
        """Every byte still reserved (lingering reservations included)."""
        return sum(res.held_bytes for res in self._reservations.values())

    def reserved_of(self, model: str) -> int:
        return sum(r.held_bytes for r in self._reservations.values() if r.request.model == model)

    def reserved_scope(self, scope: str) -> int:
        return self._reserved_scope.get(scope, 0)

    def inflight_of_tenant(self, tenant: str) -> int:
        return self._inflight_tenant.get(tenant, 0)

    def reserved_of_tenant(self, tenant: str) -> int:
        """Bytes the tenant's requests hold (lingering reservations included)."""
        return self._reserved_tenant.get(tenant, 0)

    def tenant_usage(self) -> dict[str, tuple[int, int]]:
        """(in flight, reserved bytes) per tenant metrics label: every listed tenant, `default` and
        `other` (all tenants the policy does not list, together), zeros included."""
        out = {label: (0, 0) for label in (*self._tenants, DEFAULT_TENANT, OTHER_TENANTS)}
        for tenant in self._inflight_tenant.keys() | self._reserved_tenant.keys():
            label = self.tenant_label(tenant)
            inflight, reserved = out[label]
            out[label] = (inflight + self.inflight_of_tenant(tenant), reserved + self.reserved_of_tenant(tenant))
        return out

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def waiting_by_class(self) -> dict[str, int]:
        out = {c.name: 0 for c in self.policy.classes}
        for w in self._waiting.values():
            out[w.request.klass] = out.get(w.request.klass, 0) + 1
        return out

    @property
    def lingering(self) -> int:
        return self._lingering

    @property
    def snapshot(self) -> HeadroomSnapshot | None:
        return self._snapshot

    def _tenant_status(self) -> dict[str, dict[str, object]]:
        out: dict[str, dict[str, object]] = {}
        for label, (inflight, reserved) in self.tenant_usage().items():
            quota = self.tenant_quota(label) if label != OTHER_TENANTS else self.policy.default_tenant
            out[label] = {
                "inflight": inflight,
                "reserved_bytes": reserved,
                "max_inflight": quota.max_inflight if quota else None,
                "max_reserved_bytes": quota.max_reserved_bytes if quota else None,
            }
        return out

    def status(self) -> dict[str, object]:
        now = self._now()
        models = {}
        names = {m.name for m in self.policy.models} | {r.request.model for r in self._reservations.values()}
        for name in sorted(names):
            models[name] = {
                "inflight": self.inflight_of(name),
                "reserved_bytes": self.reserved_of(name),
                "oom_risk": self.oom_risk(name),
                "drain_rate_per_s": self.drain_rate(name, now),
                "lower_class_share": self.lower_share(name),  # LowerShare: 1.0 unless the top class is late
            }
            law = self._engine_limits.get(name)
            if law is not None:
                models[name]["engine_limit"] = law.status()
            if name in self._models and self._models[name].kv is not None:
                models[name]["prompt_tokens_counted_by"] = self.prompt_counting(name)
        scopes = {}
        for scope in sorted({d.id for d in self.policy.devices} | {f"pool:{m.name}" for m in self.policy.models if m.kv}):
            reading = self.reading(scope, now)
            cap = self.capacity(scope, now)
            scopes[scope] = {
                "source": reading.source if reading else None,
                "total_bytes": reading.total_bytes if reading else None,
                "used_bytes": reading.used_bytes if reading else None,
                "capacity_bytes": cap,
                "reserved_bytes": self.reserved_scope(scope),
            }
        snap = self._snapshot
        return {
            "inflight": self._inflight,
            "reserved_bytes": self.reserved_bytes,
            "lingering": self._lingering,
            "waiting": self.waiting_by_class(),
            "concurrency_limit": self.limit.value,
            "watermark": round(self.watermark(now), 4),
            "queue_delay_s": self.queue_delay_s(now),
            "models": models,
            "tenants": self._tenant_status(),
            "scopes": scopes,
            "headroom_failures": dict(snap.failures) if snap else {},
            "headroom_age_s": None if snap is None else round(now - snap.taken_at, 3),
        }

