"""Token lengths in a traffic file: a number, or a distribution sampled per request.

Apart from `traffic` so that what a class shares (`traffic_sharing`: prefix lengths, turns per
conversation) is stated in the same words as its prompt and output lengths, without the two
modules importing each other."""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
from pydantic import Field, model_validator

from tritongen.core.strict import Strict


class LengthDist(Strict):
    """A token-length distribution (prompt or output). Samples are integers in [min, max]."""

    dist: Literal["fixed", "uniform", "exponential", "lognormal"] = Field(
        default="fixed", description="fixed: always `mean`; uniform: [min, max]; exponential/lognormal around `mean`."
    )
    mean: float | None = Field(default=None, gt=0, description="Mean length (fixed, exponential, lognormal).")
    min: int = Field(default=1, ge=0, description="Smallest length.")
    max: int | None = Field(default=None, ge=1, description="Largest length (required for uniform).")
    sigma: float = Field(default=0.5, gt=0, description="lognormal: sigma of the underlying normal.")

    @model_validator(mode="after")
    def _complete(self) -> "LengthDist":
        if self.dist == "uniform":
            if self.max is None:
                raise ValueError("a uniform length needs `max` (and `min`)")
            if self.max < self.min:
                raise ValueError(f"max {self.max} is below min {self.min}; swap them")
        elif self.mean is None:
            raise ValueError(f"a {self.dist} length needs `mean`")
        return self

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.dist == "fixed":
            out = np.full(n, float(self.mean or 0.0))
        elif self.dist == "uniform":
            out = rng.integers(self.min, (self.max or self.min) + 1, size=n).astype(float)
        elif self.dist == "exponential":
            out = rng.exponential(float(self.mean or 1.0), size=n)
        else:
            mu = math.log(float(self.mean or 1.0)) - self.sigma**2 / 2.0  # mean of the lognormal = mean
            out = rng.lognormal(mu, self.sigma, size=n)
        upper = self.max if self.max is not None else np.inf
        return np.clip(np.rint(out), self.min, upper).astype(np.int64)


Length = int | LengthDist


def length_array(value: Length, rng: np.random.Generator, n: int) -> np.ndarray:
    """`n` lengths of `value`: a number repeated (no draw), or samples of the distribution."""
    if isinstance(value, int):
        return np.full(n, value, dtype=np.int64)
    return value.sample(rng, n)


def least_length(value: Length) -> int:
    """The smallest length `value` can give: a number itself, a fixed distribution its clipped mean,
    any other its `min`."""
    if isinstance(value, int):
        return value
    if value.dist == "fixed":
        upper = value.max if value.max is not None else np.inf
        return int(np.clip(np.rint(float(value.mean or 0.0)), value.min, upper))
    return value.min
