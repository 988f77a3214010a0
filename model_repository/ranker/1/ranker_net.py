"""The ranker's pure numpy network: an MLP 32 -> 64 -> 1 (ReLU, then sigmoid).

Importable without Triton, so tests compute the expected scores in-process and compare them with
what the server returns. The weights come from `numpy.random.default_rng(seed)`, so two processes
with the same seed hold the same network.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

INPUT_DIM = 32
HIDDEN_DIM = 64
OUTPUT_DIM = 1
DEFAULT_SEED = 7


@dataclass(frozen=True)
class RankerNet:
    """Weights of the MLP; build one with `RankerNet.from_seed(seed)`."""

    w1: np.ndarray  # [32, 64]
    b1: np.ndarray  # [64]
    w2: np.ndarray  # [64, 1]
    b2: np.ndarray  # [1]

    @classmethod
    def from_seed(cls, seed: int = DEFAULT_SEED) -> "RankerNet":
        rng = np.random.default_rng(seed)
        w1 = rng.standard_normal((INPUT_DIM, HIDDEN_DIM)) / np.sqrt(INPUT_DIM)
        b1 = rng.standard_normal(HIDDEN_DIM) * 0.1
        w2 = rng.standard_normal((HIDDEN_DIM, OUTPUT_DIM)) / np.sqrt(HIDDEN_DIM)
        b2 = rng.standard_normal(OUTPUT_DIM) * 0.1
        return cls(
            w1=w1.astype(np.float32),
            b1=b1.astype(np.float32),
            w2=w2.astype(np.float32),
            b2=b2.astype(np.float32),
        )

    def scores(self, features: np.ndarray) -> np.ndarray:
        """Scores for `features` of shape [..., 32]; the result has shape [..., 1], float32."""
        x = np.asarray(features, dtype=np.float32)
        if x.ndim == 0 or x.shape[-1] != INPUT_DIM:
            raise ValueError(f"FEATURES must end in a dimension of {INPUT_DIM}, got shape {list(x.shape)}")
        lead = x.shape[:-1]
        flat = x.reshape(-1, INPUT_DIM)
        hidden = np.maximum(flat @ self.w1 + self.b1, np.float32(0.0))
        logits = hidden @ self.w2 + self.b2
        out = (np.float32(1.0) / (np.float32(1.0) + np.exp(-logits))).astype(np.float32)
        return out.reshape(*lead, OUTPUT_DIM)


def expected_duration_ms(items: int, overhead_ms: float, per_item_ms: float) -> float:
    """How long one execute() of `items` rows takes by design: fixed overhead plus per-item cost."""
    return overhead_ms + items * per_item_ms
