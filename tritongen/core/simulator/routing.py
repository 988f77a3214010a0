"""Which model entry serves each request: the traffic class's route, then the lane whose prompt range
holds the request (length-tiered lanes serve one route with several entries)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tritongen.core.simulator.inputs import ModelSim
from tritongen.core.traffic import Arrivals


def route_requests(models: Sequence[ModelSim], arrivals: Arrivals) -> list[int]:
    """Model index per request (-1: no lane takes its prompt): by the class's model (route) and the lane's prompt range."""
    by_route: dict[str, list[int]] = {}
    for i, m in enumerate(models):
        by_route.setdefault(m.route_key, []).append(i)
    routes = list(by_route)
    out = np.full(len(arrivals), -1, dtype=np.int64)
    for c, name in enumerate(arrivals.class_names):
        target = arrivals.class_model[c] if c < len(arrivals.class_model) else None
        if target is None:
            if len(routes) != 1:
                raise ValueError(
                    f"traffic class {name!r} names no model and the simulation serves {len(routes)} routes "
                    f"({routes}); set `model:` on the class"
                )
            target = routes[0]
        if target not in by_route:
            raise ValueError(f"traffic class {name!r} goes to model {target!r}, which is not simulated ({routes})")
        mask = arrivals.cls == c
        prompts = arrivals.prompt[mask]
        chosen = np.full(len(prompts), -1, dtype=np.int64)
        for mi in by_route[target]:
            m = models[mi]
            lo = m.prompt_tokens_min
            hi = m.prompt_tokens_max if m.prompt_tokens_max is not None else np.iinfo(np.int64).max
            fits = (chosen < 0) & (prompts >= lo) & (prompts <= hi)
            chosen[fits] = mi
        out[mask] = chosen
    return out.tolist()
