"""The layers of tritongen and the sidecar, and the arrows between them (issue 33), read from the
source with `ast`: no module imports itself back through others, and each layer imports only the
layers under it.

    tritongen.cli                          the thin CLI: anything (it launches the sidecar)
    sidecar.*  |  the rest of tritongen.*  the runtime service and the adapters: never each other
    tritongen.shared                       what both need: process helpers, reach messages, NVML, fronts
    tritongen.core, tritongen.errors       pure computation and the error types

Static on purpose: importing a module runs it (and pulls in aiohttp, tritonclient, ...), and what
one import pulls in hides what another needs. Every import counts wherever it sits: one inside a
function is still a dependency (it only fails later), and one under `if TYPE_CHECKING:` still ties
two modules that cannot be read apart.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tests.import_closure import imports_in, imports_in_source, project_modules

PACKAGES = ("tritongen", "sidecar")


@dataclass(frozen=True)
class Layer:
    name: str
    prefixes: tuple[str, ...]  # the modules it holds: these and everything under them
    may_import: tuple[str, ...]  # the other layers it may import (itself always)
    why: str


# Bottom up. A module belongs to the layer with its longest matching prefix.
LAYERS: tuple[Layer, ...] = (
    Layer("core", ("tritongen.core", "tritongen.errors"), (),
          "the pure core imports nothing of ours above it"),
    Layer("shared", ("tritongen.shared",), ("core",),
          "the shared layer stands on the core alone: both the sidecar and the adapters import it"),
    Layer("sidecar", ("sidecar",), ("core", "shared"),
          "the sidecar may import only sidecar.*, tritongen.core, tritongen.errors and tritongen.shared"),
    Layer("adapters", ("tritongen",), ("core", "shared"),
          "only tritongen.cli may import the sidecar (or the CLI); the rest of tritongen imports neither"),
    Layer("cli", ("tritongen.cli",), ("core", "shared", "sidecar", "adapters"),
          "the CLI may import anything"),
)
BY_NAME = {layer.name: layer for layer in LAYERS}


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def layer_of(module: str) -> Layer:
    matches = [(len(p), layer) for layer in LAYERS for p in layer.prefixes if _under(module, p)]
    return max(matches, key=lambda m: m[0])[1]


def import_graph(modules: Mapping[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules of ours it imports (itself left out), `if TYPE_CHECKING:` included."""
    return {name: {m for m in imports_in(name, path, modules, type_checking=True) if m in modules and m != name}
            for name, path in modules.items()}


def _path(graph: Mapping[str, set[str]], start: str, goal: str) -> list[str] | None:
    """The shortest chain of imports from start to goal (breadth first), or None."""
    came_from: dict[str, str | None] = {start: None}
    todo = deque([start])
    while todo:
        node = todo.popleft()
        if node == goal:
            chain: list[str] = []
            step: str | None = node
            while step is not None:
                chain.append(step)
                step = came_from[step]
            return chain[::-1]
        for nxt in sorted(graph.get(node, ())):
            if nxt not in came_from:
                came_from[nxt] = node
                todo.append(nxt)
    return None


def cycle_edges(graph: Mapping[str, set[str]]) -> list[str]:
    """Each import that lies on a cycle, with the way back: `a imports b, and b leads back: b -> ... -> a`."""
    out = []
    for source in sorted(graph):
        for target in sorted(graph[source]):
            back = _path(graph, target, source)
            if back is not None:
                out.append(f"{source} imports {target}, and {target} leads back: {' -> '.join(back)}")
    return out


def layer_breaches(graph: Mapping[str, set[str]]) -> list[str]:
    out = []
    for source in sorted(graph):
        mine = layer_of(source)
        for target in sorted(graph[source]):
            theirs = layer_of(target)
            if theirs is not mine and theirs.name not in mine.may_import:
                out.append(f"{source} imports {target}: {mine.name} -> {theirs.name} breaks the rule: {mine.why}")
    return out


GRAPH = import_graph(project_modules(*PACKAGES))


def test_no_import_cycle_among_project_modules() -> None:
    edges = cycle_edges(GRAPH)
    assert not edges, "import cycles (break them by responsibility):\n  " + "\n  ".join(edges)


def test_each_layer_imports_only_the_layers_under_it() -> None:
    breaches = layer_breaches(GRAPH)
    assert not breaches, "layer rules broken:\n  " + "\n  ".join(breaches)


def test_the_layers_form_a_dag() -> None:
    """Listed bottom up, each layer may import only layers listed before it."""
    seen: set[str] = set()
    for layer in LAYERS:
        assert set(layer.may_import) <= seen, f"{layer.name} may import a layer above it: {layer.may_import}"
        seen.add(layer.name)


def test_every_module_sits_in_its_layer() -> None:
    assert layer_of("tritongen.cli.main").name == "cli"
    assert layer_of("tritongen.client").name == "adapters"  # a prefix is a whole name, not its letters
    assert layer_of("tritongen.errors").name == "core"
    assert layer_of("sidecar").name == "sidecar"
    assert any(layer_of(m).name == "shared" for m in GRAPH), "tritongen/shared/ holds no module"


def test_imports_are_found_in_functions_under_type_checking_and_relative() -> None:
    source = (
        "from typing import TYPE_CHECKING\nimport json\nfrom . import b\nfrom .c import thing\n"
        "if TYPE_CHECKING:\n    from pkg.d import T\n"
        "def f():\n    import pkg.e.deep\n    from pkg import a\n"
    )
    known = {"pkg", "pkg.a", "pkg.b", "pkg.c", "pkg.d", "pkg.e"}
    found = imports_in_source("pkg.a", source, known, type_checking=True) & known
    assert found == {"pkg.a", "pkg.b", "pkg.c", "pkg.d", "pkg.e"}  # `from pkg import a` in f names itself


def test_a_cycle_is_reported_edge_by_edge_and_a_layer_breach_by_rule() -> None:
    edges = cycle_edges({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}})
    assert edges == ["a imports b, and b leads back: b -> c -> a", "b imports c, and c leads back: c -> a -> b",
                     "c imports a, and a leads back: a -> b -> c"]
    assert cycle_edges({"a": {"b"}, "b": set()}) == []
    (breach,) = layer_breaches({"tritongen.render": {"sidecar.policy", "tritongen.core.spec"}})
    assert breach.startswith("tritongen.render imports sidecar.policy: adapters -> sidecar breaks the rule: only tritongen.cli")
