"""What a tuning search works on: one candidate's settings (`Params`) and everything the search
needs for one model entry (`TuneInputs`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict

from tritongen.core.engine import EngineModel, KVPolicy
from tritongen.core.plan import ModelEntryPlan
from tritongen.core.simulator import Overheads, ServiceCurve
from tritongen.core.spec import DeploymentSpec, TrafficClass
from tritongen.core.traffic import Arrivals


PolicyName = Literal["strict", "strict-loose", "single"]
Objective = Literal["targets", "capacity"]


class Params(BaseModel):
    """One candidate's settings for one model entry."""

    model_config = ConfigDict(frozen=True)

    max_batch_size: int
    preferred: tuple[int, ...]
    delay_us: int
    instances: int
    policy: PolicyName
    max_num_seqs: int | None = None  # streaming LLMs: the engine's batch
    # LLM engines' own knobs (tune.engine_knobs); None: as the engine is served.
    max_batched_tokens: int | None = None  # the step's token budget
    prefix_caching: bool | None = None  # the prefix cache
    kv_policy: KVPolicy | None = None  # the LLM-API's capacity policy, as the engine model names it

    def label(self) -> str:
        pref = "/".join(str(p) for p in self.preferred) or "-"
        seqs = f" seqs={self.max_num_seqs}" if self.max_num_seqs else ""
        if self.max_batched_tokens is not None:
            seqs += f" tokens={self.max_batched_tokens}"
        if self.prefix_caching is not None:
            seqs += f" cache={'on' if self.prefix_caching else 'off'}"
        if self.kv_policy is not None:
            seqs += f" kv={self.kv_policy}"
        return (
            f"mbs={self.max_batch_size} pref={pref} delay={self.delay_us / 1000:g}ms "
            f"inst={self.instances} {self.policy}{seqs}"
        )



@dataclass
class TuneInputs:
    """Everything `tune_model` needs for one entry."""

    spec: DeploymentSpec
    entry: ModelEntryPlan
    arrivals: Arrivals  # the traffic this entry serves, class priorities set from the spec
    classes: list[TrafficClass]
    curve: ServiceCurve | None = None
    engine: EngineModel | None = None  # streaming LLMs: the engine as served (engine_sources.resolve_engine)
    overheads: Overheads = field(default_factory=Overheads)
    memory_available_bytes: int | None = None  # device memory this entry may use for instances
    instance_bytes: int = 0
    rate_limit: bool = False
    resources: dict[str, int] = field(default_factory=dict)
    max_error_fraction: float = 0.01
    seed: int = 0
    max_instances: int = 4
    device_curve: ServiceCurve | None = None  # the profile's instance scaling: the execution part a device serialises
    objective: Objective = "targets"
