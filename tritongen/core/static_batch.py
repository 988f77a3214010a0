"""The batch a static-batch LLM's memory holds, measured, as a bound on the rendered max_batch_size.

An LLM that is not decoupled runs each batch Triton's dynamic batcher hands it until its longest
request is done, holding every request's KV all the while; an engine that allocates as it goes
fails the whole batch when the sum passes its pool. So its `max_batch_size` must not pass what the
profile's static-batch probe saw fit (`UnaryLLMMeasurement`), scaled from the probe's request size to
the spec's: capacity tokens // tokens of one of the spec's requests. The spec's arithmetic stays a
bound too: the smaller wins. Pure: plan and measurements in, plan out."""

from __future__ import annotations

from collections.abc import Mapping

from tritongen.core.plan import DeploymentPlan, ModelEntryPlan
from tritongen.core.profile_types import Profile


def measured_batch_bound(profile: Profile, request_tokens: int | None) -> int | None:
    """The largest batch of `request_tokens`-token requests the probe says fits (the probe's own
    request size where the spec gives none); None where the probe saw no batch fail (the served
    max_batch_size held, so nothing bounds it) or did not run."""
    llm = profile.llm
    if llm is None or llm.smallest_batch_that_fails is None or llm.kv_capacity_tokens is None:
        return None
    size = request_tokens or (llm.probe_prompt_tokens + llm.probe_max_tokens)
    return max(1, llm.kv_capacity_tokens // max(1, size))


def cap_static_batches(plan: DeploymentPlan, profiles: Mapping[str, Profile],
                       request_tokens: Mapping[str, int | None]) -> DeploymentPlan:
    """`plan` with each non-decoupled LLM entry's max_batch_size (and preferred sizes) within the
    batch its profile measured to fit, a note saying so."""
    entries: list[ModelEntryPlan] = []
    for entry in plan.entries:
        profile = profiles.get(entry.name)
        bound = None if profile is None or entry.decoupled else measured_batch_bound(profile, request_tokens.get(entry.name))
        if bound is None or entry.max_batch_size <= bound:
            entries.append(entry)
            continue
        assert profile is not None and profile.llm is not None
        batching = entry.dynamic_batching
        if batching is not None:
            preferred = [s for s in batching.preferred_batch_sizes if s <= bound]
            batching = batching.model_copy(update={"preferred_batch_sizes": preferred})
        note = (f"max_batch_size {entry.max_batch_size} lowered to {bound}: the profile's static-batch probe ran out of "
                f"memory at {profile.llm.smallest_batch_that_fails} requests of {profile.llm.probe_prompt_tokens} + "
                f"{profile.llm.probe_max_tokens} tokens ({profile.llm.kv_capacity_tokens} tokens fit)")
        entries.append(entry.model_copy(update={"max_batch_size": bound, "dynamic_batching": batching,
                                                 "notes": [*entry.notes, note]}))
    return plan.model_copy(update={"entries": entries})
