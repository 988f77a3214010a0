"""Exact prompt token counts from a model's own tokenizer, when the policy names one.

A byte ratio (`KVCost.prompt_bytes_per_token`) is an average: a prompt of unusual text costs more or
fewer tokens than it says, and a sidecar that reserves KV for each request either over-reserves
(goodput lost) or under-reserves (the engine kills). A tokenizer.json counts exactly. It is read
with Hugging Face's `tokenizers` package (`pip install tritongen[tokenizer]`); without the package
the sidecar says so once and keeps the ratio, since the ratio is still a working estimate. A file
that is missing or unreadable is a policy error: the operator named it, and a silent fallback
would hide the mistake.
"""

from __future__ import annotations

import logging
from pathlib import Path

from sidecar.cost import TokenCounter
from tritongen.core.sidecar_policy.schema import PolicyError, SidecarPolicy

log = logging.getLogger("tritongen.sidecar.tokens")


def load_counters(policy: SidecarPolicy, policy_dir: Path) -> dict[str, TokenCounter]:
    """A token counter per model whose `kv.tokenizer` is set (relative paths: the policy's directory)."""
    named = {m.name: m.kv.tokenizer for m in policy.models if m.kv is not None and m.kv.tokenizer}
    if not named:
        return {}
    try:
        from tokenizers import Tokenizer
    except ImportError:
        log.warning("the policy names tokenizers for %s, but the `tokenizers` package is not installed "
                    "(pip install tritongen[tokenizer]); prompt tokens are estimated from prompt_bytes_per_token",
                    sorted(named))
        return {}
    counters: dict[str, TokenCounter] = {}
    for model, name in named.items():
        path = Path(name) if Path(name).is_absolute() else policy_dir / name
        try:
            tokenizer = Tokenizer.from_file(str(path))
        except Exception as err:  # the library raises a bare Exception for a missing or bad file
            raise PolicyError(f"models {model!r}: kv.tokenizer {path} cannot be read: {err}; fix the path, or "
                              "remove `tokenizer` to estimate tokens from prompt_bytes_per_token") from None
        counters[model] = _counter(tokenizer)
    return counters


def _counter(tokenizer: object) -> TokenCounter:
    def count(text: bytes) -> int:
        return len(tokenizer.encode(text.decode("utf-8", errors="replace"), add_special_tokens=True).ids)  # type: ignore[attr-defined]

    return count
