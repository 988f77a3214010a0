"""tinyllm: a small decoder-only transformer in numpy with an LLM serving engine around it.

One file over 500 lines on purpose: Triton's Python backend loads a model version's folder as it is,
so the engine travels as this one module beside `model.py` (every deployment, the k8s bundle and the
demo copy the folder); its pieces below share the pool and the batch state.

Importable without Triton: the Triton model (`model.py` beside this file) only adapts requests and
responses; tests drive the same engine in-process and compare texts with what the server streams.

Pieces, in the order a request meets them:
  * `EngineConfig`: every tunable, read from Triton's `parameters` by `EngineConfig.from_parameters`.
  * byte-level tokenizer: a prompt's UTF-8 bytes are its token ids; generated ids are decoded with a
    streaming UTF-8 decoder (errors="replace"), so the texts sent per token concatenate to exactly
    `bytes(ids).decode("utf-8", errors="replace")`.
  * `BlockPool`: the paged KV cache, a fixed pool of `kv_pool_blocks` blocks of `kv_block_tokens`
    tokens, allocated up front (the model's "device memory"); sequences hold block tables.
  * `TinyLLM`: weights from a seeded generator; RMSNorm, rotary positions, grouped-query attention
    that reads K/V from the pool through the block table, SwiGLU MLP, greedy decoding.
  * `Engine`: continuous batching. Between decode steps it admits waiting requests (up to
    `max_num_seqs`), prefills the newcomers, runs ONE decode step for the whole running batch,
    streams each sequence its token and retires finished sequences at once (their blocks go back
    to the pool). A request the pool cannot hold fails with an explicit out-of-memory error.

Numerics: decode is batch-invariant. The projections of a batch are computed as stacked
row-vector products (`x[:, None, :] @ W`), which numpy evaluates row by row with the same kernel
whatever the batch size, and attention runs per sequence over that sequence's own blocks; so a
sequence's logits are bit-identical whether it decodes alone or with seven others, and greedy text
from a busy server equals the text computed in-process. (A plain `[B, H] @ W` is not: OpenBLAS
picks a different kernel for B=1 and B=8 and the last bits differ.)
"""

from __future__ import annotations

import codecs
import threading
import time
from collections import deque
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Iterable, Mapping

import numpy as np

# ---------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------

FLOAT = np.float32
KV_DTYPE_BYTES = 4  # the KV cache is float32


# What tinyllm does when its pool runs dry (tritongen's documented engine parameter kv_policy).
KV_POLICY = "grow_kill"


@dataclass(frozen=True)
class EngineConfig:
    """Architecture and serving knobs; the field names are the config.pbtxt parameter keys."""

    num_layers: int = 2
    hidden_size: int = 64
    num_heads: int = 4
    num_kv_heads: int = 2
    vocab_size: int = 256
    max_context: int = 256
    seed: int = 11
    kv_block_tokens: int = 16
    kv_pool_blocks: int = 64
    max_num_seqs: int = 8
    default_max_tokens: int = 16
    intermediate_size: int = 0  # 0 means 4 x hidden_size
    head_dim: int = 0  # 0 means hidden_size / num_heads

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"tinyllm parameter {f.name} must be an integer, got {value!r}")
            minimum = 0 if f.name in ("seed", "default_max_tokens", "intermediate_size", "head_dim") else 1
            if value < minimum:
                raise ValueError(f"tinyllm parameter {f.name} must be >= {minimum}, got {value}")
        if self.head_dim == 0:
            if self.hidden_size % self.num_heads:
                raise ValueError(
                    f"tinyllm: hidden_size {self.hidden_size} must be a multiple of num_heads "
                    f"{self.num_heads} (or give head_dim)"
                )
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"tinyllm: num_heads {self.num_heads} must be a multiple of num_kv_heads {self.num_kv_heads}"
            )
        if self.head_dim % 2:
            raise ValueError(f"tinyllm: head_dim {self.head_dim} must be even (rotary positions)")
        if self.vocab_size < 256:
            raise ValueError(
                f"tinyllm: vocab_size {self.vocab_size} must be >= 256 (byte-level tokenizer: ids 0..255 are bytes)"
            )

    @property
    def ffn_size(self) -> int:
        return self.intermediate_size or 4 * self.hidden_size

    @property
    def kv_bytes_per_token(self) -> int:
        """2 (K and V) x layers x kv_heads x head_dim x 4 bytes: 512 with the defaults."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * KV_DTYPE_BYTES

    @property
    def kv_pool_bytes(self) -> int:
        return self.kv_bytes_per_token * self.kv_block_tokens * self.kv_pool_blocks

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.kv_block_tokens)

    @classmethod
    def parameter_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def from_parameters(cls, parameters: Mapping[str, Any] | None) -> "EngineConfig":
        """Build from Triton's `json.loads(args["model_config"])["parameters"]`.

        Accepts `{"key": {"string_value": "8"}}` (what Triton passes) or plain `{"key": "8"}` / ints.
        Keys this engine does not know are ignored (a renderer may add backend-wide parameters);
        an empty string_value means "use the default".
        """
        known = set(cls.parameter_names())
        values: dict[str, int] = {}
        policy = (parameters or {}).get("kv_policy")
        policy = policy.get("string_value", "") if isinstance(policy, Mapping) else policy
        if policy and str(policy).strip() != KV_POLICY:
            raise ValueError(
                f"tinyllm's engine takes KV blocks as tokens come and kills the sequence that finds none "
                f"(kv_policy {KV_POLICY}); the config says kv_policy {policy!r}"
            )
        for key, raw in (parameters or {}).items():
            if key not in known:
                continue
            text = raw.get("string_value", "") if isinstance(raw, Mapping) else raw
            if isinstance(text, str):
                text = text.strip()
                if text == "":
                    continue
                try:
                    values[key] = int(text)
                except ValueError as err:
                    raise ValueError(f"tinyllm parameter {key} must be an integer, got {text!r}") from err
            else:
                values[key] = text  # type: ignore[assignment]
        return cls(**values)


# ---------------------------------------------------------------------------------------------
# Errors and tokenizer
# ---------------------------------------------------------------------------------------------


class EngineError(Exception):
    """A request the engine refuses or cannot finish; str(err) is the message sent to the client."""


class RequestRejected(EngineError):
    """The request is invalid for this engine (empty prompt, over max_context, bad max_tokens)."""


class KVCacheOOM(EngineError):
    """The block pool has fewer free blocks than a request needs."""

    def __init__(self, needed: int, free: int, total: int) -> None:
        self.needed, self.free, self.total = needed, free, total
        super().__init__(
            f"out of memory: KV cache pool exhausted (needed {needed} blocks, {free} free of {total})"
        )


def encode(text: str | bytes) -> np.ndarray:
    """Byte-level tokenizer: the UTF-8 bytes are the token ids."""
    data = text if isinstance(text, bytes) else text.encode("utf-8")
    return np.frombuffer(data, dtype=np.uint8).astype(np.int64)


def decode(ids: Iterable[int]) -> str:
    return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


class StreamDecoder:
    """Per-token text for streaming: an incremental UTF-8 decoder (errors="replace").

    A token that ends in the middle of a multi-byte character yields "" and the character comes
    with a later token, so the pieces concatenate to `decode(all ids)`. Ids >= 256 (a vocabulary
    above the byte range) carry no text.
    """

    def __init__(self) -> None:
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def piece(self, token_id: int, final: bool) -> str:
        data = bytes([token_id]) if 0 <= token_id < 256 else b""
        return self._dec.decode(data, final=final)


# ---------------------------------------------------------------------------------------------
# Paged KV cache
# ---------------------------------------------------------------------------------------------


class BlockPool:
    """A fixed pool of KV blocks, allocated (and touched) once, up front.

    k, v: float32 arrays [num_layers, kv_pool_blocks, kv_block_tokens, num_kv_heads, head_dim].
    Token t of a sequence lives in block `block_table[t // kv_block_tokens]`, slot
    `t % kv_block_tokens`. Not thread-safe: one engine thread owns it.
    """

    def __init__(self, cfg: EngineConfig) -> None:
        self.cfg = cfg
        shape = (cfg.num_layers, cfg.kv_pool_blocks, cfg.kv_block_tokens, cfg.num_kv_heads, cfg.head_dim)
        self.k = np.empty(shape, dtype=FLOAT)
        self.v = np.empty(shape, dtype=FLOAT)
        self.k.fill(0.0)  # touch every page: the pool is resident like reserved device memory
        self.v.fill(0.0)
        self._free: deque[int] = deque(range(cfg.kv_pool_blocks))
        self._in_use: set[int] = set()

    @property
    def total(self) -> int:
        return self.cfg.kv_pool_blocks

    @property
    def free_count(self) -> int:
        return len(self._free)

    @property
    def used(self) -> int:
        return len(self._in_use)

    @property
    def nbytes(self) -> int:
        return int(self.k.nbytes + self.v.nbytes)

    def allocate(self, n: int) -> list[int]:
        """n blocks, or KVCacheOOM (nothing is taken then)."""
        if n > len(self._free):
            raise KVCacheOOM(n, len(self._free), self.total)
        blocks = [self._free.popleft() for _ in range(n)]
        self._in_use.update(blocks)
        return blocks

    def release(self, blocks: Iterable[int]) -> None:
        for b in blocks:
            if b not in self._in_use:
                raise RuntimeError(f"KV block {b} released twice or never allocated")
            self._in_use.remove(b)
            self._free.append(b)


# ---------------------------------------------------------------------------------------------
# The network
# ---------------------------------------------------------------------------------------------


def _rows(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """[B, n] @ [n, m] computed row by row (batch-invariant bits); see the module docstring."""
    return np.matmul(x[:, None, :], w)[:, 0, :]


def _rms_norm(x: np.ndarray, weight: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + FLOAT(eps)) * weight


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (FLOAT(1.0) + np.exp(-x))


def _softmax_inplace(scores: np.ndarray) -> np.ndarray:
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)
    return scores


@dataclass
class _Layer:
    attn_norm: np.ndarray
    wq: np.ndarray
    wk: np.ndarray
    wv: np.ndarray
    wo: np.ndarray
    mlp_norm: np.ndarray
    w_gate: np.ndarray
    w_up: np.ndarray
    w_down: np.ndarray


class TinyLLM:
    """Weights and math. Stateless apart from the weights: K/V live in the BlockPool."""

    def __init__(self, cfg: EngineConfig) -> None:
        self.cfg = cfg
        rng = np.random.default_rng(cfg.seed)
        h, f, hd = cfg.hidden_size, cfg.ffn_size, cfg.head_dim
        qd, kvd = cfg.num_heads * hd, cfg.num_kv_heads * hd

        def dense(n_in: int, n_out: int) -> np.ndarray:
            return (rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(FLOAT)

        def norm(n: int) -> np.ndarray:
            return (1.0 + 0.1 * rng.standard_normal(n)).astype(FLOAT)

        self.embed = rng.standard_normal((cfg.vocab_size, h)).astype(FLOAT)
        self.layers = [
            _Layer(
                attn_norm=norm(h),
                wq=dense(h, qd),
                wk=dense(h, kvd),
                wv=dense(h, kvd),
                wo=dense(qd, h),
                mlp_norm=norm(h),
                w_gate=dense(h, f),
                w_up=dense(h, f),
                w_down=dense(f, h),
            )
            for _ in range(cfg.num_layers)
        ]
        self.final_norm = norm(h)
        self.lm_head = dense(h, cfg.vocab_size)
        # Output bias: an untrained byte model would babble invalid UTF-8; this one is steered to
        # printable ASCII and newline so streamed text stays readable. Prompts may hold any bytes.
        self.lm_bias = np.full(cfg.vocab_size, -1.0e4, dtype=FLOAT)
        self.lm_bias[32:127] = 0.0
        self.lm_bias[ord("\n")] = 0.0
        inv_freq = 1.0 / (10000.0 ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
        angles = np.outer(np.arange(cfg.max_context, dtype=np.float64), inv_freq)
        self.cos = np.cos(angles).astype(FLOAT)  # [max_context, head_dim / 2]
        self.sin = np.sin(angles).astype(FLOAT)
        self.scale = FLOAT(1.0 / np.sqrt(hd))

    @property
    def weight_bytes(self) -> int:
        arrays = [self.embed, self.final_norm, self.lm_head, self.lm_bias]
        for layer in self.layers:
            arrays.extend(vars(layer).values())
        return int(sum(a.nbytes for a in arrays))

    def _rope(self, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """x [n, heads, head_dim] rotated by the angles of `positions` [n]."""
        half = self.cfg.head_dim // 2
        cos = self.cos[positions][:, None, :]
        sin = self.sin[positions][:, None, :]
        x1, x2 = x[..., :half], x[..., half:]
        return np.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)

    def prefill(self, tokens: np.ndarray, block_table: list[int], pool: BlockPool) -> np.ndarray:
        """Run the whole prompt, write its K/V into the pool, return the last position's logits [V].

        The attention scores are materialised as a [num_heads, P, P] float32 array per layer, so
        prefill memory grows with the square of the prompt length.
        """
        cfg = self.cfg
        n = int(len(tokens))
        nh, nkv, hd, T = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.kv_block_tokens
        group = nh // nkv
        positions = np.arange(n)
        table = np.asarray(block_table, dtype=np.intp)
        slot_blocks, slot_offsets = table[positions // T], positions % T
        causal = np.triu(np.ones((n, n), dtype=bool), k=1)
        x = self.embed[np.asarray(tokens, dtype=np.intp)]
        for li, layer in enumerate(self.layers):
            h = _rms_norm(x, layer.attn_norm)
            q = self._rope((h @ layer.wq).reshape(n, nh, hd), positions)
            k = self._rope((h @ layer.wk).reshape(n, nkv, hd), positions)
            v = (h @ layer.wv).reshape(n, nkv, hd)
            pool.k[li, slot_blocks, slot_offsets] = k
            pool.v[li, slot_blocks, slot_offsets] = v
            keys = pool.k[li, table].reshape(-1, nkv, hd)[:n]  # read back through the block table
            values = pool.v[li, table].reshape(-1, nkv, hd)[:n]
            qh = q.reshape(n, nkv, group, hd).transpose(1, 2, 0, 3)  # [nkv, group, n, hd]
            scores = qh @ keys.transpose(1, 2, 0)[:, None]  # [nkv, group, n, n] == [heads, n, n]
            scores *= self.scale
            scores[..., causal] = -np.inf
            _softmax_inplace(scores)
            out = scores @ values.transpose(1, 0, 2)[:, None]  # [nkv, group, n, hd]
            del scores
            x = x + out.transpose(2, 0, 1, 3).reshape(n, nh * hd) @ layer.wo
            h = _rms_norm(x, layer.mlp_norm)
            x = x + (_silu(h @ layer.w_gate) * (h @ layer.w_up)) @ layer.w_down
        last = _rms_norm(x[-1:], self.final_norm)
        return _rows(last, self.lm_head)[0] + self.lm_bias

    def decode(
        self,
        tokens: np.ndarray,
        positions: np.ndarray,
        block_tables: list[list[int]],
        pool: BlockPool,
    ) -> np.ndarray:
        """One decode step for a batch: token b sits at position positions[b] of sequence b.

        Writes each token's K/V into its slot (the block must already be in its table), attends
        over positions 0..positions[b] read from the pool, returns logits [B, V].
        """
        cfg = self.cfg
        bsz = len(tokens)
        nh, nkv, hd, T = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.kv_block_tokens
        group = nh // nkv
        positions = np.asarray(positions, dtype=np.intp)
        slot_blocks = np.array([bt[p // T] for bt, p in zip(block_tables, positions)], dtype=np.intp)
        slot_offsets = positions % T
        tables = [np.asarray(bt[: p // T + 1], dtype=np.intp) for bt, p in zip(block_tables, positions)]
        x = self.embed[np.asarray(tokens, dtype=np.intp)]
        attn = np.empty((bsz, nh * hd), dtype=FLOAT)
        for li, layer in enumerate(self.layers):
            h = _rms_norm(x, layer.attn_norm)
            q = self._rope(_rows(h, layer.wq).reshape(bsz, nh, hd), positions)
            k = self._rope(_rows(h, layer.wk).reshape(bsz, nkv, hd), positions)
            v = _rows(h, layer.wv).reshape(bsz, nkv, hd)
            pool.k[li, slot_blocks, slot_offsets] = k
            pool.v[li, slot_blocks, slot_offsets] = v
            k_layer, v_layer = pool.k[li], pool.v[li]
            for b in range(bsz):  # paged attention: each sequence over its own blocks
                length = int(positions[b]) + 1
                keys = k_layer[tables[b]].reshape(-1, nkv, hd)[:length]
                values = v_layer[tables[b]].reshape(-1, nkv, hd)[:length]
                scores = q[b].reshape(nkv, group, hd) @ keys.transpose(1, 2, 0)  # [nkv, group, L]
                scores *= self.scale
                _softmax_inplace(scores)
                attn[b] = (scores @ values.transpose(1, 0, 2)).reshape(-1)  # [nkv, group, hd]
            x = x + _rows(attn, layer.wo)
            h = _rms_norm(x, layer.mlp_norm)
            x = x + _rows(_silu(_rows(h, layer.w_gate)) * _rows(h, layer.w_up), layer.w_down)
        return _rows(_rms_norm(x, self.final_norm), self.lm_head) + self.lm_bias


# ---------------------------------------------------------------------------------------------
# Requests, sinks and the continuous-batching engine
# ---------------------------------------------------------------------------------------------


class TokenSink:
    """Where a sequence's output goes. The Triton model sends responses; tests collect.

    Exactly one of `token(..., final=True)`, `finish()` or `error()` ends a request.
    """

    def token(self, text: str, token_id: int, final: bool) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def finish(self) -> None:
        """End without a token (max_tokens 0, or the client cancelled)."""

    def error(self, message: str, kind: str = "internal") -> None:  # pragma: no cover - interface
        """End with an error; kind is "invalid" (bad request), "oom" (KV pool exhausted),
        "unavailable" (engine stopping) or "internal"."""
        raise NotImplementedError

    def cancelled(self) -> bool:
        return False


class CollectingSink(TokenSink):
    """Collects pieces in memory; `done` is set when the request ended."""

    def __init__(self) -> None:
        self.pieces: list[str] = []
        self.ids: list[int] = []
        self.error_message: str | None = None
        self.error_kind: str | None = None
        self.done = threading.Event()

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    def token(self, text: str, token_id: int, final: bool) -> None:
        self.pieces.append(text)
        self.ids.append(token_id)
        if final:
            self.done.set()

    def finish(self) -> None:
        self.done.set()

    def error(self, message: str, kind: str = "internal") -> None:
        self.error_message = message
        self.error_kind = kind
        self.done.set()


@dataclass(eq=False)
class Sequence:
    request_id: int
    prompt: np.ndarray
    max_tokens: int
    sink: TokenSink
    block_table: list[int] = field(default_factory=list)
    cache_len: int = 0  # tokens whose K/V are in the pool
    generated: list[int] = field(default_factory=list)
    done: bool = False
    decoder: StreamDecoder = field(default_factory=StreamDecoder)


@dataclass(frozen=True)
class EngineStats:
    kv_blocks_used: int
    kv_blocks_total: int
    kv_bytes_per_token: int
    kv_block_tokens: int
    running_sequences: int
    waiting_sequences: int
    oom_errors_total: int
    generated_tokens_total: int
    decode_steps_total: int  # batched decode iterations: generated tokens / steps = mean batch


class Engine:
    """Continuous batching over one BlockPool. Drive it with `step()` or a background thread.

    Thread-safety: `submit()` may be called from any thread; everything else that mutates state
    (`step()`, the pool, the running batch) belongs to one thread: the engine thread after
    `start()`, or the caller of `step()` / `run_until_idle()` without it.
    """

    def __init__(
        self,
        cfg: EngineConfig,
        model: TinyLLM | None = None,
        on_step: Callable[[EngineStats], None] | None = None,
    ) -> None:
        self.cfg = cfg
        self.model = model if model is not None else TinyLLM(cfg)
        self.pool = BlockPool(cfg)
        self.on_step = on_step
        self.running: list[Sequence] = []
        self._waiting: deque[Sequence] = deque()
        self._cond = threading.Condition()
        self._next_id = 0
        self._stop = False
        self._thread: threading.Thread | None = None
        self.oom_errors_total = 0
        self.generated_tokens_total = 0
        self.decode_steps_total = 0
        self.steps = 0
        self.last_decode_batch = 0
        self.last_decode_s = 0.0
        self.last_prefill_s = 0.0

    # -- requests ------------------------------------------------------------------------------

    def validate(self, prompt: np.ndarray, max_tokens: int) -> None:
        cfg = self.cfg
        if max_tokens < 0:
            raise RequestRejected(f"max_tokens must be >= 0, got {max_tokens}")
        if len(prompt) == 0:
            raise RequestRejected("text_input is empty: the prompt needs at least one byte")
        if len(prompt) + max_tokens > cfg.max_context:
            raise RequestRejected(
                f"request exceeds max_context: prompt of {len(prompt)} tokens + max_tokens {max_tokens} "
                f"= {len(prompt) + max_tokens} > max_context {cfg.max_context}"
            )

    def submit(self, prompt: str | bytes | np.ndarray, max_tokens: int | None, sink: TokenSink) -> bool:
        """Queue a request; False (and `sink.error` already called) if it is rejected at once."""
        ids = prompt if isinstance(prompt, np.ndarray) else encode(prompt)
        if max_tokens is None:
            max_tokens = self.cfg.default_max_tokens
        try:
            self.validate(ids, int(max_tokens))
        except RequestRejected as err:
            sink.error(str(err), "invalid")
            return False
        if max_tokens == 0:
            sink.finish()
            return True
        with self._cond:
            if self._stop:
                sink.error("tinyllm engine is stopped", "unavailable")
                return False
            seq = Sequence(request_id=self._next_id, prompt=ids, max_tokens=int(max_tokens), sink=sink)
            self._next_id += 1
            self._waiting.append(seq)
            self._cond.notify()
        return True

    # -- scheduling ----------------------------------------------------------------------------

    def stats(self) -> EngineStats:
        with self._cond:
            waiting = len(self._waiting)
        return EngineStats(
            kv_blocks_used=self.pool.used,
            kv_blocks_total=self.pool.total,
            kv_bytes_per_token=self.cfg.kv_bytes_per_token,
            kv_block_tokens=self.cfg.kv_block_tokens,
            running_sequences=len(self.running),
            waiting_sequences=waiting,
            oom_errors_total=self.oom_errors_total,
            generated_tokens_total=self.generated_tokens_total,
            decode_steps_total=self.decode_steps_total,
        )

    def has_work(self) -> bool:
        with self._cond:
            return bool(self._waiting) or bool(self.running)

    def step(self) -> None:
        """One iteration: admit + prefill newcomers, one batched decode step, retire finished."""
        admitted: list[Sequence] = []
        with self._cond:
            while self._waiting and len(self.running) + len(admitted) < self.cfg.max_num_seqs:
                admitted.append(self._waiting.popleft())
        for seq in admitted:
            if self._cancelled(seq):
                continue
            try:
                seq.block_table = self.pool.allocate(self.cfg.blocks_for(len(seq.prompt)))
            except KVCacheOOM as err:
                self._fail(seq, str(err), "oom")
                continue
            t0 = time.perf_counter()
            try:
                logits = self.model.prefill(seq.prompt, seq.block_table, self.pool)
            except MemoryError:
                self._fail(seq, f"out of memory: prefill of {len(seq.prompt)} tokens failed", "oom")
                continue
            self.last_prefill_s = time.perf_counter() - t0
            seq.cache_len = len(seq.prompt)
            self.running.append(seq)
            self._emit(seq, int(np.argmax(logits)))

        batch: list[Sequence] = []
        for seq in self.running:
            if seq.done or self._cancelled(seq):
                continue
            if seq.cache_len // self.cfg.kv_block_tokens >= len(seq.block_table):
                try:
                    seq.block_table.extend(self.pool.allocate(1))
                except KVCacheOOM as err:
                    self._fail(seq, str(err), "oom")
                    continue
            batch.append(seq)
        if batch:
            t0 = time.perf_counter()
            logits = self.model.decode(
                np.array([s.generated[-1] for s in batch], dtype=np.intp),
                np.array([s.cache_len for s in batch], dtype=np.intp),
                [s.block_table for s in batch],
                self.pool,
            )
            self.last_decode_s = time.perf_counter() - t0
            self.last_decode_batch = len(batch)
            self.decode_steps_total += 1
            next_ids = np.argmax(logits, axis=-1)
            for seq, tok in zip(batch, next_ids):
                seq.cache_len += 1
                self._emit(seq, int(tok))
        self.running = [s for s in self.running if not s.done]
        self.steps += 1
        if self.on_step is not None:
            self.on_step(self.stats())

    def run_until_idle(self, max_steps: int = 1_000_000) -> None:
        for _ in range(max_steps):
            if not self.has_work():
                return
            self.step()
        raise RuntimeError("tinyllm engine did not become idle")

    def _emit(self, seq: Sequence, token_id: int) -> None:
        seq.generated.append(token_id)
        self.generated_tokens_total += 1
        final = len(seq.generated) >= seq.max_tokens
        text = seq.decoder.piece(token_id, final)
        if final:
            self._retire(seq)
        try:
            seq.sink.token(text, token_id, final)
        except Exception:  # the client is gone: stop generating for it
            self._retire(seq)

    def _cancelled(self, seq: Sequence) -> bool:
        try:
            cancelled = seq.sink.cancelled()
        except Exception:
            cancelled = True
        if cancelled:
            self._retire(seq)
            try:
                seq.sink.finish()
            except Exception:
                pass
        return cancelled

    def _retire(self, seq: Sequence) -> None:
        if seq.block_table:
            self.pool.release(seq.block_table)
            seq.block_table = []
        seq.done = True

    def _fail(self, seq: Sequence, message: str, kind: str = "internal") -> None:
        self._retire(seq)
        if kind == "oom":
            self.oom_errors_total += 1
        try:
            seq.sink.error(message, kind)
        except Exception:
            pass

    # -- background thread ---------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name="tinyllm-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the engine for good; requests still waiting or running get an error.

        With a thread, the thread fails its running sequences itself as it exits (after the step
        in progress), so a join that times out never races it over the running batch.
        """
        with self._cond:
            self._stop = True
            self._cond.notify_all()
            pending = list(self._waiting)
            self._waiting.clear()
        for seq in pending:
            self._fail(seq, "tinyllm engine stopped (model unloading)", "unavailable")
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout_s)
        else:
            self._fail_running("tinyllm engine stopped (model unloading)", "unavailable")

    def _fail_running(self, message: str, kind: str) -> None:
        for seq in [s for s in self.running if not s.done]:
            self._fail(seq, message, kind)
        self.running = []

    def _loop(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self._stop and not self._waiting and not self.running:
                        self._cond.wait()
                    if self._stop:
                        return
                try:
                    self.step()
                except Exception as err:  # keep serving: fail what was in flight, with the reason
                    self._fail_running(f"tinyllm engine error: {type(err).__name__}: {err}", "internal")
        finally:
            self._fail_running("tinyllm engine stopped (model unloading)", "unavailable")


def generate_text(cfg: EngineConfig, prompt: str | bytes, max_tokens: int | None = None,
                  model: TinyLLM | None = None) -> str:
    """Greedy output of one request on a fresh engine, in-process (what the server must stream)."""
    engine = Engine(cfg, model=model)
    sink = CollectingSink()
    engine.submit(prompt, max_tokens, sink)
    engine.run_until_idle()
    if sink.error_message is not None:
        raise EngineError(sink.error_message)
    return sink.text
