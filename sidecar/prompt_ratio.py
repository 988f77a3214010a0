"""Prompt bytes per token as the engine counts them, learnt from its own counter. Pure.

Without the model's tokenizer the sidecar turns a prompt's bytes into tokens with a ratio. The
policy's ratio is a bound (1 byte a token never under-counts, but over-counts an English BPE prompt
about fourfold) or a figure measured once by the profile. The engine itself says how many prompt
tokens it processed: vLLM's `vllm:prompt_tokens_total`, which Triton's vLLM backend reports
(REPORT_CUSTOM_METRICS). Between two readings of that counter, the prompt bytes the sidecar
forwarded over the tokens the engine counted is the ratio the engine's tokenizer gives this
traffic; the sidecar counts prompts with it once enough tokens have passed.

Tokens that reach the engine around the sidecar (other clients) count against the ratio, which
then reads low and counts prompts as more tokens than they are: the safe side for admission. A
counter that goes back (the engine restarted) starts the window again.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

MIN_TOKENS = 2048  # the engine counted at least this many prompt tokens in the window: a ratio of many prompts
WINDOW_READINGS = 120  # readings kept (a minute at the default half-second poll)


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
