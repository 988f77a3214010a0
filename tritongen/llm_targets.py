"""Load targets for an LLM as its server serves it, sized by what its profile measured.

The benches, the demo and the suite each built this `LoadTarget` by hand from a served config and a
profile's engine section, and a newly measured fact (what a salt adds to a prompt's tokens) reached
only the one caller that was edited. Built here, every live load sends prompts that hold the tokens
its arrivals say."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tritongen.core.llm_interface_config import interface_from_config
from tritongen.core.profile_types import EngineMeasurement
from tritongen.loadgen import LoadTarget


def llm_target(model: str, served_config: Mapping[str, Any], engine: EngineMeasurement | None = None,
               **fields: Any) -> LoadTarget:
    """A target for `model` in the interface its served config speaks (GET /v2/models/M/config),
    streaming where that interface streams; prompts sized by `engine` (the profile's engine section:
    its bytes per token and the salt's surplus), else one byte per token. `fields` set the rest
    (class_parameter, protocol, ...) and override what the profile gave."""
    interface = interface_from_config(dict(served_config), model=model)
    measured: dict[str, Any] = {} if engine is None else {
        "bytes_per_token": engine.bytes_per_token, "salt_surplus_tokens": engine.salt_surplus_tokens or 0,
        "text_words": engine.text_words}
    return LoadTarget(model, streaming=interface.will_stream(), batched=int(served_config.get("max_batch_size") or 0) > 0,
                      interface=interface, **{**measured, **fields})
