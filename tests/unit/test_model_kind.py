"""Whether a model is profiled as an LLM or as a classic network (tritongen/core/model_kind.py),
and `--kind`, the flag that says it without a spec (issue 43: "where the config cannot tell, a
spec field says it, and the output names what was assumed").

The configs are built here, as a server serves them (GET /v2/models/M/config), for models nobody
shipped: a text classifier, a summarizer behind an odd input name, a feature scorer. No process,
no port: the spec is written to tmp_path, the server is `ServedIndex`, and the one profile run
stops at its first step (a memory probe that refuses), which still writes the partial profile.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from tests.helpers import ServedIndex
from tritongen.cli.main import app
from tritongen.cli.shared import kind_flags
from tritongen.core.model_kind import KindRefused, StatedKind, classify, parse_kind_flags
from tritongen.errors import BadInput
from tritongen.profiler.targets import resolve_targets
from tritongen.specio import load_spec

runner = CliRunner()


def tensor(name: str, data_type: str, dims: list[int] | None = None) -> dict[str, Any]:
    return {"name": name, "data_type": data_type, "dims": dims or [1]}


def served(inputs: list[dict], outputs: list[dict], decoupled: bool = False, max_batch_size: int = 16) -> dict:
    config: dict[str, Any] = {"backend": "python", "max_batch_size": max_batch_size, "input": inputs, "output": outputs}
    if decoupled:
        config["model_transaction_policy"] = {"decoupled": True}
    return config


# A sentiment classifier: STRING text in, a STRING label out. By its tensors alone, an LLM.
TAGGER = served([tensor("text", "TYPE_STRING")], [tensor("label", "TYPE_STRING")])
# A summarizer whose prompt input has a name tritongen does not guess.
DIGEST = served([tensor("passage", "TYPE_STRING"), {**tensor("budget", "TYPE_INT32"), "optional": True}],
                [tensor("summary", "TYPE_STRING")])
# A feature scorer: numbers in, numbers out.
SCORER = served([tensor("features", "TYPE_FP32", [24])], [tensor("score", "TYPE_FP32")])
# A decoupled text model: it streams, so it is an LLM whatever is said.
STREAMER = served([tensor("prompt", "TYPE_STRING")], [tensor("reply", "TYPE_STRING")], decoupled=True)


# ------------------------------------------------------------------------------------------------
# classification


def test_a_text_classifier_said_classic_is_profiled_classic_and_the_note_names_who_said_it() -> None:
    for stated, who in ((StatedKind("classic"), "the spec says kind: classic"),
                        (StatedKind("classic", by_flag=True), "--kind tagger=classic")):
        how = classify("tagger", TAGGER, stated)
        assert (how.profiled_as, how.interface, how.gap) == ("classic", None, None)
        assert how.note is not None and who in how.note and "text input text and text output label" in how.note


def test_a_text_classifier_nobody_named_is_taken_for_an_llm_and_the_gap_says_how_to_say_otherwise() -> None:
    how = classify("tagger", TAGGER)
    assert how.profiled_as == "classic" and how.interface is not None  # measured as an LLM that is not decoupled
    assert (how.interface.text_input, how.interface.text_output) == ("text", "label")
    assert how.note is None and how.gap is not None
    assert how.gap.measurement == "model kind"
    assert how.gap.inferred == ("taken for an LLM from its text input text and output label; if it is not one, "
                                "say kind: classic in the spec or --kind tagger=classic")
    assert "neither a spec `kind` nor --kind" in how.gap.unseen


def test_a_decoupled_model_streams_whatever_its_names_and_classic_is_refused() -> None:
    assert classify("streamer", STREAMER).profiled_as == "streaming"
    assert classify("streamer", STREAMER, StatedKind("llm")).profiled_as == "streaming"
    with pytest.raises(KindRefused) as refused:
        classify("streamer", STREAMER, StatedKind("classic", by_flag=True))
    said = str(refused.value)
    assert "'streamer'" in said and "--kind streamer=classic" in said and "decoupled" in said
    assert "--kind streamer=llm" in said and "\n" not in said


def test_a_numeric_model_is_classic_unless_said_llm_which_is_refused_naming_what_it_lacks() -> None:
    assert classify("scorer", SCORER) == classify("scorer", SCORER, StatedKind("classic"))
    how = classify("scorer", SCORER)
    assert (how.profiled_as, how.interface, how.note, how.gap) == ("classic", None, None, None)
    with pytest.raises(KindRefused) as refused:
        classify("scorer", SCORER, StatedKind("llm", by_flag=True))
    said = str(refused.value)
    assert said.startswith("model 'scorer' cannot be profiled as an LLM (--kind scorer=llm)")
    assert "no STRING input" in said and "features FP32 [24]" in said
    assert "--kind scorer=classic" in said and "\n" not in said


def test_llm_said_of_a_model_whose_one_string_input_has_an_unguessed_name_takes_the_prompt_there() -> None:
    assert classify("digest", DIGEST).interface is None  # not guessed: "passage" is no prompt name
    how = classify("digest", DIGEST, StatedKind("llm"))
    assert how.interface is not None and how.gap is None
    assert (how.interface.text_input, how.interface.text_output) == ("passage", "summary")
    assert how.note is not None and "the spec says kind: llm" in how.note


def test_llm_said_of_a_model_with_two_unnamed_string_inputs_is_refused_rather_than_guessed() -> None:
    pair = served([tensor("source", "TYPE_STRING"), tensor("target_lang", "TYPE_STRING")], [tensor("out", "TYPE_STRING")])
    with pytest.raises(KindRefused, match=r"several STRING inputs \(source, target_lang\), none named text_input, "
                                          r"prompt or text"):
        classify("translator", pair, StatedKind("llm"))
    # a required input tritongen cannot fill: the config's own reason, not a made-up one
    required = served([tensor("text", "TYPE_STRING"), tensor("lang", "TYPE_STRING")], [tensor("out", "TYPE_STRING")])
    with pytest.raises(KindRefused, match="requires inputs tritongen cannot fill: lang STRING"):
        classify("translator", required, StatedKind("llm"))


# ------------------------------------------------------------------------------------------------
# resolution: the spec's kind wins, and --kind where there is no spec

SPEC = """\
version: 1
name: unseen-models
hardware: {gpus: [], cpu_memory_mb: 512}
models:
  - name: tagger
    backend: python
    kind: classic
    max_batch_size: 16
    inputs: [{name: text, data_type: STRING, dims: [1]}]
    outputs: [{name: label, data_type: STRING, dims: [1]}]
  - name: digest
    backend: python
    kind: llm
    architecture: {family: llama, num_layers: 2, hidden_size: 64, num_attention_heads: 4, num_kv_heads: 2,
                   head_dim: 16, dtype: fp32, attention: gqa}
    weights: {parameters: 100000, dtype: fp32}
    max_context: 256
    memory_quota_mb: 32
    inputs:
      - {name: passage, data_type: STRING, dims: [1]}
      - {name: budget, data_type: INT32, dims: [1], optional: true}
    outputs: [{name: summary, data_type: STRING, dims: [1]}]
traffic_classes:
  - {name: all, kind: normal, priority: 1, p99_ms: 1000, share: 1.0}
policy: {kv_safety_pad_mb: 1, framework_reserve_mb: 0.5}
"""


def test_the_specs_kind_wins_over_the_configs_look(tmp_path: Path) -> None:
    (tmp_path / "spec.yaml").write_text(SPEC)
    loaded = load_spec(tmp_path / "spec.yaml")
    targets = {t.name: t for t in resolve_targets(ServedIndex({"tagger": TAGGER, "digest": DIGEST}), [], loaded)}  # type: ignore[arg-type]
    assert targets["tagger"].interface is None and targets["tagger"].kind_gap is None  # kind: classic
    assert targets["digest"].interface is not None and targets["digest"].interface.text_input == "passage"
    with pytest.raises(BadInput, match="model 'digest' cannot be profiled as an LLM \\(the spec says kind: llm\\)"):
        resolve_targets(ServedIndex({"tagger": TAGGER, "digest": SCORER}), ["digest"], loaded)  # type: ignore[arg-type]


def test_kind_flags_state_kinds_without_a_spec_and_the_rest_are_guessed() -> None:
    index = ServedIndex({"tagger": TAGGER, "other_tagger": TAGGER, "scorer": SCORER})
    kinds = kind_flags(["tagger=classic"], ["tagger", "other_tagger", "scorer"], with_spec=False)
    targets = {t.name: t for t in resolve_targets(index, ["tagger", "other_tagger", "scorer"], None, kinds)}  # type: ignore[arg-type]
    assert targets["tagger"].interface is None and "--kind tagger=classic" in (targets["tagger"].kind_note or "")
    assert targets["other_tagger"].interface is not None and targets["other_tagger"].kind_gap is not None
    assert targets["scorer"].interface is None and targets["scorer"].kind_gap is None


def test_the_guess_is_in_the_profile_and_the_table_even_when_the_run_stops_at_once(tmp_path: Path) -> None:
    from tritongen.cli.profile_cmd import results_tables
    from tritongen.profiler.run import Profiler, default_settings
    from tritongen.triton_admin import Endpoints

    (target,) = resolve_targets(ServedIndex({"tagger": TAGGER}), ["tagger"], None)  # type: ignore[arg-type]

    def no_probe(_target):
        raise BadInput("stopped here on purpose")

    endpoints = Endpoints(http="127.0.0.1:9", grpc="127.0.0.1:9", metrics="http://127.0.0.1:9/metrics")
    profiler = Profiler(None, endpoints, default_settings(quick=True), tmp_path, probe_factory=no_probe)  # type: ignore[arg-type]
    with pytest.raises(BadInput):
        profiler.profile(target)
    (profile,) = profiler.profiles
    assert not profile.complete and [g.measurement for g in profile.gaps] == ["model kind"]
    console = Console(record=True, width=400)
    for table in results_tables([profile]):
        console.print(table)
    shown = console.export_text()
    assert "model kind" in shown and "--kind tagger=classic" in shown


# ------------------------------------------------------------------------------------------------
# the flag


def test_kind_flags_parse_model_equals_kind() -> None:
    assert parse_kind_flags(["a=llm", " b = CLASSIC ", "a=llm"]) == {"a": StatedKind("llm", True), "b": StatedKind("classic", True)}
    assert parse_kind_flags(["ns/with=eq=classic"]) == {"ns/with=eq": StatedKind("classic", True)}  # the last = splits
    for bad in ("tagger", "tagger=", "=llm", "tagger=generator"):
        with pytest.raises(ValueError, match=r"--kind .*give MODEL=llm or MODEL=classic"):
            parse_kind_flags([bad])
    with pytest.raises(ValueError, match="two kinds"):
        parse_kind_flags(["a=llm", "a=classic"])


def refused(*args: str) -> str:
    """The BadInput message `tritongen profile` stops with, before any server is reached (exit code 2)."""
    done = runner.invoke(app, ["profile", *args, "--url", "127.0.0.1:9", "-o", "unused"])
    assert isinstance(done.exception, BadInput), done.output
    assert done.exception.exit_code == 2
    said = str(done.exception)
    assert "\n" not in said and "--kind" in said
    return said


def test_the_kind_flags_bad_input_is_one_line_naming_the_flag_and_the_fix(tmp_path: Path) -> None:
    assert "add --model tagger or drop that --kind" in refused("-m", "scorer", "--kind", "tagger=classic")
    assert "MODEL=llm or MODEL=classic" in refused("-m", "tagger", "--kind", "tagger:classic")
    assert "two kinds" in refused("-m", "tagger", "--kind", "tagger=classic", "--kind", "tagger=llm")
    (tmp_path / "spec.yaml").write_text(SPEC)
    assert "`kind:`" in refused(str(tmp_path / "spec.yaml"), "--kind", "tagger=classic")
    assert not Path("unused").exists()
