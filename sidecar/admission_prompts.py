"""How the prompts of each LLM are counted in tokens: the model's tokenizer when one was loaded
(sidecar/tokens.py), else the bytes-per-token ratio learnt from the engine's own prompt-token
counter (sidecar/prompt_ratio.py) once enough has passed, else the policy's ratio. Pure."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping

from sidecar.cost import TokenCounter
from sidecar.prompt_ratio import LearnedRatio
from tritongen.core.sidecar_policy.sections import ModelPolicy


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
