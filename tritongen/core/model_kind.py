"""Whether `tritongen profile` measures a model as an LLM or as a classic network, and who said so.

A decoupled model answers one request with many responses: it is profiled as a streaming LLM, and
`classic` stated for it is refused (a classic profile sends one request and waits for one response).
A model that is not decoupled is, to Triton, a classic model; what would make it an LLM is what it
does with its text, and its config cannot show that: a classifier, a translator, a tokenizer
service or an embedding model answering JSON takes a STRING and answers a STRING just as a
`generate()` wrapper does (issue 43: "where the config cannot tell, a spec field says it, and the
output names what was assumed"). So, for a model that is not decoupled:

- the user's word wins (`StatedKind`): the spec's `kind`, or `--kind MODEL=llm|classic` where the
  profile has no spec. `classic` is profiled as classic whatever its tensors; `llm` is honoured where
  an input can take the prompt (a text input by role, else the model's one STRING input), and
  refused otherwise, naming what the config lacks and the fix;
- without it, a config with an LLM interface by role (`llm_interface.detect_interface`) is taken for
  an LLM, and the profile carries a gap that says it was a guess and how to say otherwise.

Pure: a served config in, a `Classification` out; `KindRefused` is the adapter's BadInput.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from tritongen.core.llm_interface import GENERIC_TEXT_INPUTS, LLMInterface, UnknownInterface
from tritongen.core.llm_interface_config import config_decoupled, config_tensors, interface_from_config
from tritongen.core.profile_types import MeasurementGap

Kind = Literal["llm", "classic"]  # the spec's words (ModelSpec.kind), the flag's too
KINDS: tuple[Kind, ...] = ("llm", "classic")
KIND_FLAG = "--kind"


class KindRefused(ValueError):
    """A stated kind the model's config cannot be profiled as; the message names the model, what
    its config lacks and the fix, in one line."""


@dataclass(frozen=True)
class StatedKind:
    """A model's kind as the user said it: in the spec's `kind:` or with `--kind` (`by_flag`)."""

    kind: Kind
    by_flag: bool = False

    def words(self, model: str) -> str:
        """Where it was said, as the user would write it: 'the spec says kind: llm', '--kind m=llm'."""
        return f"{KIND_FLAG} {model}={self.kind}" if self.by_flag else f"the spec says kind: {self.kind}"


def how_to_say(model: str, kind: Kind) -> str:
    """The two ways to state a model's kind, for messages."""
    return f"kind: {kind} in the spec or {KIND_FLAG} {model}={kind}"


@dataclass(frozen=True)
class Classification:
    """How a model is profiled. `interface`: the LLM interface a model that is not decoupled is
    profiled through (None: profiled as a classic network; a decoupled model's interface is read
    by the streaming steps). `note`: a line for the profile's notes where a stated kind decided
    against the config's look; `gap`: the guess, where nothing was stated and the config decided."""

    profiled_as: Literal["classic", "streaming"]
    interface: LLMInterface | None = None
    note: str | None = None
    gap: MeasurementGap | None = None


def guessed_llm_gap(model: str, interface: LLMInterface) -> MeasurementGap:
    """The gap of a model taken for an LLM from its tensors alone: what was assumed, and how to say otherwise."""
    return MeasurementGap(
        measurement="model kind",
        unseen=f"whether {model} is an LLM: it is not decoupled, and neither a spec `kind` nor {KIND_FLAG} says",
        inferred=f"taken for an LLM from its {'token-id' if interface.speaks_token_ids else 'text'} input "
                 f"{interface.text_input} and output {interface.text_output}; "
                 f"if it is not one, say {how_to_say(model, 'classic')}",
    )


def classify(model: str, config: Mapping[str, Any], stated: StatedKind | None = None) -> Classification:
    """How `model` (its config as the server serves it) is profiled; `KindRefused` where `stated`
    cannot be honoured."""
    if config_decoupled(config):
        if stated is not None and stated.kind == "classic":
            raise KindRefused(
                f"model {model!r}: {stated.words(model)}, but its config is decoupled (many responses per request) and "
                "a classic profile sends one request and reads one response; fix: profile it as an LLM "
                f"({how_to_say(model, 'llm')}), or serve it without model_transaction_policy {{ decoupled: true }}"
            )
        return Classification("streaming")
    try:
        found: LLMInterface | None = interface_from_config(config, model=model)
    except UnknownInterface:
        found = None
    if stated is None:
        if found is None:
            return Classification("classic")
        return Classification("classic", found, gap=guessed_llm_gap(model, found))
    if stated.kind == "classic":
        if found is None:
            return Classification("classic")
        return Classification("classic", note=(
            f"profiled as a classic model ({stated.words(model)}), though its text input {found.text_input} and text "
            f"output {found.text_output} alone would have been taken for an LLM"))
    interface = found or stated_llm_interface(model, config, stated)
    return Classification("classic", interface, note=(
        f"profiled as an LLM that is not decoupled ({stated.words(model)}): the prompt goes to {interface.text_input}, "
        f"the text is read from {interface.text_output}"))


def stated_llm_interface(model: str, config: Mapping[str, Any], stated: StatedKind) -> LLMInterface:
    """The interface of a model the user says is an LLM and whose config has none by role: its one
    STRING input takes the prompt (a name tritongen would not guess: `prompt_in`, `query`). Several
    STRING inputs none of which is named as a prompt are not chosen among: the wrong one would
    carry the prompt into a tensor that means something else."""
    try:
        return interface_from_config(config, model=model)
    except UnknownInterface as err:
        lacks = err.reason or str(err)  # what the config lacks with a prompt input by role
    inputs = config_tensors(config, "input")
    texts = [t.name for t in inputs if t.data_type == "TYPE_STRING" and t.one_element]
    listed = ", ".join(t.label() for t in inputs) or "none listed"
    if inputs and not texts:
        lacks = "no STRING input with one element (dims [1] or [-1]) to take the prompt"
    elif len(texts) > 1 and not set(texts) & set(GENERIC_TEXT_INPUTS):
        lacks = f"several STRING inputs ({', '.join(texts)}), none named {_either(GENERIC_TEXT_INPUTS)}, to take the prompt"
    elif len(texts) == 1:
        try:
            return interface_from_config(config, model=model, text_inputs=(texts[0],))
        except UnknownInterface as err:
            lacks = err.reason or str(err)
    raise KindRefused(
        f"model {model!r} cannot be profiled as an LLM ({stated.words(model)}): {lacks} (its inputs: {listed}); fix: "
        f"profile it as a classic model ({how_to_say(model, 'classic')}), or serve it with what tritongen sends an LLM: "
        f"one STRING prompt input ({GENERIC_TEXT_INPUTS[0]}, dims [1]), one STRING text output, any other input optional"
    )


def _either(names: Iterable[str]) -> str:
    *rest, last = list(names)
    return f"{', '.join(rest)} or {last}" if rest else last


def parse_kind_flags(values: Iterable[str]) -> dict[str, StatedKind]:
    """['ranker=classic', 'chat=llm'] -> each model's StatedKind (by_flag); `ValueError` with the
    one line to show for a value that is not MODEL=llm|classic, or a model given two kinds."""
    out: dict[str, StatedKind] = {}
    for text in values:
        name, sep, kind = text.strip().rpartition("=")
        name, kind = name.strip(), kind.strip().lower()
        if not sep or not name or kind not in KINDS:
            raise ValueError(f"{KIND_FLAG} {text!r}: give MODEL=llm or MODEL=classic (one model a flag; repeat the flag)")
        if name in out and out[name].kind != kind:
            raise ValueError(f"{KIND_FLAG} gives {name!r} two kinds ({out[name].kind} and {kind}); give one")
        out[name] = StatedKind(kind, by_flag=True)  # type: ignore[arg-type]
    return out
