"""Which way gRPC `ModelStreamInfer` goes through the sidecar, and why. Pure.

* **carried**: nginx carries the stream to Triton and back (`grpc_pass`); Python decides once as it
  opens (its class and tenant from the metadata, a slot of the stream model, or a refusal) and hears
  from a Lua body filter how its requests end, so no token crosses Python. nginx cannot read the
  requests inside an open HTTP/2 stream: the slot is priced as a request of unknown prompt, no KV is
  reserved and no priority written (the sidecar's queue still orders streams by class).
* **relay**: Python reads, prices, reserves and relays every request and token (sidecar/grpc_stream.py),
  at 150-400 us of CPU per token on the hosts measured (docs/sidecar.md).

Carried is the default for an engine that queues when its KV is full (kv_policy grow_preempt: vLLM;
reserve_wait: TensorRT-LLM's GUARANTEED_NO_EVICT), where an unpriced request waits in the engine
instead of failing; an engine that kills (reserve_kill, grow_kill), or of unknown policy, needs
each request's KV reserved: relay. A model's `grpc_streams` overrides either way. nginx sees no
model name in a stream, so it is attributed to the policy's one streaming model; with several,
streams are relayed.
"""

from __future__ import annotations

from dataclasses import dataclass

from tritongen.core.sidecar_policy.schema import SidecarPolicy

CARRIED = "carried"
RELAY = "relay"
QUEUEING_POLICIES = ("grow_preempt", "reserve_wait")  # engines that wait for KV instead of killing


@dataclass(frozen=True)
class StreamPath:
    mode: str  # CARRIED or RELAY
    model: str | None  # the model carried streams are attributed to (None: relay)
    why: str

    def status(self) -> dict[str, str | None]:
        return {"path": self.mode, "model": self.model, "why": self.why}


def relayed_for_its_class(policy: SidecarPolicy, class_header_value: str) -> bool:
    """A stream whose metadata names no class, under a policy of several classes, goes to the relay
    although streams are carried: its class may be in its requests' `traffic_class` parameter, which
    nginx cannot read inside the stream, and a stream taken for the default class would be queued and
    judged by the wrong target (measured: every stream of the zoo's textgen held to the default
    class's share, none refused, goodput 0.74x direct at 1.5x). Clients that name it in the metadata
    (tritonclient: `start_stream(headers=...)`) are carried."""
    return not class_header_value and len(policy.classes) > 1


def stream_path(policy: SidecarPolicy, native_front: bool) -> StreamPath:
    """How this policy's gRPC streams go (see the module docstring)."""
    if not native_front:
        return StreamPath(RELAY, None, "the Python front relays every stream (no nginx)")
    streaming = [m for m in policy.models if m.streaming]
    if not streaming:
        return StreamPath(RELAY, None, "the policy has no streaming model")
    if len(streaming) > 1:
        names = ", ".join(m.name for m in streaming)
        return StreamPath(RELAY, None, f"{len(streaming)} streaming models ({names}): nginx cannot see which one a "
                          "stream's requests name, Python reads each")
    model = streaming[0]
    kv_policy = model.kv.kv_policy if model.kv is not None else None
    if model.grpc_streams == RELAY:
        return StreamPath(RELAY, None, f"model {model.name!r}: the policy asks for the relay (grpc_streams: relay)")
    if model.grpc_streams == CARRIED:
        return StreamPath(CARRIED, model.name, f"model {model.name!r}: the policy asks for it (grpc_streams: carried)"
                          + _naming(policy))
    if kv_policy in QUEUEING_POLICIES:
        return StreamPath(CARRIED, model.name, f"model {model.name!r}: its engine queues when its KV is full "
                          f"(kv_policy {kv_policy}); one decision per stream, no Python per token" + _naming(policy))
    said = f"kv_policy {kv_policy}" if kv_policy else "its kv_policy is not known"
    return StreamPath(RELAY, None, f"model {model.name!r}: {said}, so each request of a stream must reserve its KV "
                      "before it reaches the engine (grpc_streams: carried in the policy overrides)")


def _naming(policy: SidecarPolicy) -> str:
    if len(policy.classes) < 2:
        return ""
    return (f"; a stream whose {policy.class_header!r} metadata names no class is relayed (its class may be in its "
            "requests' parameters)")
