"""The house rules of the layout (shared/docs/architecture.md), checked rather than hoped for:
`tritongen/core` imports no network, RPC or GPU library, and no module of tritongen or the
sidecar imports itself back through others."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT

# numpy is allowed: the simulator, traffic and tuner compute on arrays.
FORBIDDEN_IN_CORE = ("grpc", "tritonclient", "httpx", "aiohttp", "requests", "urllib3", "pynvml", "jinja2", "prometheus_client")


def _modules(package: str) -> dict[str, Path]:
    out = {}
    for path in sorted((REPO_ROOT / package).rglob("*.py")):
        parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


CORE_MODULES = sorted(_modules("tritongen/core").keys())


@pytest.mark.parametrize("module", CORE_MODULES)
def test_a_core_module_imports_no_network_rpc_or_gpu_library(module: str) -> None:
    """Each in a fresh interpreter: what one module pulls in is not hidden by another's imports."""
    code = (f"import json, sys; import {module}; "
            f"print(json.dumps(sorted(m for m in {FORBIDDEN_IN_CORE!r} if m in sys.modules)))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [], f"{module} imports {done.stdout.strip()}"


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


# ---------------------------------------------------------------------------------------------
# Import cycles

# A module whose owner's work is in flight may keep one edge for now; name it, with the reason.
PENDING_EDGES: dict[tuple[str, str], str] = {}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Every module of ours NAME imports, at module level and inside functions alike (a lazy
    import is still a dependency: it only moves the failure to the first call). Imports under
    `if TYPE_CHECKING:` are left out: they never run."""
    found: set[str] = set()
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for other in child.orelse:
                    visit_node(other)
                continue
            visit_node(child)

    def visit_node(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package[: len(package) - (node.level - 1)]
                base = ".".join(parent + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.add(full if full in known else base)
        visit(node)

    visit(ast.parse(path.read_text()))
    return {m for m in found if m in known and m != name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def test_no_import_cycles_in_tritongen_or_the_sidecar() -> None:
    modules = {**_modules("tritongen"), **_modules("sidecar")}
    known = set(modules)
    graph = {name: _imports(name, path, known) for name, path in modules.items()}
    for (source, target) in PENDING_EDGES:
        graph.get(source, set()).discard(target)
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_commands_import_no_other_command() -> None:
    commands = {n: p for n, p in _modules("tritongen/cli").items() if n.endswith("_cmd")}
    known = set(_modules("tritongen"))
    for name, path in commands.items():
        imported = _imports(name, path, known) - {t for (s, t) in PENDING_EDGES if s == name}
        assert not {m for m in imported if m.endswith("_cmd") or m == "tritongen.cli.main"}, name
