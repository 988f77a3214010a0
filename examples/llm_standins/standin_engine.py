"""The engine behind the LLM stand-ins (`vllm_standin`, `reserve_llm`): continuous batching whose
costs are sleeps, so every step's duration is exact and known.

One file over 500 lines on purpose: each stand-in's model folder links this one module beside its
`model.py` (Triton's Python backend loads the folder as it is), and the step, its admission policies
and the KV pool below share one state.

Importable without Triton (the tests drive it with a fake clock); the Triton adapters are
`backends/vllm/model.py` and `repository/reserve_llm/1/model.py`, which read the costs from their
model's `1/standin.json`. Nothing computes: a "token" is `bytes_per_token` bytes of the prompt's
UTF-8 (ceil, at least 1), and a generated token's text is a letter and a space (`token_text`).

One engine step (`Engine.step`):
  1. admission, FIFO from the waiting queue, while fewer than `max_running` run (policy below);
  2. each sequence admitted in this step, one after another: its prefill, costing
     `prefill_fixed_ms + prefill_ms_per_token x tokens`, then its first token at once (a
     sequence with max_tokens 1 finishes there). A preempted sequence that is resumed recomputes
     prompt + the tokens it already generated, and emits nothing (it has sent those tokens);
  3. one decode step for every running sequence (those just admitted included), costing
     `decode_fixed_ms + decode_ms_per_seq x n + decode_ms_per_context_token x context`, where
     context is the sum of the batch's cached tokens before the step (the KV it reads); at its
     end each sequence emits one token, and one reaching max_tokens finishes and frees its memory.

"Cached tokens" are the tokens whose KV would be stored: a prefill stores all the tokens it
computed (the prompt, or prompt + generated for a resumed sequence), each decode step one more.

Timing: the engine sleeps until deadlines on its clock (`time.monotonic`): the step starts at
`start`, its k-th stage ends at `start + cost of stages 1..k`, so Python's own work inside a stage
costs nothing as long as it is shorter. A step that follows a busy step starts at that step's last
deadline, and a step that wakes the idle engine at the arrival of the request that woke it, rather
than at "now": the time spent sending the previous step's tokens (and metric updates), or waking
the thread, is absorbed as well, up to `lag_allowance_s` (20 ms): a step lasts max(cost, work).
A step admits only the requests that had arrived when it started: one that arrives while the
previous step's tokens are still being sent waits for the next step, as on an engine whose steps
are not back-dated (admitting it too gave first tokens sooner than their prefill costs).

Policies (`EngineConfig.policy`):
  * `GrowPreempt` (vLLM semantics): `num_blocks` blocks of `block_size` tokens. A sequence is
    admitted when ceil(its prefill tokens / block_size) blocks are free and, unless it is the
    first admitted in this step, its prefill tokens fit what remains of
    `max_num_batched_tokens`; otherwise the head waits and nothing behind it jumps the queue.
    Before the decode step, each running sequence (oldest admitted first) whose cached tokens
    fill its last block takes one more block; with none free the most recently admitted running
    sequence is preempted (blocks freed, back to the FRONT of the waiting queue, counted in
    `preemptions_total`; nothing is killed), until one is free or the sequence preempted itself.
    Refused at once (kind "invalid"): prompt + max_tokens > `max_model_len`, or more blocks than
    the whole pool (such a sequence could never finish: it would preempt itself forever).
  * `ReserveKill` (a naive hand-written backend): a pool of `pool_tokens` tokens. The head, when
    a running slot is free, reserves prompt + max_tokens tokens at once; if that exceeds the free
    pool it is killed at once (kind "oom", message "out of memory: ...", `killed_total`) and the
    next one is tried. The reservation is freed when the sequence finishes.

Cancellation: a sequence's `sink.cancelled()` is asked when it is admitted and then every
`cancel_check_every` generated tokens; a cancelled sequence is freed and ends with
`sink.error(..., "cancelled")`.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

# ---------------------------------------------------------------------------------------------
# Costs, tokens, policies
# ---------------------------------------------------------------------------------------------


def _at_least(obj: object, minimum: float) -> None:
    """Every field of the dataclass `obj` must be >= minimum."""
    for f in fields(obj):  # type: ignore[arg-type]
        if getattr(obj, f.name) < minimum:
            raise ValueError(f"{f.name} must be >= {minimum}, got {getattr(obj, f.name)}")


@dataclass(frozen=True)
class Costs:
    """The stand-in's "hardware": `standin.json` holds exactly these keys."""

    prefill_fixed_ms: float = 0.0
    prefill_ms_per_token: float = 0.0
    decode_fixed_ms: float = 0.0
    decode_ms_per_seq: float = 0.0
    decode_ms_per_context_token: float = 0.0
    bytes_per_token: int = 4

    def __post_init__(self) -> None:
        _at_least(self, 0)
        if self.bytes_per_token < 1:
            raise ValueError(f"bytes_per_token must be >= 1, got {self.bytes_per_token}")

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> "Costs":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown cost keys {unknown}; known: {sorted(known)}")
        kwargs: dict[str, Any] = {}
        for key, value in values.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{key} must be a number, got {value!r}")
            kwargs[key] = int(value) if key == "bytes_per_token" else float(value)
        if "bytes_per_token" in values and values["bytes_per_token"] != kwargs["bytes_per_token"]:
            raise ValueError(f"bytes_per_token must be a whole number, got {values['bytes_per_token']!r}")
        return cls(**kwargs)

    @classmethod
    def from_file(cls, path: str | Path) -> "Costs":
        with open(path, encoding="utf-8") as handle:
            values = json.load(handle)
        if not isinstance(values, dict):
            raise ValueError(f"{path}: expected a JSON object of costs")
        try:
            return cls.from_mapping(values)
        except ValueError as err:
            raise ValueError(f"{path}: {err}") from err

    def tokens(self, prompt: bytes) -> int:
        """Prompt tokens: its bytes / bytes_per_token, rounded up, at least 1."""
        return max(1, math.ceil(len(prompt) / self.bytes_per_token))

    def prefill_s(self, tokens: int) -> float:
        return (self.prefill_fixed_ms + self.prefill_ms_per_token * tokens) / 1000.0

    def decode_s(self, seqs: int, context_tokens: int) -> float:
        return (
            self.decode_fixed_ms + self.decode_ms_per_seq * seqs + self.decode_ms_per_context_token * context_tokens
        ) / 1000.0


def token_text(index: int) -> str:
    """The text of the index-th generated token (0-based): a letter and a space."""
    return chr(ord("a") + index % 26) + " "


def output_text(count: int) -> str:
    """The whole output of `count` tokens."""
    return "".join(token_text(i) for i in range(count))


@dataclass(frozen=True)
class GrowPreempt:
    """vLLM's paged KV cache: grow a block at a time, preempt (recompute) when none is free."""

    num_blocks: int
    block_size: int = 16
    max_num_batched_tokens: int = 2048
    max_model_len: int = 2048

    def __post_init__(self) -> None:
        _at_least(self, 1)

    def blocks_for(self, tokens: int) -> int:
        return math.ceil(tokens / self.block_size)


@dataclass(frozen=True)
class ReserveKill:
    """Reserve prompt + max_tokens up front; kill what does not fit."""

    pool_tokens: int

    def __post_init__(self) -> None:
        _at_least(self, 1)


@dataclass(frozen=True)
class EngineConfig:
    costs: Costs
    policy: GrowPreempt | ReserveKill
    max_running: int
    cancel_check_every: int = 8

    def __post_init__(self) -> None:
        if min(self.max_running, self.cancel_check_every) < 1:
            raise ValueError(f"max_running and cancel_check_every must be >= 1: {self}")


# ---------------------------------------------------------------------------------------------
# Sinks, sequences, statistics
# ---------------------------------------------------------------------------------------------


class Sink:
    """Where a sequence's output goes (the Triton adapters send responses; tests collect).

    Exactly one of `token(..., final=True)` or `error()` ends a request.
    """

    def token(self, text: str, index: int, final: bool) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def error(self, message: str, kind: str) -> None:  # pragma: no cover - interface
        """kind: "invalid" (refused), "oom" (killed: out of memory), "cancelled",
        "unavailable" (engine stopping) or "internal"."""
        raise NotImplementedError

    def cancelled(self) -> bool:
        return False


class CollectingSink(Sink):
    """Records each token with the clock's time; `done` is set when the request ended."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.tokens: list[tuple[float, str]] = []  # (time, text)
        self.error_message: str | None = None
        self.error_kind: str | None = None
        self.error_time: float | None = None
        self.done = threading.Event()

    texts = property(lambda self: [text for _t, text in self.tokens])
    times = property(lambda self: [t for t, _text in self.tokens])
    text = property(lambda self: "".join(self.texts))

    def token(self, text: str, index: int, final: bool) -> None:
        assert index == len(self.tokens), f"token {index} arrived after {len(self.tokens)} tokens"
        self.tokens.append((self.clock(), text))
        if final:
            self.done.set()

    def error(self, message: str, kind: str) -> None:
        self.error_message, self.error_kind, self.error_time = message, kind, self.clock()
        self.done.set()


@dataclass(eq=False)
class Sequence:
    request_id: int
    prompt_tokens: int
    max_tokens: int
    sink: Sink
    arrival: float = 0.0  # the engine clock when it was submitted
    generated: int = 0
    cached: int = 0  # tokens whose KV is stored (see the module docstring)
    blocks: int = 0  # GrowPreempt: blocks held
    reserved: int = 0  # ReserveKill: tokens reserved
    preemptions: int = 0
    done: bool = False


@dataclass
class Totals:
    """The engine's counters (it keeps one, and stats() copies it)."""

    preemptions_total: int = 0
    killed_total: int = 0
    prompt_tokens_total: int = 0  # each request's prompt once (a recompute does not count again)
    generation_tokens_total: int = 0
    finished_total: int = 0
    steps: int = 0


@dataclass
class EngineStats(Totals):
    """A snapshot: the counters plus the queue and the memory (blocks or tokens) now."""

    running: int = 0
    waiting: int = 0
    memory_used: int = 0
    memory_total: int = 0

    @property
    def memory_usage(self) -> float:
        """Used / total, 0..1 (vLLM's kv_cache_usage_perc)."""
        return self.memory_used / self.memory_total if self.memory_total else 0.0


class RequestRefused(ValueError):
    pass


# ---------------------------------------------------------------------------------------------
# The engine
# ---------------------------------------------------------------------------------------------


class Engine:
    """Continuous batching over sleeps. Drive it with `step()` / `run_until_idle()` or `start()`.

    `submit()` may be called from any thread; everything else (`step()`, the running batch, the
    memory) belongs to one thread: the engine thread after `start()`, else the caller of `step()`.
    `clock` and `sleep` are injectable (a fake clock whose sleep advances it makes tests exact).
    """

    def __init__(
        self,
        cfg: EngineConfig,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        on_step: Callable[[EngineStats], None] | None = None,
        lag_allowance_s: float = 0.02,
    ) -> None:
        self.cfg = cfg
        self.clock = clock
        self.sleep = sleep
        self.on_step = on_step
        self.lag_allowance_s = lag_allowance_s
        policy = cfg.policy
        self.memory_total = policy.num_blocks if isinstance(policy, GrowPreempt) else policy.pool_tokens
        self.memory_free = self.memory_total
        self.running: list[Sequence] = []  # in admission order: the last one is the newest
        self._waiting: deque[Sequence] = deque()
        self._cond = threading.Condition()
        self._next_id = 0
        self._stop = False
        self._thread: threading.Thread | None = None
        self._deadline: float | None = None  # the last deadline of the previous busy step
        self.totals = Totals()

    # -- requests ------------------------------------------------------------------------------

    def check(self, prompt_tokens: int, max_tokens: int) -> None:
        """Raise RequestRefused for a request this engine refuses at once."""
        if max_tokens < 1:
            raise RequestRefused(f"max_tokens must be at least 1, got {max_tokens}")
        policy = self.cfg.policy
        if isinstance(policy, GrowPreempt):
            total = prompt_tokens + max_tokens
            if total > policy.max_model_len:
                raise RequestRefused(
                    f"this model's maximum context length is {policy.max_model_len} tokens, but the request "
                    f"needs {total} ({prompt_tokens} in the prompt, {max_tokens} to generate)"
                )
            if policy.blocks_for(total) > policy.num_blocks:
                raise RequestRefused(
                    f"the request needs {policy.blocks_for(total)} KV cache blocks of {policy.block_size} tokens "
                    f"({total} tokens) but the cache has {policy.num_blocks}"
                )

    def submit(self, prompt: bytes | str, max_tokens: int, sink: Sink) -> bool:
        """Queue a request; False (after `sink.error`) when it is refused at once."""
        data = prompt.encode("utf-8") if isinstance(prompt, str) else bytes(prompt)
        tokens = self.cfg.costs.tokens(data)
        try:
            self.check(tokens, int(max_tokens))
        except RequestRefused as err:
            _tell(sink.error, str(err), "invalid")
            return False
        with self._cond:
            if self._stop:
                stopped = True
            else:
                stopped = False
                self._waiting.append(Sequence(self._next_id, tokens, int(max_tokens), sink, self.clock()))
                self._next_id += 1
                self._cond.notify()
        if stopped:
            _tell(sink.error, STOPPED, "unavailable")
            return False
        return True

    def stats(self) -> EngineStats:
        with self._cond:
            waiting = len(self._waiting)
        used = self.memory_total - self.memory_free
        return EngineStats(**asdict(self.totals), running=len(self.running), waiting=waiting, memory_used=used,
                           memory_total=self.memory_total)

    def has_work(self) -> bool:
        with self._cond:
            return bool(self._waiting) or bool(self.running)

    # -- one step ------------------------------------------------------------------------------

    def step(self) -> bool:
        """Admission, prefills, one decode step (see the module docstring). True if it did work."""
        t = self._start_time()
        costs = self.cfg.costs
        admitted = self._admit(t)
        for seq in admitted:
            if self._cancelled(seq):
                continue
            resumed = seq.generated > 0
            tokens = seq.prompt_tokens + seq.generated
            t += costs.prefill_s(tokens)
            self._sleep_until(t)
            seq.cached = tokens
            if not resumed:
                self.totals.prompt_tokens_total += seq.prompt_tokens
                self._emit(seq)
        batch = self._decode_batch()
        if batch:
            t += costs.decode_s(len(batch), sum(s.cached for s in batch))
            self._sleep_until(t)
            for seq in batch:
                seq.cached += 1
                self._emit(seq)
        self.running = [s for s in self.running if not s.done]
        self._deadline = t if (admitted or batch) else None
        self.totals.steps += 1
        if self.on_step is not None:
            self.on_step(self.stats())
        return bool(admitted or batch)

    def _start_time(self) -> float:
        """When this step counts as started: the previous busy step's last deadline, or, after
        idling, the arrival of the request that woke the engine (so neither the sending of the
        last tokens nor the thread's wake-up adds to the costs), but never more than
        lag_allowance_s before now."""
        now = self.clock()
        anchor = self._deadline
        if not self.running:
            with self._cond:
                arrival = self._waiting[0].arrival if self._waiting else None
            if arrival is not None:
                anchor = arrival if anchor is None else max(anchor, arrival)
        return now if anchor is None else min(now, max(anchor, now - self.lag_allowance_s))

    def run_until_idle(self, max_steps: int = 1_000_000) -> int:
        """Step until nothing waits or runs; returns the steps taken."""
        taken = 0
        while self.has_work():
            if taken == max_steps:
                raise RuntimeError(f"the stand-in engine was still busy after {max_steps} steps")
            self.step()
            taken += 1
        return taken

    def _sleep_until(self, deadline: float) -> None:
        remaining = deadline - self.clock()
        if remaining > 0:
            self.sleep(remaining)

    def _admit(self, start: float) -> list[Sequence]:
        """Pop the sequences this step admits (memory taken); kill what ReserveKill cannot hold.

        Only requests that had arrived when the step started (`start`, which may lie a little before
        now: see `_start_time`) join it; a later one waits for the next step, as it would on an engine
        whose steps are not back-dated. Admitting it too let its first token come sooner than its
        prefill costs (TTFT under load below prefill + path), which no real engine does."""
        policy = self.cfg.policy
        admitted: list[Sequence] = []
        killed: list[tuple[Sequence, str]] = []
        batched = 0
        with self._cond:
            while self._waiting and len(self.running) < self.cfg.max_running:
                head = self._waiting[0]
                if head.arrival > start:
                    break
                if isinstance(policy, GrowPreempt):
                    tokens = head.prompt_tokens + head.generated
                    if admitted and batched + tokens > policy.max_num_batched_tokens:
                        break
                    need = policy.blocks_for(tokens)
                    if need > self.memory_free:
                        break
                    self._waiting.popleft()
                    head.blocks = need
                    batched += tokens
                else:
                    self._waiting.popleft()
                    need = head.prompt_tokens + head.max_tokens
                    if need > self.memory_free:
                        self.totals.killed_total += 1
                        killed.append((head, (
                            f"out of memory: the request needs {need} tokens ({head.prompt_tokens} prompt + "
                            f"{head.max_tokens} max_tokens) but {self.memory_free} of {self.memory_total} are free"
                        )))
                        continue
                    head.reserved = need
                self.memory_free -= need
                self.running.append(head)
                admitted.append(head)
        for seq, message in killed:
            seq.done = True
            _tell(seq.sink.error, message, "oom")
        return admitted

    def _decode_batch(self) -> list[Sequence]:
        """The running sequences that decode this step, after cancellation, growth and preemption."""
        every = self.cfg.cancel_check_every
        alive = [s for s in self.running if not s.done and not (s.generated % every == 0 and self._cancelled(s))]
        policy = self.cfg.policy
        if not isinstance(policy, GrowPreempt):
            return alive
        preempted: list[Sequence] = []
        i = 0
        while i < len(alive):
            seq = alive[i]
            if seq.cached >= seq.blocks * policy.block_size:  # its last block is full
                while self.memory_free == 0 and seq in alive:
                    victim = alive.pop()
                    self._preempt(victim)
                    preempted.append(victim)
                if seq not in alive:
                    break
                seq.blocks += 1
                self.memory_free -= 1
            i += 1
        if preempted:
            self.running = [s for s in self.running if s not in preempted]
            with self._cond:
                self._waiting.extendleft(preempted)  # reversed: the oldest admitted ends up first
        return alive

    def _preempt(self, seq: Sequence) -> None:
        self.memory_free += seq.blocks
        seq.blocks = 0
        seq.cached = 0
        seq.preemptions += 1
        self.totals.preemptions_total += 1

    def _emit(self, seq: Sequence) -> None:
        index = seq.generated
        seq.generated += 1
        self.totals.generation_tokens_total += 1
        final = seq.generated >= seq.max_tokens
        if final:
            self.totals.finished_total += 1
            self._release(seq)
        if not _tell(seq.sink.token, token_text(index), index, final):
            self._release(seq)  # the client is gone: stop generating for it

    def _cancelled(self, seq: Sequence) -> bool:
        try:
            cancelled = bool(seq.sink.cancelled())
        except Exception:  # noqa: BLE001 - a sender that cannot answer belongs to a gone client
            cancelled = True
        if cancelled:
            self._release(seq)
            _tell(seq.sink.error, "request cancelled", "cancelled")
        return cancelled

    def _release(self, seq: Sequence) -> None:
        self.memory_free += seq.blocks + seq.reserved
        seq.blocks = seq.reserved = 0
        seq.done = True

    # -- background thread ---------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="standin-engine", daemon=True)
            self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop for good: waiting and running requests end with an "unavailable" error (the thread
        fails them itself after its step in progress, so a join that times out races nothing)."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        thread, self._thread = self._thread, None
        if thread is None:
            self._fail(self._drain(), STOPPED, "unavailable")
        else:
            thread.join(timeout_s)

    def _drain(self) -> list[Sequence]:
        """Take every running and waiting sequence out of the engine."""
        with self._cond:
            taken = [*self.running, *self._waiting]
            self._waiting.clear()
        self.running = []
        return taken

    def _fail(self, seqs: list[Sequence], message: str, kind: str) -> None:
        for seq in seqs:
            if not seq.done:
                self._release(seq)
                _tell(seq.sink.error, message, kind)

    def _serve(self) -> None:
        try:
            while True:
                with self._cond:
                    self._cond.wait_for(lambda: self._stop or self._waiting or self.running)
                    if self._stop:
                        return
                try:
                    self.step()
                except Exception as err:  # noqa: BLE001 - keep serving; fail what was in flight
                    running, self.running = self.running, []
                    self._fail(running, f"stand-in engine error: {type(err).__name__}: {err}", "internal")
        finally:
            self._fail(self._drain(), STOPPED, "unavailable")


STOPPED = "the engine stopped (model unloading)"


def _tell(method: Callable[..., None], *args: Any) -> bool:
    """Call a sink method; False when it raised (its client is gone)."""
    try:
        method(*args)
    except Exception:  # noqa: BLE001 - one broken sender must not stop the engine
        return False
    return True
