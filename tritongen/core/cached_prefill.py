"""What an arrival whose prompt begins with a cached prefix costs the engine's step. Pure.

The profile's prefill line (`LLMCurve.prefill_ms`) is fitted on fresh prompts, where the cost
follows the tokens computed. An arrival that hits the cache is another case, and its cost is the
engine's own: on vLLM-CPU (2026-12-07, the tiny Llama of vllm-cpu.md, bursts of 8 and 12) a
100-token prompt served from the cache but for 4 tokens cost 17 ms of engine time where the fresh
line priced 4 ms, while a cached 64-token prefix with 37 tokens of its own cost 21 ms where the
line priced 27, and a 384-token cached prefix added about 10 ms over a short one. Priced by the
fresh line, the simulated engine took a shared system prompt at 1.4x the capacity it had live.

So the profile measures it (`profiler.prefix_probe`: bursts of arrivals with a cached prefix of
two lengths and a tail of two lengths), and the step prices such an arrival on a line of its own:
`fixed_ms + ms_per_token x tokens it computes + ms_per_cached_token x tokens the cache served`,
fitted by least squares on the bursts' marginal times (less the one more sequence the step
decodes, which the decode line already prices), no coefficient below zero.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from pydantic import Field

from tritongen.core.profile_types import ArrivalBurst
from tritongen.core.strict import Strict

MIN_BURSTS = 3  # three coefficients


class CachedPrefillCost(Strict):
    """An arrival with a cached prefix, in the step: `fixed_ms + ms_per_token x computed +
    ms_per_cached_token x cached` milliseconds."""

    fixed_ms: float = Field(ge=0)
    ms_per_token: float = Field(ge=0, description="Per prompt token the arrival computes.")
    ms_per_cached_token: float = Field(ge=0, description="Per prompt token the cache served (its attention reads them).")
    evidence: str = Field(description="What it was fitted on, for the sources.")

    def ms(self, computed: int, cached: int) -> float:
        return self.fixed_ms + self.ms_per_token * computed + self.ms_per_cached_token * cached


def fit_cached_prefill(bursts: Sequence[ArrivalBurst], split: Callable[[int, int], tuple[int, int]],
                       decode_ms_per_seq: float) -> CachedPrefillCost | None:
    """The line through `bursts`; None with fewer than MIN_BURSTS that hit the cache.
    `split(prompt, shared)`: (tokens computed, tokens the cache serves) of a prompt of `prompt`
    text tokens whose first `shared` are cached, as the simulated engine splits it."""
    rows, ys = [], []
    for b in bursts:
        computed, cached = split(b.shared_tokens + b.own_tokens, b.shared_tokens)
        if cached <= 0:
            continue
        rows.append((1.0, float(computed), float(cached)))
        ys.append(b.marginal_ms - decode_ms_per_seq)
    if len(rows) < MIN_BURSTS:
        return None
    coef = _nonnegative_lstsq(np.array(rows), np.array(ys))
    said = ", ".join(f"{b.shared_tokens} cached + {b.own_tokens} own: {b.marginal_ms:.1f} ms" for b in bursts)
    return CachedPrefillCost(
        fixed_ms=round(float(coef[0]), 4), ms_per_token=round(float(coef[1]), 6), ms_per_cached_token=round(float(coef[2]), 6),
        evidence=f"the profile's bursts of arrivals with a cached prefix, one more arrival each ({said})")


def _nonnegative_lstsq(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0: a coefficient the fit puts below zero is held
    at zero and the rest refitted (three unknowns: at most three rounds)."""
    free = list(range(a.shape[1]))
    coef = np.zeros(a.shape[1])
    while free:
        sol, *_ = np.linalg.lstsq(a[:, free], y, rcond=None)
        if (sol >= 0).all():
            coef[free] = sol
            return coef
        free.pop(int(np.argmin(sol)))
    return coef

