"""The sidecar image (Containerfile) and its entrypoint (tritongen/sidecar_image.py), without a
process: the Containerfile's invariants (a numeric non-root user, the committed entrypoint, nginx from
the list `make nginx` installs, the entrypoint's ports exposed, a build context that lets in what it
copies), its Python packages against pyproject.toml and against what the sidecar's code imports, the
environment -> flag table, and the pod `tritongen deploy` writes against what the entrypoint reads.
The image was never built in the suite: tests/integration/test_sidecar_image.py runs its entrypoint.
"""

from __future__ import annotations

import ast
import importlib.metadata
import os
import re
import sys
import tomllib
from pathlib import Path

import click
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from typer.main import get_command

from sidecar.nginx_front import INSTALL_HINT
from tests.helpers import EXAMPLES, REPO_ROOT
from tests.import_closure import import_closure, project_modules
from tests.sidecar_rigs import TINI, containerfile_instructions, containerfile_values, image_entrypoint, image_user
from tritongen import sidecar_image
from tritongen.cli.main import app
from tritongen.errors import BadInput
from tritongen.k8s import DeployOptions, render_manifests
from tritongen.render import render_repository
from tritongen.sidecar_image import (
    DEFAULT_SIDECAR_IMAGE, GRPC_PORT, HTTP_PORT, METRICS_PORT, VARIABLES, pod_env, sidecar_argv,
)
from tritongen.specio import load_spec

NGINX_LIST = REPO_ROOT / "requirements" / "nginx-debian.txt"
SIDECAR_REQUIREMENTS = REPO_ROOT / "requirements" / "sidecar.txt"
PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
# pyproject.toml's dependencies the image leaves out, and why: a new dependency must be placed.
LEFT_OUT = {
    "nvidia-pytriton": "the tritonserver binary: Triton runs in its own container",
    "jinja2": "render's and deploy's templates",
    "pyyaml": "specs and manifests",
}
EXTRAS_IN = ("tokenizer",)  # optional dependencies the image carries: exact prompt token counts
# What `tritongen sidecar` runs, from the image's entrypoint on.
SIDECAR_ROOTS = ["tritongen.sidecar_image", "tritongen.cli.__main__", "tritongen.cli.sidecar_cmd", "sidecar.run"]


# ------------------------------------------------------------------------------------------------
# The Containerfile


def test_the_image_runs_as_a_numeric_non_root_user() -> None:
    """runAsNonRoot can check a number only: a USER by name is refused by the kubelet."""
    uid, gid = image_user()
    assert uid > 0 and gid > 0
    (created,) = [r for r in containerfile_values("RUN") if "useradd" in r]
    assert f"--uid {uid}" in created and f"--gid {gid}" in created
    keywords = [k for k, _ in containerfile_instructions()]
    assert keywords.index("USER") > max(i for i, k in enumerate(keywords) if k == "RUN"), "a RUN after USER"


def test_the_entrypoint_is_the_committed_module_behind_tini() -> None:
    entrypoint = image_entrypoint()
    assert entrypoint[: len(TINI)] == TINI
    assert "tini" in next(r for r in containerfile_values("RUN") if "apt-get install" in r).split()
    python, dash_m, module = entrypoint[len(TINI):]
    assert (python, dash_m, module) == ("python3", "-m", sidecar_image.__name__)
    source = REPO_ROOT / (module.replace(".", "/") + ".py")
    tree = ast.parse(source.read_text())
    runs_main = [n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)
                 and "main()" in ast.unparse(n)]
    assert runs_main, f"{source} must call main() when run with -m"
    assert (REPO_ROOT / "tritongen" / "cli" / "__main__.py").is_file()  # what main() execs


def test_nginx_packages_are_the_list_make_nginx_installs() -> None:
    """One list, read by both: the Makefile's NGINX_PACKAGES and the image's apt-get line."""
    packages = NGINX_LIST.read_text().split()
    assert packages == ["nginx-light", "libnginx-mod-http-lua"]
    makefile = (REPO_ROOT / "Makefile").read_text()
    assert re.search(r"^NGINX_PACKAGES := \$\(shell cat requirements/nginx-debian\.txt\)$", makefile, re.M)
    assert "requirements/nginx-debian.txt /tmp/nginx-debian.txt" in containerfile_values("COPY")
    install = next(r for r in containerfile_values("RUN") if "apt-get install" in r)
    assert "--no-install-recommends $(cat /tmp/nginx-debian.txt)" in install
    assert all(p in INSTALL_HINT for p in packages)  # the sidecar's own hint names the same packages


def test_the_image_exposes_the_entrypoints_listeners() -> None:
    exposed = [int(p) for p in " ".join(containerfile_values("EXPOSE")).split()]
    assert exposed == [HTTP_PORT, GRPC_PORT, METRICS_PORT]
    defaults = {v.flag: v.image_default for v in VARIABLES}
    assert [defaults[f] for f in ("--listen", "--grpc-listen", "--metrics-listen")] == [
        f"0.0.0.0:{p}" for p in exposed]
    assert defaults["--front"] == "native"
    assert not containerfile_values("HEALTHCHECK")  # the sidecar's health is Triton's, passed through


def test_the_build_context_lets_in_what_the_containerfile_copies() -> None:
    """The context is the repository (a .venv of gigabytes): .dockerignore lets in only what is copied."""
    ignore = (REPO_ROOT / ".dockerignore").read_text().splitlines()
    assert ignore[ignore.index("*") - 1].startswith("#") and "*" in ignore
    allowed = {line[1:] for line in ignore if line.startswith("!")}
    copied = {src for args in containerfile_values("COPY") for src in args.split()[:-1]}
    assert copied == allowed
    assert all((REPO_ROOT / src).exists() for src in copied)


def test_the_docs_build_the_tag_deploy_names() -> None:
    """The README and docs/sidecar.md build what `deploy` names by default, as the Containerfile says."""
    tag = f"-t {DEFAULT_SIDECAR_IMAGE} ."
    for doc in ("README.md", "docs/sidecar.md", "Containerfile"):
        text = (REPO_ROOT / doc).read_text()
        assert f"docker build -f Containerfile {tag}" in text, doc
    assert f"podman build {tag}" in (REPO_ROOT / "docs" / "sidecar.md").read_text()
    assert DeployOptions().sidecar_image == DEFAULT_SIDECAR_IMAGE


# ------------------------------------------------------------------------------------------------
# Its Python packages


def _requirements(path: Path) -> list[Requirement]:
    return [Requirement(line) for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]


def _declared() -> dict[str, Requirement]:
    """pyproject.toml's dependencies and the extras the image carries, by canonical name."""
    lines = [*PYPROJECT["dependencies"], *(d for e in EXTRAS_IN for d in PYPROJECT["optional-dependencies"][e])]
    return {canonicalize_name(r.name): r for r in map(Requirement, lines)}


def test_each_image_requirement_is_pyprojects_at_its_version() -> None:
    declared = _declared()
    for req in _requirements(SIDECAR_REQUIREMENTS):
        name = canonicalize_name(req.name)
        assert name in declared, f"{req} is not a dependency in pyproject.toml"
        theirs = declared[name]
        assert (req.specifier, req.marker) == (theirs.specifier, theirs.marker), f"{req} vs pyproject's {theirs}"
        # fewer extras than pyproject asks for; `all` stands for every one the package offers
        offered = set(importlib.metadata.metadata(req.name).get_all("Provides-Extra") or [])
        assert req.extras <= (offered if "all" in theirs.extras else theirs.extras), f"{req} vs pyproject's {theirs}"
    left_out = set(declared) - {canonicalize_name(r.name) for r in _requirements(SIDECAR_REQUIREMENTS)}
    assert left_out == set(LEFT_OUT), "place each dependency: in requirements/sidecar.txt or in LEFT_OUT with why"


def _installed_closure(requirements: list[Requirement]) -> set[str]:
    """The distributions installing `requirements` brings (their own requirements, extras
    included), as the installed metadata states them."""
    seen: set[str] = set()
    pending = [(r, frozenset(r.extras)) for r in requirements]
    while pending:
        req, extras = pending.pop()
        name = canonicalize_name(req.name)
        if name in seen and not extras:
            continue
        seen.add(name)
        for line in importlib.metadata.requires(req.name) or []:
            sub = Requirement(line)
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in ("", *extras)):
                pending.append((sub, frozenset(sub.extras)))
    return seen


def test_every_package_the_sidecar_imports_comes_with_the_image_requirements() -> None:
    """Read from the source (tests/import_closure.py): what the entrypoint, the CLI's sidecar
    command and the sidecar import, lazily too, must be installed by requirements/sidecar.txt."""
    outside = import_closure(SIDECAR_ROOTS, project_modules("tritongen", "sidecar")).outside
    third_party = sorted(m for m in outside if m not in sys.stdlib_module_names)
    provided = _installed_closure(_requirements(SIDECAR_REQUIREMENTS))
    by_module = importlib.metadata.packages_distributions()
    missing = [m for m in third_party if not {canonicalize_name(d) for d in by_module.get(m, [])} & provided]
    assert not missing, f"the sidecar imports {missing}, which requirements/sidecar.txt does not install"
    assert {"aiohttp", "grpc", "tritonclient", "tokenizers"} <= set(third_party)  # the closure saw the sidecar


# ------------------------------------------------------------------------------------------------
# The environment -> flag table


def test_the_image_maps_every_flag_of_tritongen_sidecar() -> None:
    command = get_command(app).commands["sidecar"]  # type: ignore[attr-defined]
    shown = {opt for p in command.params if isinstance(p, click.Option) and not p.hidden for opt in p.opts
             if opt.startswith("--")}
    assert {v.flag for v in VARIABLES} == shown
    assert len({v.env for v in VARIABLES}) == len(VARIABLES)


def test_env_becomes_flags_with_the_images_defaults_then_the_arguments() -> None:
    env = {"TRITONGEN_SIDECAR_POLICY": "/models/p.json", "TRITONGEN_SIDECAR_URL": "127.0.0.1:8000",
           "TRITONGEN_SIDECAR_GRPC_URL": "127.0.0.1:8001", "TRITONGEN_SIDECAR_TOKEN_FILE": "/secret/token",
           "TRITONGEN_SIDECAR_METRICS_URL": " ", "UNRELATED": "x"}
    assert sidecar_argv(env, ["--log-level", "debug"]) == [
        "sidecar", "--policy", "/models/p.json", "--url", "127.0.0.1:8000", "--grpc-url", "127.0.0.1:8001",
        "--listen", "0.0.0.0:9000", "--grpc-listen", "0.0.0.0:9001", "--metrics-listen", "0.0.0.0:9002",
        "--token-file", "/secret/token", "--front", "native", "--log-level", "debug",
    ]
    moved = sidecar_argv({**env, "TRITONGEN_SIDECAR_FRONT": "python", "TRITONGEN_SIDECAR_LISTEN": "[::]:9000"})
    assert moved[moved.index("--front") + 1] == "python" and moved[moved.index("--listen") + 1] == "[::]:9000"


def test_a_missing_policy_or_url_names_the_variable() -> None:
    with pytest.raises(BadInput) as err:
        sidecar_argv({"TRITONGEN_SIDECAR_POLICY": ""})
    assert "TRITONGEN_SIDECAR_POLICY (--policy" in str(err.value) and "TRITONGEN_SIDECAR_URL (--url" in str(err.value)
    # flags after the image name count: `docker run IMAGE --policy p.json --url=triton:8000`
    assert sidecar_argv({}, ["--policy", "p.json", "--url=triton:8000"])[-3:] == ["--policy", "p.json", "--url=triton:8000"]


def test_main_execs_the_sidecar_on_its_own_interpreter(monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """Same PID (exec, no child), the interpreter the entrypoint runs on, the console script's code."""
    calls: list[tuple[str, list[str]]] = []
    monkeypatch.setattr(os, "execv", lambda path, argv: calls.append((path, list(argv))))
    monkeypatch.setattr(sys, "argv", ["tritongen.sidecar_image", "--log-level", "debug"])
    monkeypatch.setattr(os, "environ", {"TRITONGEN_SIDECAR_POLICY": "/p.json", "TRITONGEN_SIDECAR_URL": "h:8000"})
    sidecar_image.main()
    ((path, argv),) = calls
    assert path == sys.executable and argv[:3] == [sys.executable, "-m", "tritongen.cli"]
    assert argv[3:] == sidecar_argv(os.environ, ["--log-level", "debug"])
    assert "exec -m tritongen.cli sidecar --policy /p.json" in capsys.readouterr().err
    monkeypatch.setattr(os, "environ", {})
    with pytest.raises(SystemExit) as stop:
        sidecar_image.main()
    assert stop.value.code == 2 and "TRITONGEN_SIDECAR_URL" in capsys.readouterr().err and len(calls) == 1


def test_pod_env_refuses_a_flag_the_image_does_not_read() -> None:
    with pytest.raises(ValueError, match="--upstream"):
        pod_env({"--upstream": "x"})


# ------------------------------------------------------------------------------------------------
# The pod deploy writes, against the image


@pytest.mark.parametrize("spec", ["deployment.yaml", "gpu-deployment.yaml"])
def test_the_pod_sets_what_the_entrypoint_reads_and_gives_it_what_the_image_needs(spec: str) -> None:
    loaded = load_spec(EXAMPLES / spec)
    manifests = render_manifests(loaded.spec, render_repository(loaded), DeployOptions(), spec)
    pod = next(o for o in manifests.objects if o["kind"] == "Deployment")["spec"]["template"]["spec"]
    sidecar = next(c for c in pod["containers"] if c["name"] == "sidecar")
    assert sidecar["image"] == DEFAULT_SIDECAR_IMAGE and "command" not in sidecar  # the image's ENTRYPOINT runs
    env = {e["name"]: e["value"] for e in sidecar["env"]}
    assert set(env) <= {v.env for v in VARIABLES}, "the pod sets a variable the entrypoint does not read"
    argv = sidecar_argv(env)
    flag = dict(zip(argv[1::2], argv[2::2]))
    mounts = {m["mountPath"]: m["name"] for m in sidecar["volumeMounts"]}
    assert any(flag["--policy"].startswith(path + "/") for path in mounts)  # the policy is in a mounted volume
    ports = {p["containerPort"] for p in sidecar["ports"]}
    assert {int(flag[f].rsplit(":", 1)[1]) for f in ("--listen", "--grpc-listen", "--metrics-listen")} == ports
    # runAsNonRoot holds because the image's USER is numeric and not 0; the read-only root leaves
    # nginx only $TMPDIR, which the pod mounts from an emptyDir.
    security = sidecar["securityContext"]
    assert security["runAsNonRoot"] and security["readOnlyRootFilesystem"] and image_user()[0] > 0
    assert "TMPDIR=/tmp" in " ".join(containerfile_values("ENV"))
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]
