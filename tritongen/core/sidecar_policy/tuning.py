"""The admission and lane knobs a deployer may need to move: policy sections whose defaults are the
core's constants (tritongen/core/admission_tuning.py, tritongen/core/lane_tuning.py, where each
value's provenance is written), so a policy that names none of them behaves as before. `render`
writes none of them; an operator adds them to the policy file (a reload applies them)."""

from __future__ import annotations

from pydantic import Field, model_validator

from tritongen.core import admission_tuning as admission
from tritongen.core import lane_tuning as lane
from tritongen.core.sidecar_policy.base import PolicyModel


class LowerSharePolicy(PolicyModel):
    """How far an LLM's lower classes give way while its top class's first tokens come late."""

    min: float = Field(
        default=admission.SHARE_MIN, gt=0, le=1, description="The least share of the model's pool (or sequences) "
        "lower classes keep; 1 turns the mechanism off."
    )
    high: float = Field(
        default=admission.SHARE_HIGH, gt=0, description="The share shrinks while the top class's recent P90 time "
        "to first token is above this fraction of its target."
    )
    low: float = Field(
        default=admission.SHARE_LOW, gt=0, description="It grows back while that time is below this fraction of "
        "the target (or the top class is quiet); in between it holds."
    )

    @model_validator(mode="after")
    def _band(self) -> LowerSharePolicy:
        if self.low >= self.high:
            raise ValueError(
                f"admission.lower_share.low {self.low:g} must be below admission.lower_share.high {self.high:g}: "
                "between them the share holds, which keeps it from moving back and forth at every step"
            )
        return self


class AdmissionPolicy(PolicyModel):
    """How sure the wait estimate must be, and which upstream time it counts."""

    wait_z: float = Field(
        default=admission.WAIT_Z, ge=0, le=6, description="Below the top class a request is queued only if it "
        "leaves the queue within its class's wait at this many standard deviations above the mean wait (2: the "
        "97.7th percentile; 0: on the mean). Higher refuses sooner what might not make it."
    )
    latency_quantile: float = Field(
        default=admission.LATENCY_QUANTILE, ge=0.5, lt=1, description="Which quantile of the model's recent "
        "upstream time (to first token; to the end for unary requests) is subtracted from a class's target to "
        "get how long its requests may wait."
    )
    lower_share: LowerSharePolicy = Field(
        default_factory=LowerSharePolicy, description="The share of an LLM's rooms its lower classes may fill "
        "while the top class's first tokens come late."
    )


class LanePolicy(PolicyModel):
    """The native front's fast lane (`--front native`): its spare slots and how often its control plane
    syncs with nginx. Unused with the Python front."""

    spare_min: int = Field(
        default=lane.SPARE_MIN, ge=0, description="Lane slots kept beyond the lane's demand while nothing waits "
        "for the model in the Python queue, at least."
    )
    spare_fraction: float = Field(
        default=lane.SPARE_FRACTION, ge=0, description="...and at least this fraction of the demand."
    )
    hold_s: float = Field(
        default=lane.HOLD_S, ge=0, description="The lane's demand is the most it was asked for over this long."
    )
    idle_after_s: float = Field(
        default=lane.IDLE_AFTER_S, gt=0, description="A model and class without lane demand for this long keeps "
        "no spare slots."
    )
    sync_busy_ms: float = Field(
        default=lane.SYNC_BUSY_MS, gt=0, description="Sync period while the lane's slots move."
    )
    sync_idle_ms: float = Field(default=lane.SYNC_IDLE_MS, gt=0, description="Sync period otherwise.")

    @model_validator(mode="after")
    def _cadence(self) -> LanePolicy:
        if self.sync_busy_ms > self.sync_idle_ms:
            raise ValueError(
                f"lane.sync_busy_ms {self.sync_busy_ms:g} is above lane.sync_idle_ms {self.sync_idle_ms:g}: the lane "
                "would sync less often while busy than while idle; swap them"
            )
        return self
