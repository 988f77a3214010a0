"""The Jinja environment the Kubernetes manifests are rendered with (a user's template folder first,
then the built-in one), its filters, and the pod scripts shipped beside the templates."""

from __future__ import annotations

import json
from pathlib import Path

import jinja2
import yaml

from tritongen.errors import BadInput
from tritongen.render import builtin_templates_dir


def shq(value: object) -> str:
    """Single-quote for POSIX sh."""
    return "'" + str(value).replace("'", "'\"'\"'") + "'"


def _yaml_filter(value: object, indent: int = 0) -> str:
    """Block YAML of a value, every line indented by `indent` (multi-line strings as literal blocks)."""

    class _Dumper(yaml.SafeDumper):
        pass

    def _str(dumper: yaml.SafeDumper, data: str) -> yaml.Node:
        style = "|" if "\n" in data else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)

    _Dumper.add_representer(str, _str)
    text = yaml.dump(value, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=4096, allow_unicode=True)
    pad = " " * indent
    return "\n".join(pad + line if line else line for line in text.rstrip("\n").split("\n"))


def k8s_template_env(user_dir: Path | None = None) -> jinja2.Environment:
    loaders: list[jinja2.BaseLoader] = []
    if user_dir is not None:
        if not Path(user_dir).is_dir():
            raise BadInput(f"--templates {user_dir}: not a directory")
        loaders.append(jinja2.FileSystemLoader(str(user_dir)))
    loaders.append(jinja2.FileSystemLoader(str(builtin_templates_dir() / "k8s")))
    env = jinja2.Environment(
        loader=jinja2.ChoiceLoader(loaders), undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["q"] = lambda v: json.dumps(v)  # a JSON string is a valid YAML scalar
    env.filters["yaml"] = _yaml_filter
    env.filters["shq"] = shq
    return env


def script_text(name: str) -> str:
    return (builtin_templates_dir() / "k8s" / "scripts" / name).read_text()
