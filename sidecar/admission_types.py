"""The words admission decides in: what a request costs, the limits ("rooms") it is checked against,
the rule that checks it (`decide`), what the state answers, and the headroom readings it is fed.
Pure values, no state.

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
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

from tritongen.core.sidecar_policy.base import DEFAULT_TENANT

Clock = Callable[[], float]


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
    # Prompt blocks an engine that reuses them holds once for every request in flight that begins
    # with them (sidecar/prefix_blocks.py), each `shared_block_bytes`: not in kv_bytes, which is
    # the request's own part; the ledger reserves a shared block while any request holds it.
    shared_keys: tuple[bytes, ...] = ()
    shared_block_bytes: int = 0

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
    # Seconds the request already spent before the sidecar could judge it (in nginx's accept queue and
    # the decision socket's, under a burst of connections): spent out of its class's wait.
    before_s: float = 0.0


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


@dataclass(frozen=True)
class Events:
    """What happened to queued requests since the last `take_events()`."""

    granted: list[Decision]
    expired: list[Decision]

