"""Read and write Triton's `config.pbtxt` through Triton's own protobuf schema.

`parse_model_config` is the same check the server does first (`failed to read text proto`): it
rejects unknown field names, unknown enum values, two members of a oneof (for example
`dynamic_batching` together with `sequence_batching`) and repeated singular fields, and reports
them as `file:line:column: message`. `field_lines` maps the dotted field paths used by
`tritongen.core.findings.Finding.field` back to line numbers in the text.
"""

from __future__ import annotations

import re

from google.protobuf import json_format, text_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from tritonclient.grpc.model_config_pb2 import ModelConfig

from tritongen.errors import BadInput

__all__ = [
    "ConfigSyntaxError",
    "ModelConfig",
    "config_to_json",
    "config_to_text",
    "field_line",
    "field_lines",
    "parse_model_config",
]

_LOCATION_PREFIX = re.compile(r"^\s*(\d+):(\d+)\s*:\s*")


class ConfigSyntaxError(BadInput):
    """A config.pbtxt that Triton's schema rejects; `str()` is `path:line:column: message`."""

    def __init__(self, path: str, line: int | None, column: int | None, message: str) -> None:
        self.path = path
        self.line = line
        self.column = column
        self.reason = message
        where = path
        if line is not None:
            where += f":{line}"
            if column is not None:
                where += f":{column}"
        super().__init__(f"{where}: {message}")


def parse_model_config(text: str, path: str = "config.pbtxt") -> ModelConfig:
    """Parse config.pbtxt text into `ModelConfig`; raise `ConfigSyntaxError` with its location."""
    config = ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as err:
        line = err.GetLine() if hasattr(err, "GetLine") else None
        column = err.GetColumn() if hasattr(err, "GetColumn") else None
        message = _LOCATION_PREFIX.sub("", str(err)).strip() or "syntax error"
        raise ConfigSyntaxError(path, line if line and line > 0 else None, column or None, message) from None
    return config


def config_from_served(served: dict, where: str) -> ModelConfig:
    """A config as the server reports it (GET /v2/models/M/config: protobuf's JSON mapping) as
    `ModelConfig`; fields this ModelConfig does not know (a newer server's) are left out."""
    try:
        return json_format.ParseDict(served, ModelConfig(), ignore_unknown_fields=True)
    except json_format.ParseError as err:
        raise BadInput(f"{where}: the served config cannot be read as a ModelConfig: {err}") from None


def config_to_text(config: ModelConfig) -> str:
    """Text format, the way config.pbtxt files are written."""
    return text_format.MessageToString(config)


def config_to_json(config: ModelConfig) -> str:
    """JSON as the model-load API (`POST /v2/repository/models/M/load`, `parameters.config`) takes it."""
    return json_format.MessageToJson(config, preserving_proto_field_name=True)


def _field(descriptor: Descriptor | None, name: str) -> FieldDescriptor | None:
    if descriptor is None:
        return None
    return descriptor.fields_by_name.get(name)


def _is_map(field: FieldDescriptor | None) -> bool:
    return bool(
        field is not None
        and field.message_type is not None
        and field.message_type.GetOptions().map_entry
    )


def _is_repeated(field: FieldDescriptor | None) -> bool:
    if field is None:
        return False
    repeated = getattr(field, "is_repeated", None)
    if repeated is not None:
        return bool(repeated)
    return field.label == FieldDescriptor.LABEL_REPEATED


def field_lines(text: str) -> dict[str, int]:
    """Dotted field path -> 1-based line where it is first written.

    Repeated messages are indexed in order (`input[1].dims`, `instance_group[0]`); maps and
    scalar lists are not (`dynamic_batching.priority_queue_policy`, `input[0].dims`). Best effort:
    returns what it could read before any syntax error.
    """
    out: dict[str, int] = {}
    try:
        tokenizer = text_format.Tokenizer(text.splitlines())
        _walk(tokenizer, ModelConfig.DESCRIPTOR, "", out, end=None)
    except (text_format.ParseError, ValueError, IndexError):
        pass
    return out


def field_line(text: str, field: str) -> int | None:
    """Line of `field`, or of its closest written parent (`a.b[1].c` -> `a.b[1]` -> `a`)."""
    lines = field_lines(text)
    path = field
    while path:
        if path in lines:
            return lines[path]
        cut = max(path.rfind("."), path.rfind("["))
        path = path[:cut] if cut > 0 else ""
    return None


def _walk(tok: text_format.Tokenizer, descriptor: Descriptor | None, prefix: str, out: dict[str, int], end: str | None) -> None:
    counts: dict[str, int] = {}
    while not tok.AtEnd() and tok.token != end:
        line = tok._line + 1  # noqa: SLF001 - the tokenizer exposes no public accessor
        if tok.token == "[":  # extension or Any type URL: skip the bracketed name
            while not tok.AtEnd() and tok.token != "]":
                tok.NextToken()
            tok.NextToken()
            name = ""
        else:
            name = tok.token
            tok.NextToken()
        field = _field(descriptor, name)
        child_descriptor = field.message_type if field is not None else None
        base = f"{prefix}{name}"
        tok.TryConsume(":")

        def element_path() -> str:
            if _is_repeated(field) and not _is_map(field) and child_descriptor is not None:
                index = counts.get(name, 0)
                counts[name] = index + 1
                return f"{base}[{index}]"
            return base

        def record(path: str, at: int) -> None:
            out.setdefault(base, at)
            out.setdefault(path, at)

        def message(at: int) -> None:
            path = element_path()
            record(path, at)
            close = "}" if tok.token == "{" else ">"
            tok.NextToken()
            _walk(tok, child_descriptor, path + ".", out, end=close)
            tok.NextToken()

        if tok.token in ("{", "<"):
            message(line)
        elif tok.token == "[":
            out.setdefault(base, line)
            tok.NextToken()
            while not tok.AtEnd() and tok.token != "]":
                at = tok._line + 1  # noqa: SLF001
                if tok.token in ("{", "<"):
                    message(at)
                else:
                    record(element_path(), at)
                    _skip_scalar(tok)
                tok.TryConsume(",")
            tok.NextToken()
        else:
            record(element_path(), line)
            _skip_scalar(tok)
        if not tok.TryConsume(","):
            tok.TryConsume(";")


def _skip_scalar(tok: text_format.Tokenizer) -> None:
    if tok.token.startswith(("'", '"')):
        while tok.token.startswith(("'", '"')):  # adjacent strings concatenate
            tok.NextToken()
        return
    if tok.token == "-":
        tok.NextToken()
    tok.NextToken()
