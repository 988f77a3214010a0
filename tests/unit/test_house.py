"""The house rules of the layout (shared/docs/architecture.md), checked rather than hoped for:
`tritongen/core` imports no network, RPC or GPU library, and no module of tritongen or the
sidecar imports itself back through others. Read from the source (tests/import_closure.py): no
module is imported to check it, and no process is started."""

from __future__ import annotations

from pathlib import Path

import pytest

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
