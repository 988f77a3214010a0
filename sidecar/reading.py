"""One reader of a request: what admission knows of it, read by one set of rules whatever carried it.

A request reaches admission over HTTP (`infer`, `generate`, `generate_stream`), gRPC (`ModelInfer`,
each request of a `ModelStreamInfer`), the decision socket (nginx's copy of either) or nginx's lane
(a (model, class) key). Each path keeps only its wire parsing (sidecar/protocol.py), which says what
the request states (`Stated`); `read` turns that into one `Reading` by the rules below, and
`cost.cost_for(model, reading.llm)` prices it. Why one reader: with three extractors, one request
got a different price on each path (issue 45).

The rules:
- class: the class header, else the class parameter, else the policy's default; an unknown name is
  a 400 (a typo must not silently become the default class).
- tenant: the tenant header, `default` when absent or empty; a value outside the policy's name
  syntax is a 400.
- priority: `priority_to_write`, the one rule (the lane's (model, class) pairs come from it too).
- prompt: each element of the prompt input (UTF-8 bytes; counted by the model's tokenizer when it
  has one); none readable (shared memory, no prompt input): charged a full context. A model of
  token ids (`kv.prompt_token_ids`): each sequence's ids, one token each, exact.
- budget (max_tokens), from the first source stated, in the order the backends read them: the
  max_tokens input (one value per sequence, or one for all); else a `sampling_parameters` JSON
  object, whose `max_tokens` or nothing (vLLM then ignores the request parameters, and so does the
  price); else the request parameter `max_tokens`; else the model's default.
- a budget value is an integer, an integral float or a numeric string (vLLM's own client sends
  "100"), 0 or more; anything else is a 400 naming where it was: a negative count too (a backend
  reading -1 as "no limit" would have been charged the default). A count of max_context or more
  is refused by the price (`exceeds_context`).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from sidecar.cost import LLMFacts, TokenCounter, prompt_tokens_of
from sidecar.prefix_blocks import block_keys
from tritongen.core.llm_interface import int_or_none
from tritongen.core.sidecar_policy.base import DEFAULT_TENANT, NAME_MAX_LENGTH, NAME_PATTERN
from tritongen.core.sidecar_policy.kv_cost import KVCost
from tritongen.core.sidecar_policy.schema import SidecarPolicy
from tritongen.core.sidecar_policy.sections import ClassPolicy, ModelPolicy

log = logging.getLogger("tritongen.sidecar.reading")

PRIORITY = "priority"  # the request parameter Triton reads a request's priority level from
SAMPLING = "sampling_parameters"  # vLLM's JSON tensor (and generate field) that may hold max_tokens
MAX_TOKENS = "max_tokens"  # its key there, and the request parameter's name

Prompt = bytes | memoryview | None  # a prompt's UTF-8 bytes; None: unreadable here (shared memory)

_TENANT_NAME = re.compile(NAME_PATTERN)


class BadRequest(Exception):
    """A malformed request; str() is the reason sent back with the 400."""


class Stated(NamedTuple):
    """What one request states on its wire, before any rule (each path's parser fills it). A named
    tuple, as `Reading`: one of each is made per request, and a frozen dataclass took 1 µs more."""

    class_parameter: str | None = None  # the class request parameter's value
    names_priority: bool = False  # the request carries a `priority` parameter of its own
    prompts: tuple[Prompt, ...] = ()  # the prompt input's elements; empty: none readable
    budget_tensor: tuple[Any, ...] = ()  # the max_tokens input's elements (empty: not sent)
    sampling: Any = None  # sampling_parameters: JSON text (str or bytes) or an object; None: not sent
    budget_parameter: Any = None  # the `max_tokens` request parameter's value; None: not sent
    prompt_ids: tuple[int, ...] = ()  # a token-id prompt: each sequence's number of ids (its exact tokens)


NOTHING = Stated()  # a request whose body the path did not need to parse (a plain classic infer)


class Reading(NamedTuple):
    """One request as admission sees it, the same from every path."""

    model: str
    klass: str
    tenant: str
    priority: int | None  # the level the sidecar writes into the request; None: it goes as it came
    llm: LLMFacts | None  # prompts and budget (an LLM); None: a classic model, priced by its request bytes


def priority_to_write(model: ModelPolicy, klass: ClassPolicy, names_priority: bool) -> int | None:
    """The priority level the sidecar writes into a request, or None to leave it as it came: only
    for a model with priority levels, and there whenever the class's level is not the one Triton
    gives a request naming none, or the client named one (it must not choose its own level).
    The lane carries only the pairs for which a request naming none needs nothing written
    (sidecar/lane.py), and nginx hands any request naming `PRIORITY` to Python
    (sidecar/tritongen_lane.lua is configured with this name)."""
    if model.priority_levels and (klass.priority != model.default_priority or names_priority):
        return klass.priority
    return None


# The classes of the policy last read, by name: a dict lookup where `class_named` walks the list
# (1 µs of each request's reading). One slot, held with its policy, so a reload replaces it.
_classes: tuple[SidecarPolicy | None, dict[str, ClassPolicy]] = (None, {})


def resolve_class(policy: SidecarPolicy, header_value: str | None, param_value: str | None) -> ClassPolicy:
    """The request's class by the module's rule."""
    global _classes
    held, classes = _classes
    if held is not policy:
        classes = {c.name: c for c in policy.classes}
        _classes = (policy, classes)
    name = header_value if header_value else param_value
    found = classes.get(name.strip() if name else policy.default_class)
    if found is None:
        known = ", ".join(c.name for c in policy.classes)
        raise BadRequest(f"unknown traffic class {name!r}; known classes: {known}")
    return found


def resolve_tenant(header_value: str | None) -> str:
    """The request's tenant by the module's rule. Any name is accepted (tenants the policy does not
    list get its `default_tenant` quota), but only in the policy's name syntax: the value becomes part
    of error bodies, logs and a dictionary key."""
    if header_value is None:
        return DEFAULT_TENANT
    name = header_value.strip()
    if not name:
        return DEFAULT_TENANT
    if len(name) > NAME_MAX_LENGTH or not _TENANT_NAME.fullmatch(name):
        shown = name if len(name) <= 40 else name[:40] + "..."
        raise BadRequest(
            f"tenant {shown!r} is not a tenant name: use letters, digits, '_', '.' and '-' (starting with a "
            f"letter or digit), at most {NAME_MAX_LENGTH} characters"
        )
    return name


def budget_value(value: Any, where: str) -> int:
    """One stated max_tokens by the module's rule: a count of 0 or more, or a 400 naming `where`."""
    count = int_or_none(value)
    if count is None:
        raise BadRequest(f"{where} must hold integers (a whole number of tokens), got {value!r:.80}")
    if count < 0:
        raise BadRequest(f"{where} must be 0 or more tokens, got {count}")
    return count


def sampling_object(value: Any) -> dict[str, Any]:
    """`sampling_parameters` as the JSON object vLLM reads it from (text, or an object already)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        value = bytes(value).decode("utf-8", errors="replace")
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise BadRequest(f"{SAMPLING} is not valid JSON") from None
    if not isinstance(value, dict):
        raise BadRequest(f"{SAMPLING} must be a JSON object, got {value!r:.80}")
    return value


def _counts(values: Iterable[Any], where: str, name: str = "") -> tuple[int, ...]:
    """`budget_value` of each value (`where` formatted with `name` only to say what was wrong)."""
    return tuple([v if type(v) is int and v >= 0 else budget_value(v, where.format(name)) for v in values])


def budget(stated: Stated, tensor_name: str) -> tuple[int | None, ...]:
    """The max_tokens a request states, per sequence (one for all, or none), by the module's rule."""
    if stated.budget_tensor:
        return _counts(stated.budget_tensor, "input {!r}", tensor_name)
    if stated.sampling is not None:
        found = sampling_object(stated.sampling).get(MAX_TOKENS)
        return () if found is None else _counts((found,), f"{SAMPLING}.{MAX_TOKENS}")
    if stated.budget_parameter is not None:
        return _counts((stated.budget_parameter,), f"parameter {MAX_TOKENS!r}")
    return ()


def _per_sequence(max_tokens: tuple[int | None, ...], sequences: int) -> tuple[int | None, ...]:
    """The budgets as one for all or one each; neither (a count that matches no sequence count): the
    largest, for all."""
    if len(max_tokens) > 1 and len(max_tokens) != sequences:
        return (max((m for m in max_tokens if m is not None), default=None),)
    return max_tokens


def id_sequences(ids: Sequence[int], max_tokens: tuple[int | None, ...]) -> LLMFacts:
    """Each sequence of a token-id prompt (its number of ids, its exact tokens) and budget."""
    return LLMFacts(tuple(ids), _per_sequence(max_tokens, len(ids)), prompt_tokens=tuple(ids))


def sequences(prompts: Sequence[Prompt], max_tokens: tuple[int | None, ...], count: TokenCounter | None,
              kv: KVCost | None = None) -> LLMFacts:
    """Each sequence's prompt (bytes, and tokens when the model's tokenizer counts them) and budget;
    with `kv` of an engine that reserves and reuses prefix blocks, each prompt's shareable blocks."""
    if not prompts:
        prompts = (None,)
    max_tokens = _per_sequence(max_tokens, len(prompts))
    lengths = tuple([None if p is None else len(p) for p in prompts])
    tokens: tuple[int | None, ...] | None = None
    if count is not None:
        try:
            tokens = tuple([None if p is None else count(bytes(p)) for p in prompts])
        except Exception as err:  # a prompt the tokenizer cannot read: the byte-ratio estimate stands
            log.debug("token count failed (%s: %s); using the bytes-per-token ratio", type(err).__name__, err)
    keys = None
    if kv is not None and kv.prefix_caching and kv.reserves:
        counted = tokens or (None,) * len(prompts)
        keys = [() if p is None else block_keys(p, prompt_tokens_of(kv, len(p), n), kv.block_tokens)
                for p, n in zip(prompts, counted)]
    return LLMFacts(lengths, max_tokens, prompt_tokens=tokens, prefix_keys=keys)


def read(policy: SidecarPolicy, model: ModelPolicy, model_name: str, stated: Stated, class_header: str | None,
         tenant_header: str | None, count: TokenCounter | None = None) -> Reading:
    """The one reading of a request to `model_name` (its policy entry `model`) from what it states
    and the class and tenant headers (HTTP headers, gRPC metadata, or what nginx passed on)."""
    tenant = resolve_tenant(tenant_header)
    klass = resolve_class(policy, class_header, stated.class_parameter)
    llm = None
    if model.kv is not None:
        wanted = budget(stated, model.kv.max_tokens_input)
        llm = (id_sequences(stated.prompt_ids, wanted) if stated.prompt_ids
               else sequences(stated.prompts, wanted, count, model.kv))
    return Reading(model_name, klass.name, tenant, priority_to_write(model, klass, stated.names_priority), llm)


def lane_reading(model: str, klass: str) -> Reading:
    """A request nginx's lane carries, as its (model, class) key says: nginx sends it only when it
    names no tenant and no priority and its class needs none written (sidecar/lane.py)."""
    return Reading(model, klass, DEFAULT_TENANT, None, None)
