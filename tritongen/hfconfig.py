"""Read a Hugging Face `config.json` from disk; the parsing itself is pure and lives in core."""

from __future__ import annotations

import json
from pathlib import Path

from tritongen.core.architecture import Architecture
from tritongen.core.hf_architecture import architecture_from_hf
from tritongen.errors import BadInput

_JSON_KINDS = {list: "array", str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}


def load_architecture(path: Path) -> Architecture:
    """Load `path` and parse it; every failure is one BadInput naming the file and the fix."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BadInput(f"{path}: no such file; pass the path to a model's config.json.") from None
    except IsADirectoryError:
        raise BadInput(
            f"{path}: is a directory; pass the config.json inside it ({path / 'config.json'})."
        ) from None
    except UnicodeDecodeError as err:
        raise BadInput(f"{path}: not UTF-8 text ({err.reason}); is this a config.json?") from None
    except OSError as err:
        raise BadInput(f"{path}: cannot read ({err.strerror or err}).") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise BadInput(
            f"{path}:{err.lineno}:{err.colno}: not valid JSON ({err.msg}); fix the file or "
            "download config.json again."
        ) from None
    if not isinstance(data, dict):
        kind = _JSON_KINDS.get(type(data), type(data).__name__)
        raise BadInput(
            f"{path}: expected a JSON object with the model's settings, got a JSON {kind}; "
            "is this a Hugging Face model config?"
        )
    return architecture_from_hf(data, source=str(path))
