"""The house rules of the layout (shared/docs/architecture.md), checked rather than hoped for:
`tritongen/core` imports no network, RPC or GPU library, no command imports another, and no file
runs past 500 lines without saying why (cycles and layers: test_layers.py). Read from the source
(tests/import_closure.py): no module is imported to check it, and no process is started."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT
from tests.import_closure import import_closure, imports_in, project_modules

# numpy is allowed: the simulator, traffic and tuner compute on arrays.
FORBIDDEN_IN_CORE = ("grpc", "tritonclient", "httpx", "aiohttp", "requests", "urllib3", "pynvml", "jinja2", "prometheus_client")

PROJECT = project_modules("tritongen", "sidecar")
CORE_MODULES = sorted(project_modules("tritongen/core"))


@pytest.mark.parametrize("module", CORE_MODULES)
def test_a_core_module_imports_no_network_rpc_or_gpu_library(module: str) -> None:
    """Each on its own closure: what one module pulls in is not hidden by another's imports. The
    closure follows our modules wherever they are (a core module importing an adapter that imports
    httpx reaches httpx) and counts imports inside functions too."""
    closure = import_closure([module], PROJECT)
    reached = sorted(set(FORBIDDEN_IN_CORE) & closure.outside)
    assert not reached, f"{module} reaches {reached} through {sorted(closure.ours)}"


def test_the_closure_follows_our_modules_into_functions_and_relative_imports(tmp_path: Path) -> None:
    """The check above on a small package: a forbidden library two hops away, behind a relative
    import and inside a function, is found; one under `if TYPE_CHECKING:` never runs and is not."""
    sources = {
        "pkg/__init__.py": "",
        "pkg/core.py": "from . import adapter\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import grpc\n",
        "pkg/adapter.py": "def call():\n    from pkg.deep import fetch\n    return fetch()\n",
        "pkg/deep.py": "import json\n\ndef fetch():\n    import httpx.client\n    return httpx.client\n",
    }
    modules = {}
    for rel, text in sources.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
        name = rel.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        modules[name] = tmp_path / rel
    closure = import_closure(["pkg.core"], modules)
    assert closure.ours == {"pkg", "pkg.core", "pkg.adapter", "pkg.deep"}
    assert closure.outside == {"typing", "json", "httpx"}


def test_model_config_enums_match_the_proto() -> None:
    """core/model_config_enums mirrors the proto's enums so core need not import tritonclient."""
    from tritonclient.grpc import model_config_pb2 as pb

    from tritongen.core import model_config_enums as mirror

    pairs = [
        (mirror.DataType, pb.DataType), (mirror.InstanceKind, pb.ModelInstanceGroup.Kind),
        (mirror.TimeoutAction, pb.ModelQueuePolicy.TimeoutAction), (mirror.ControlKind, pb.ModelSequenceBatching.Control.Kind),
        (mirror.InputFormat, pb.ModelInput.Format), (mirror.BatchInputKind, pb.BatchInput.Kind),
        (mirror.BatchOutputKind, pb.BatchOutput.Kind),
    ]
    for ours, theirs in pairs:
        assert ours.members == dict(theirs.items()), ours.name


# Import cycles and layers: tests/unit/test_layers.py


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of ours NAME imports, itself left out (see tests/import_closure.py for what counts)."""
    return {m for m in imports_in(name, path, known) if m in known and m != name}


def test_commands_import_no_other_command() -> None:
    commands = {n: p for n, p in project_modules("tritongen/cli").items() if n.endswith("_cmd")}
    known = set(project_modules("tritongen"))
    for name, path in commands.items():
        imported = _imports(name, path, known)
        assert not {m for m in imported if m.endswith("_cmd") or m == "tritongen.cli.main"}, name


# ---------------------------------------------------------------------------------------------
# File size

MAX_LINES = 500
REASON_WITHIN = 15  # the reason stands in the module docstring's first lines
REASON_MARKERS = ("one unit", "one file over 500 lines")


def _python_files() -> list[Path]:
    """Every Python file under the folders that hold code (a symlink counts once, at its target;
    hidden folders such as a bench's tool venv are not ours)."""
    roots = ("tritongen", "sidecar", "tests", "bench", "examples", "model_repository", "templates")
    out: list[Path] = []
    for root in roots:
        base = REPO_ROOT / root
        if base.is_dir():
            out += [p for p in base.rglob("*.py") if not p.is_symlink()
                    and not any(part.startswith(".") or part == "__pycache__" for part in p.relative_to(REPO_ROOT).parts)]
    return sorted(out)


def test_no_file_over_500_lines_without_a_reason_in_its_first_lines() -> None:
    """Issue 33: a long file is split by responsibility, or says at its top why it is one unit."""
    unexplained = []
    for path in _python_files():
        lines = path.read_text().splitlines()
        head = " ".join(lines[:REASON_WITHIN]).lower()
        if len(lines) > MAX_LINES and not any(marker in head for marker in REASON_MARKERS):
            unexplained.append(f"{path.relative_to(REPO_ROOT)} ({len(lines)} lines)")
    assert not unexplained, "split these by responsibility, or say why each is one unit in its first lines: " + ", ".join(unexplained)
