"""How the prompts of each LLM are counted in tokens: the model's tokenizer when the policy names one
(`load_counters`), else the bytes-per-token ratio learnt from the engine's own prompt-token counter
(`LearnedRatio`) once enough has passed, else the policy's ratio (`PromptCounting` picks). Pure but
for `load_counters`, which reads the tokenizer files.

A byte ratio is an average: a prompt of unusual text costs more or fewer tokens than it says, and
a sidecar that reserves KV per request then over-reserves (goodput lost) or under-reserves (the
engine kills). A tokenizer.json, read with Hugging Face's `tokenizers` (`pip install
tritongen[tokenizer]`), counts exactly; without the package the sidecar says so once and keeps the
ratio, still a working estimate. A named file that is missing or unreadable is a policy error: a
silent fallback would hide the operator's mistake.

The learnt ratio: the engine says how many prompt tokens it processed (vLLM's
`vllm:prompt_tokens_total`, which Triton's vLLM backend reports), so the prompt bytes the sidecar
forwarded over the tokens the engine counted between two readings is the ratio the engine's
tokenizer gives this traffic. Tokens reaching the engine around the sidecar make it read low, which
counts prompts as more tokens than they are: the safe side for admission. A counter that goes back
(the engine restarted) starts the window again.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sidecar.cost import TokenCounter
from tritongen.core.sidecar_policy.schema import PolicyError, SidecarPolicy
from tritongen.core.sidecar_policy.sections import ModelPolicy

log = logging.getLogger("tritongen.sidecar.tokens")

MIN_TOKENS = 2048  # the engine counted at least this many prompt tokens in the window: a ratio of many prompts
WINDOW_READINGS = 120  # readings kept (a minute at the default half-second poll)


def load_counters(policy: SidecarPolicy, policy_dir: Path) -> dict[str, TokenCounter]:
    """A token counter per model whose `kv.tokenizer` is set (relative paths: the policy's directory)."""
    named = {m.name: m.kv.tokenizer for m in policy.models if m.kv is not None and m.kv.tokenizer}
    if not named:
        return {}
    try:
        from tokenizers import Tokenizer
    except ImportError:
        log.warning("the policy names tokenizers for %s, but the `tokenizers` package is not installed "
                    "(pip install tritongen[tokenizer]); prompt tokens are estimated from prompt_bytes_per_token",
                    sorted(named))
        return {}
    counters: dict[str, TokenCounter] = {}
    for model, name in named.items():
        path = Path(name) if Path(name).is_absolute() else policy_dir / name
        try:
            tokenizer = Tokenizer.from_file(str(path))
        except Exception as err:  # the library raises a bare Exception for a missing or bad file
            raise PolicyError(f"models {model!r}: kv.tokenizer {path} cannot be read: {err}; fix the path, or "
                              "remove `tokenizer` to estimate tokens from prompt_bytes_per_token") from None
        counters[model] = _counter(tokenizer)
    return counters


def _counter(tokenizer: object) -> TokenCounter:
    def count(text: bytes) -> int:
        return len(tokenizer.encode(text.decode("utf-8", errors="replace"), add_special_tokens=True).ids)  # type: ignore[attr-defined]

    return count


@dataclass
class LearnedRatio:
    """Bytes per prompt token of one model, from (bytes forwarded, engine's prompt tokens) readings."""

    _readings: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=WINDOW_READINGS))
    ratio: float | None = None

    def observe(self, bytes_forwarded: float, engine_tokens: float) -> float | None:
        """One reading of both running totals; returns the ratio in force (None: not learnt yet)."""
        if self._readings and engine_tokens < self._readings[-1][1]:
            self._readings.clear()  # the engine's counter restarted
        self._readings.append((bytes_forwarded, engine_tokens))
        first_bytes, first_tokens = self._readings[0]
        tokens = engine_tokens - first_tokens
        sent = bytes_forwarded - first_bytes
        if tokens >= MIN_TOKENS and sent > 0:
            self.ratio = sent / tokens
        return self.ratio


class PromptCounting:
    def __init__(self, models: Mapping[str, ModelPolicy]) -> None:
        self.models = models  # the policy's models by name (replaced on a reload)
        self._counters: Mapping[str, TokenCounter] = {}
        self._bytes_sent: dict[str, int] = defaultdict(int)  # per model, of admitted requests
        self._learned: dict[str, LearnedRatio] = defaultdict(LearnedRatio)

    def set_counters(self, counters: Mapping[str, TokenCounter]) -> None:
        self._counters = dict(counters)

    def sent(self, model: str, prompt_bytes: int) -> None:
        """An admitted request's prompt bytes (what the engine will count tokens of)."""
        self._bytes_sent[model] += prompt_bytes

    def observe(self, prompt_tokens_total: Mapping[str, float]) -> None:
        """The engines' prompt-token counters, read with the headroom."""
        for model, tokens in prompt_tokens_total.items():
            if model in self.models and model not in self._counters:
                self._learned[model].observe(self._bytes_sent[model], tokens)

    def counter(self, model: str) -> TokenCounter | None:
        """How a prompt of `model` is counted: its tokenizer, else the learnt ratio, else None (the
        policy's ratio)."""
        counter = self._counters.get(model)
        if counter is not None:
            return counter
        found = self.ratio(model)
        if found is None or found[1] != "learnt":
            return None
        ratio = found[0]
        return lambda text: max(1, math.ceil(len(text) / ratio))

    def ratio(self, model: str) -> tuple[float, str] | None:
        """(bytes per token, 'learnt' or 'policy') the prompts of an LLM are counted with; None with
        a tokenizer (exact counts) or for a model that is not an LLM."""
        mp = self.models.get(model)
        if model in self._counters or mp is None or mp.kv is None:
            return None
        learned = self._learned.get(model)
        if learned is not None and learned.ratio is not None:
            return learned.ratio, "learnt"
        return mp.kv.prompt_bytes_per_token, "policy"

    def describe(self, model: str) -> str:
        """How prompts of `model` are counted, in words (status)."""
        if model in self._counters:
            return "the model's tokenizer"
        found = self.ratio(model)
        if found is None:
            return "not an LLM"
        ratio, source = found
        if source == "learnt":
            return f"{ratio:.3g} bytes/token, learnt from the engine's prompt-token counter"
        bound = " (the bound that never under-counts)" if ratio <= 1 else ""
        return f"{ratio:g} bytes/token, the policy's{bound}"
