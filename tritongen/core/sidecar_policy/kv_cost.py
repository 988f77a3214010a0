"""What one LLM request costs in memory, as the policy states it (the sidecar's cost.py computes
each request's figure from it)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from tritongen.core.sidecar_policy.base import PolicyModel


class PrefillPoint(PolicyModel):
    prompt_tokens: int = Field(ge=1, description="Prompt length the peak was measured at.")
    peak_bytes: int = Field(ge=0, description="Transient memory over steady state while that prompt is prefilled.")


KVPolicyName = Literal["reserve_wait", "reserve_kill", "grow_preempt", "grow_kill"]


class CappedKV(PolicyModel):
    """Layers whose cache stops growing at a cap: sliding windows, Llama 4's chunked attention."""

    cap_tokens: int = Field(ge=1, description="Tokens these layers keep at most (the window, or one chunk).")
    bytes_per_token: float = Field(gt=0, description="Bytes a token adds to these layers (per rank), up to the cap.")


class KVCost(PolicyModel):
    """How an LLM request's memory is computed: at its length L (prompt + output tokens, in whole
    blocks), `bytes_per_token x L + sum(capped bytes_per_token x min(L, cap)) + state_bytes`; for a
    classic model (no capped layers, no state) that is L x bytes per token.

    `kv_policy` says what the engine does with it (tritongen/core/engine.py): engines that reserve
    at admission (reserve_wait, reserve_kill) or kill when they run dry (grow_kill) get each
    request's whole footprint reserved against their pool, which is what keeps them from killing;
    a grow-and-preempt engine (vLLM) never kills, so it is admitted by its sequence limit and the
    predicted wait alone, and no KV is reserved for it."""

    bytes_per_token: float = Field(
        ge=0, description="KV-cache bytes per token (per rank) of the layers that keep every token; for a classic "
        "model, of every layer."
    )
    bytes_per_token_source: Literal["profile", "analytic", "tokens"] = Field(
        description="Where bytes_per_token comes from; 'tokens': not known (a policy from profiles alone), so 1, and "
        "the pool, the quota and each request are counted in tokens."
    )
    capped: list[CappedKV] = Field(
        default_factory=list, description="Layers that stop growing at a cap, each with the bytes a token adds to "
        "them below it (tritongen.core.kv.KVFootprint). Empty: none, every layer grows with the sequence."
    )
    state_bytes: int = Field(
        default=0, ge=0, description="Fixed bytes one sequence holds whatever its length: the states of linear-"
        "attention and Mamba layers (per rank)."
    )
    block_tokens: int = Field(default=1, ge=1, description="Paged engines allocate whole blocks of this many tokens.")
    max_context: int = Field(
        ge=1, description="Prompt + output tokens at most. A request asking for more output than this is refused at "
        "once (400); an unknown prompt is charged up to it."
    )
    kv_policy: KVPolicyName | None = Field(
        default=None, description="The engine's KV policy (see the class docstring); None: unknown, reserve as "
        "reserve_kill would."
    )
    engine_pool_bytes: int | None = Field(
        default=None, gt=0, description="One engine's whole KV pool: a request whose footprint exceeds it can never "
        "run, and is refused at once (413). None: not known."
    )
    default_max_tokens: int | None = Field(
        default=None, ge=0, description="Output tokens assumed when a request names none (None: up to max_context)."
    )
    prompt_bytes_per_token: float = Field(
        default=1.0, gt=0, description="UTF-8 bytes per prompt token; 1.0 (byte-level tokenizer) is the safe bound."
    )
    tokenizer: str | None = Field(
        default=None, min_length=1, description="A Hugging Face tokenizer.json (relative: to the policy file) the "
        "sidecar counts each prompt's tokens with, when the `tokenizers` package is installed; else, or when a prompt "
        "cannot be read, prompt_bytes_per_token estimates them."
    )
    prompt_input: str = Field(default="text_input", min_length=1, description="Input tensor holding the prompt.")
    prompt_token_ids: bool = Field(
        default=False, description="The prompt input holds token ids (an LLM of token ids, core.llm_token_ids): each "
        "element is one token, so a prompt's tokens are counted exactly, with no bytes-per-token ratio."
    )
    max_tokens_input: str = Field(default="max_tokens", min_length=1, description="Input tensor holding max_tokens.")
    preallocated: bool = Field(
        default=True, description="The engine allocates its KV pool up front: KV costs count against the model's "
        "pool, not against free device memory."
    )
    prefill_peak: list[PrefillPoint] = Field(
        default_factory=list, description="Profiled prefill memory peak by prompt length (empty: no profile)."
    )
    prefill_peak_source: Literal["profile", "none"] = Field(default="none")
    prefix_caching: bool = Field(
        default=False, description="The engine reuses prompt blocks that running sequences share (vLLM "
        "enable_prefix_caching, TensorRT-LLM block reuse): where it reserves, a block that several requests in flight "
        "begin with is reserved once (sidecar/prefix_blocks.py)."
    )

    @property
    def reserves(self) -> bool:
        """Whether admission reserves each request's KV footprint (every policy but grow_preempt)."""
        return self.kv_policy != "grow_preempt"

    @model_validator(mode="after")
    def _costs_something(self) -> KVCost:
        if self.bytes_per_token == 0 and not self.capped and self.state_bytes == 0:
            raise ValueError("kv: bytes_per_token is 0 and there are no capped layers and no state_bytes: a sequence "
                             "would cost nothing; give the model's KV bytes per token")
        return self

    def bytes_at(self, tokens: float) -> float:
        """Bytes one sequence of `tokens` tokens holds (every layer kind as it grows; 0 when empty)."""
        if tokens <= 0:
            return 0.0
        capped = sum(c.bytes_per_token * min(tokens, c.cap_tokens) for c in self.capped)
        return self.bytes_per_token * tokens + capped + self.state_bytes

    @field_validator("prefill_peak")
    @classmethod
    def _sorted(cls, points: list[PrefillPoint]) -> list[PrefillPoint]:
        lengths = [p.prompt_tokens for p in points]
        if lengths != sorted(set(lengths)):
            raise ValueError(f"prefill_peak prompt lengths {lengths} must be strictly increasing")
        return points
