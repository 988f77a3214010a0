"""Render a deployment plan into a Triton model repository, atomically and deterministically.

Everything is rendered in memory and each config.pbtxt is parsed back through Triton's own
`ModelConfig` schema before a single byte is written; then all files are staged beside their
targets and renamed into place. A failed render therefore leaves the previous repository as it
was, and model code and version folders already in the repository are never touched.
"""

from __future__ import annotations

import difflib
import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import jinja2
import yaml

from tritongen.core.plan import DeploymentPlan, plan_deployment
from tritongen.core.profile_types import Profile
from tritongen.core.static_batch import cap_static_batches
from tritongen.core.file_names import POLICY_FILE
from tritongen.core.sidecar_policy.build import build_sidecar_policy
from tritongen.core.sidecar_policy.from_profiles import policy_from_profiles
from tritongen.core.sidecar_policy.schema import parse_policy
from tritongen.core.findings import Finding
from tritongen.core.triton_releases import Release, release_field_findings, trtllm_note
from tritongen.core.trtllm_args import MODEL_YAML, RELEASE
from tritongen.core.trtllm_args_check import check_model_yaml
from tritongen.errors import BadInput, TritongenError
from tritongen.pbtxt import ConfigSyntaxError, field_lines, parse_model_config
from tritongen.profiles import read_profile_files
from tritongen.server_flags import SERVER_FLAGS_FILE
from tritongen.specio import LoadedSpec

SIDECAR_POLICY_FILE = POLICY_FILE
_UMASK = os.umask(0)
os.umask(_UMASK)


def builtin_templates_dir() -> Path:
    """`tritongen/_templates` in an installed wheel, the repository's `templates/` in a checkout."""
    packaged = Path(__file__).parent / "_templates"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parent.parent / "templates"


def pbstr(value: object) -> str:
    """A protobuf text-format string literal."""
    text = str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{text}"'


def yaml_value(value: object) -> str:
    """A YAML value on one line (flow style for a mapping or a list), as model.yaml writes it."""
    text = yaml.safe_dump(value, default_flow_style=True, width=1 << 20, sort_keys=False).strip()
    return text.removesuffix("\n...").removesuffix("...").strip()


def template_env(user_dir: Path | None = None) -> jinja2.Environment:
    loaders: list[jinja2.BaseLoader] = []
    if user_dir is not None:
        if not Path(user_dir).is_dir():
            raise BadInput(f"--templates {user_dir}: not a directory")
        loaders.append(jinja2.FileSystemLoader(str(user_dir)))
    loaders.append(jinja2.FileSystemLoader(str(builtin_templates_dir())))
    env = jinja2.Environment(
        loader=jinja2.ChoiceLoader(loaders),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["pbstr"] = pbstr
    env.filters["yaml"] = yaml_value
    env.filters["json"] = lambda v: json.dumps(v, indent=2, sort_keys=True)
    return env


@dataclass
class RenderedRepository:
    """Relative path -> file text, plus version-folder links for lanes that share model code."""

    files: dict[str, str]
    links: dict[str, str] = field(default_factory=dict)  # "m_long/1" -> "../m_short/1"
    plan: DeploymentPlan | None = None


def _render_template(env: jinja2.Environment, name: str, where: str, **context: object) -> str:
    try:
        text = env.get_template(name).render(**context)
    except jinja2.TemplateError as err:
        line = getattr(err, "lineno", None)
        loc = f"{getattr(err, 'filename', None) or name}{f':{line}' if line else ''}"
        raise BadInput(f"template {loc} failed while rendering {where}: {err}") from None
    return text if text.endswith("\n") else text + "\n"


def render_repository(
    loaded: LoadedSpec,
    templates: Path | None = None,
    measured_pads_mb: dict[str, float] | None = None,
    profiles: Mapping[str, Profile] | None = None,
) -> RenderedRepository:
    """Plan from the spec (and measured pads), then render the plan and the sidecar's policy."""
    plan = plan_deployment(loaded.spec, loaded.architectures, measured_pads_mb)
    if profiles:
        models = {m.name: m for m in loaded.spec.models}
        sizes = {e.name: ((models[e.spec_model].typical_prompt_tokens or 0) + (models[e.spec_model].typical_output_tokens or 0))
                 or None for e in plan.entries}
        plan = cap_static_batches(plan, profiles, sizes)
    policy = build_sidecar_policy(loaded.spec, plan, profiles, model_dir_tokenizers(loaded, plan))
    return render_plan(plan, loaded.path.name, templates, sidecar_policy=policy)


def render_policy_only(profiles_dir: Path, p99_ms: float | None = None) -> RenderedRepository:
    """Without a spec: only the sidecar's policy, from the profiles of a server the user already runs
    (core/sidecar_policy/from_profiles.py). The server's configs are its own; nothing but the policy
    is rendered, and it is validated as the sidecar will read it before anything is written."""
    found = read_profile_files(profiles_dir)
    policy = policy_from_profiles({m: p for m, (_f, p) in found.items()}, {m: str(f) for m, (f, _p) in found.items()},
                                  p99_ms)
    parse_policy(policy, f"the {SIDECAR_POLICY_FILE} rendered from {profiles_dir}")
    return RenderedRepository(files={SIDECAR_POLICY_FILE: json.dumps(policy, indent=2, sort_keys=True) + "\n"})


def model_dir_tokenizers(loaded: LoadedSpec, plan: DeploymentPlan) -> dict[str, str]:
    """Model entry name -> the tokenizer.json of the directory the LLM loads from, for each LLM
    whose spec names no `tokenizer`, so the sidecar counts prompts with the engine's own tokenizer
    instead of a bytes-per-token bound. The directory is what vLLM tokenizes with (its engine
    args' `tokenizer`, else `model`), else the spec's `hf_model`; a relative path is the spec's,
    as every path in it. A hub id names no local directory and adds nothing. The check reads the
    disk, so it lives here and the policy builder (core) takes what it found."""
    found: dict[str, str] = {}
    models = {m.name: m for m in loaded.spec.models}
    for entry in plan.entries:
        model = models[entry.spec_model]
        if entry.kv is None or model.tokenizer is not None:
            continue
        args = entry.engine_args or {}
        source = args.get("tokenizer") or args.get("model") or model.hf_model
        if not source:
            continue
        directory = Path(str(source)).expanduser()
        if not directory.is_absolute():
            directory = loaded.path.parent / directory
        if (directory / "tokenizer.json").is_file():
            found[entry.name] = str((directory / "tokenizer.json").resolve())
    return found


def render_plan(
    plan: DeploymentPlan,
    spec_name: str,
    templates: Path | None = None,
    sidecar_policy: Mapping[str, object] | None = None,
) -> RenderedRepository:
    """Render a plan (from the spec, or one `tune` changed): every config parsed back first."""
    env = template_env(templates)
    files: dict[str, str] = {}
    links: dict[str, str] = {}
    for entry in plan.entries:
        path = f"{entry.name}/config.pbtxt"
        text = _render_template(env, "config.pbtxt.j2", path, m=entry, plan=plan, spec_name=spec_name)
        try:
            parsed = parse_model_config(text, path)
        except ConfigSyntaxError as err:
            raise BadInput(f"the template produced a config Triton would refuse: {err}") from None
        if parsed.name != entry.name:
            raise BadInput(f"{path}: the template wrote name {parsed.name!r}; it must be {entry.name!r}")
        files[path] = text
        if entry.engine_args is not None:
            files[f"{entry.name}/1/model.json"] = _render_template(
                env, "model.json.j2", entry.name, engine_args=entry.engine_args, m=entry
            )
        elif entry.llm_args is not None:
            files[f"{entry.name}/1/{MODEL_YAML}"] = _render_llmapi(env, entry, spec_name)
        elif entry.source_model != entry.name:  # lanes of a Python model share its code
            links[f"{entry.name}/1"] = f"../{entry.source_model}/1"
    files[SERVER_FLAGS_FILE] = _render_template(env, "server_flags.txt.j2", SERVER_FLAGS_FILE, plan=plan)
    if sidecar_policy is not None:
        # The sidecar's own validation, before anything is written: a policy it would refuse at
        # start (or one under which no request could be admitted) fails the render instead.
        parse_policy(sidecar_policy, f"the rendered {SIDECAR_POLICY_FILE}")
        files[SIDECAR_POLICY_FILE] = json.dumps(sidecar_policy, indent=2, sort_keys=True) + "\n"
    return RenderedRepository(files=dict(sorted(files.items())), links=links, plan=plan)


def _render_llmapi(env: jinja2.Environment, entry, spec_name: str) -> str:
    """TensorRT-LLM's model.yaml, read back and checked against the release's key table before
    anything is written: a template (the user's own, too) that drops or mangles a key fails here."""
    path = f"{entry.name}/1/{MODEL_YAML}"
    text = _render_template(env, "model.yaml.j2", path, m=entry, spec_name=spec_name, release=RELEASE)
    try:
        parsed = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise BadInput(f"the template produced a {path} that is not YAML: {err}") from None
    if parsed != entry.llm_args:
        raise BadInput(f"the template produced a {path} that does not say what the plan holds: "
                       f"{parsed!r} instead of {entry.llm_args!r}")
    problems = check_model_yaml(parsed)
    if problems:
        raise BadInput(f"{path} would be refused by TensorRT-LLM {RELEASE}: "
                       + "; ".join(f"{p.key}: {p.message} ({p.fix})" for p in problems))
    return text


def write_repository(rendered: RenderedRepository, out_dir: Path) -> list[str]:
    """Stage every file beside its target, then rename them all; returns the paths that changed."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise BadInput(f"-o {out_dir}: exists and is not a directory")
    changed = [p for p, text in rendered.files.items() if _read(out_dir / p) != text]
    staged: list[tuple[Path, Path]] = []
    created_dirs: list[Path] = []
    try:
        for rel in changed:
            target = out_dir / rel
            for parent in reversed(target.parents):
                if not parent.exists():
                    parent.mkdir()
                    created_dirs.append(parent)
            fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
            with os.fdopen(fd, "w") as handle:
                handle.write(rendered.files[rel])
            os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; a repository is shared
            staged.append((Path(tmp), target))
    except OSError as err:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
        for folder in reversed(created_dirs):
            _rmdir_quiet(folder)
        raise TritongenError(f"cannot write {out_dir}: {err}; nothing was changed") from None
    for tmp, target in staged:
        os.replace(tmp, target)
    for rel, target in rendered.links.items():
        link = out_dir / rel
        if not link.exists() and not link.is_symlink():
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(target)
            changed.append(rel)
    return changed


def drift(rendered: RenderedRepository, out_dir: Path) -> str:
    """A unified diff between what is on disk and what the spec renders ('' when they agree)."""
    chunks: list[str] = []
    for rel, text in rendered.files.items():
        current = _read(Path(out_dir) / rel)
        if current == text:
            continue
        chunks.extend(
            difflib.unified_diff(
                (current or "").splitlines(keepends=True),
                text.splitlines(keepends=True),
                fromfile=f"{out_dir}/{rel} (on disk{'' if current is not None else ', missing'})",
                tofile=f"{out_dir}/{rel} (rendered)",
            )
        )
    for rel, target in rendered.links.items():
        link = Path(out_dir) / rel
        if not link.exists() and not link.is_symlink():
            chunks.append(f"--- {out_dir}/{rel} (missing)\n+++ link to {target}\n")
    return "".join(chunks)


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None


def _rmdir_quiet(folder: Path) -> None:
    try:
        folder.rmdir()
    except OSError:
        pass


def release_findings(rendered: RenderedRepository, release: Release) -> list[Finding]:
    """What `render --triton-release` says about the files it would write: a config.pbtxt field
    the release does not know (TG214; the built-in templates write none, a user's template may),
    one it knows but tritongen does not model (TG215), and a model.yaml whose key table is not the
    release's TensorRT-LLM (TG412)."""
    out: list[Finding] = []
    for path, text in sorted(rendered.files.items()):
        name = path.split("/")[0]
        if path.endswith("/config.pbtxt"):
            out += [f.located(path) for f in release_field_findings(name, field_lines(text), release)]
        elif path.endswith("/" + MODEL_YAML):
            note = trtllm_note(name, path, release, RELEASE)
            out += [note] if note is not None else []
    return out


def render_entry_config(plan: DeploymentPlan, entry_name: str, spec_name: str, templates: Path | None = None) -> str:
    """The config.pbtxt text of one entry (what `tune --verify` loads on a live server)."""
    return render_plan(plan, spec_name, templates).files[f"{entry_name}/config.pbtxt"]
