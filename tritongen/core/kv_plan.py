"""The KV budget of an LLM replica and the sequences it holds: the step of planning
(`tritongen.core.plan`) that turns a memory quota into max_batch_size, with its arithmetic kept
(`KVPlan`) so the rendered config can say why. Pure: no I/O.
"""

from __future__ import annotations

from tritongen.core.architecture import Architecture
from tritongen.core.kv import KVFootprint, kv_budget_bytes, kv_footprint, kv_shape, max_batch_size_that_fits
from tritongen.core.placement import weights_bytes_of
from tritongen.core.spec import MIB, DeploymentSpec, ModelSpec, kv_block_tokens
from tritongen.core.strict import Strict


class KVPlan(Strict):
    """The KV-budget arithmetic behind an LLM's max_batch_size, per rank, in bytes."""

    device_bytes: int
    utilization_cap: float
    weights_bytes: int
    reserve_bytes: int
    pad_bytes: int
    pad_measured: bool
    budget_bytes: int
    kv_bytes_per_token: int
    context_tokens: int
    bytes_per_sequence: int
    max_sequences: int
    block_tokens: int
    pool_blocks: int  # budget / (block_tokens x kv_bytes_per_token): the pool in attention-token blocks
    footprint: KVFootprint | None = None  # how a sequence grows per layer kind (None: uniform, old plans)

    def sequence_note(self) -> str:
        """Why the budget holds `max_sequences`: the per-sequence arithmetic at `context_tokens`,
        and for a model whose layers do not all grow alike, what reading every layer as full
        attention would have planned instead."""
        fp, tokens = self.footprint, self.context_tokens
        if fp is None or fp.uniform:
            return (f"{self.kv_bytes_per_token} B/token x {tokens} tokens = "
                    f"{self.bytes_per_sequence / MIB:.2f} MiB per sequence -> {self.max_sequences} sequences")
        naive = fp.all_full_bytes_per_token * tokens
        return (f"per sequence at {tokens} tokens: {fp.describe(tokens)} -> {self.max_sequences} sequences "
                f"(read as all full attention, {fp.all_full_bytes_per_token} B/token x {tokens} = "
                f"{naive / MIB:.2f} MiB per sequence, only {self.budget_bytes // naive if naive else 0} would fit)")


def plan_kv(
    spec: DeploymentSpec,
    model: ModelSpec,
    arch: Architecture,
    quota_bytes: int,
    context_tokens: int,
    share: float = 1.0,
    upper: int | None = None,
    pad_mb: float | None = None,
) -> KVPlan:
    """The KV budget of one replica (per rank) and how many sequences of `context_tokens` it holds.

    `pad_mb` is the measured safety pad (prefill peak at the longest context, from a profile);
    without one the policy's guess applies.
    """
    policy = spec.policy
    shape = kv_shape(arch, model.kv_dtype, model.tensor_parallel)
    weights = weights_bytes_of(model, arch) // model.tensor_parallel
    reserve = int(policy.framework_reserve_mb * MIB)
    pad = int((policy.kv_safety_pad_mb if pad_mb is None else pad_mb) * MIB)
    # The quota already sits under the utilisation cap (placement checks it), so cap = 1 here.
    # Each lane is its own engine with its own weights: lanes split the quota, not the budget.
    quota_bytes = int(quota_bytes * share)
    budget = kv_budget_bytes(quota_bytes, 1.0, weights, reserve, pad)
    bound = min(policy.max_batch, upper if upper else policy.max_batch)
    max_seqs = max_batch_size_that_fits(budget, arch, shape, context_tokens, upper=10**9, lower=policy.min_batch)
    block_tokens, _field = kv_block_tokens(model, policy)
    block_bytes = block_tokens * shape.kv_bytes_per_token
    footprint = kv_footprint(arch, shape)
    return KVPlan(
        device_bytes=quota_bytes,
        utilization_cap=policy.memory_utilization_cap,
        weights_bytes=weights,
        reserve_bytes=reserve,
        pad_bytes=pad,
        pad_measured=pad_mb is not None,
        budget_bytes=budget,
        kv_bytes_per_token=shape.kv_bytes_per_token,
        context_tokens=context_tokens,
        bytes_per_sequence=footprint.bytes_at(context_tokens),
        max_sequences=min(max_seqs, bound),
        block_tokens=block_tokens,
        pool_blocks=budget // block_bytes if block_bytes else 0,  # a state-only model has no token blocks
        footprint=footprint,
    )


def typical_sequences(model: ModelSpec, kv: KVPlan) -> int:
    """What the pool holds at the typical sequence: the running limit of an engine that grows
    sequences and waits or preempts rather than dies when the pool runs dry (vLLM; TensorRT-LLM's
    GUARANTEED_NO_EVICT and MAX_UTILIZATION). vLLM grows a sequence's blocks as it goes and
    preempts (recomputes) when the pool runs dry; it never dies of it. So its running limit is
    what the pool holds at the typical sequence (prompt + output, in whole blocks), not at
    max_context: the worst case is the engine's to absorb, and sizing for it would idle most of the pool (a 512-token context held 4 where the
    typical 160-token sequence fits 14). Without typical lengths, max_context is the only size known."""
    typical = (model.typical_prompt_tokens or 0) + (model.typical_output_tokens or 0)
    uniform = kv.footprint is None or kv.footprint.uniform
    # a lane's context already bounds its sequences; a layer mix that is not uniform is sized per
    # sequence by its footprint (KVPlan.max_sequences), not in attention-token blocks
    if not typical or not kv.pool_blocks or model.lanes is not None or not uniform:
        return max(1, kv.max_sequences)
    blocks_each = -(-typical // kv.block_tokens)
    return max(1, kv.max_sequences, kv.pool_blocks // blocks_each)
