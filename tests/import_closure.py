"""What importing a module of ours would run, read from the source with `ast`: nothing is imported.

Static so that one check needs no fresh interpreter per module (what one import pulls in would
otherwise hide what another needs) and no process at all. The price: a third-party library is
followed no further than its top-level name, and an import made by string (importlib) is not seen.
Every import statement counts wherever it sits, inside a function too (a lazy import is still a
dependency: it only moves the failure to the first call). One under `if TYPE_CHECKING:` never runs,
so what a module pulls in leaves it out; it still ties two modules that cannot be read apart, so
the cycle and layer checks (tests/unit/test_layers.py) count it (`type_checking=True`).
"""

from __future__ import annotations

import ast
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from tests.helpers import REPO_ROOT


def project_modules(*packages: str) -> dict[str, Path]:
    """Dotted name -> file for every module under the given package folders (a package is its
    __init__.py), e.g. project_modules("tritongen", "sidecar")."""
    out: dict[str, Path] = {}
    for package in packages:
        for path in sorted((REPO_ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _statements(tree: ast.AST, type_checking: bool) -> Iterable[ast.Import | ast.ImportFrom]:
    """Every import statement in the tree; those under `if TYPE_CHECKING:` only when asked (its else
    always runs)."""
    for child in ast.iter_child_nodes(tree):
        if not type_checking and isinstance(child, ast.If) and _is_type_checking(child):
            for other in child.orelse:
                yield from _statements_at(other, type_checking)
            continue
        yield from _statements_at(child, type_checking)


def _statements_at(node: ast.AST, type_checking: bool) -> Iterable[ast.Import | ast.ImportFrom]:
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        yield node
    yield from _statements(node, type_checking)


def _owner(dotted: str, known: Collection[str]) -> str:
    """The module of ours a dotted name lives in (its longest known prefix), else the top-level
    name of the library it comes from: `tritongen.core.plan.plan_deployment` is tritongen.core.plan,
    `google.protobuf.message` is google."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in known:
            return ".".join(parts[:end])
    return parts[0]


def imports_in(name: str, path: Path, known: Collection[str], type_checking: bool = False) -> set[str]:
    """What module NAME (at PATH) imports, each named by `_owner`: modules of ours as they are in
    `known`, anything else by its top-level name. `from a import b` is module a.b where that is
    one of ours, else a."""
    return imports_in_source(name, path.read_text(), known, path.name == "__init__.py", type_checking)


def imports_in_source(name: str, source: str, known: Collection[str], is_package: bool = False,
                      type_checking: bool = False) -> set[str]:
    """`imports_in` for source text."""
    package = name.split(".") if is_package else name.split(".")[:-1]
    found: set[str] = set()
    for node in _statements(ast.parse(source), type_checking):
        if isinstance(node, ast.Import):
            found.update(_owner(alias.name, known) for alias in node.names)
            continue
        base = node.module or ""
        if node.level:
            parent = package[: len(package) - (node.level - 1)]
            base = ".".join(parent + ([base] if base else []))
        found.update(_owner(f"{base}.{alias.name}", known) for alias in node.names)
    return found


@dataclass(frozen=True)
class Closure:
    ours: frozenset[str]  # the modules of ours that would run, the roots and their packages included
    outside: frozenset[str]  # top-level names of everything else imported along the way (stdlib too)


def import_closure(roots: Iterable[str], modules: Mapping[str, Path]) -> Closure:
    """Follow the roots' imports through `modules` (name -> file, from `project_modules`),
    transitively. Importing a.b.c runs a and a.b first, so a module's packages are reached too."""
    ours: set[str] = set()
    outside: set[str] = set()
    pending = list(roots)
    while pending:
        name = pending.pop()
        if name in ours:
            continue
        ours.add(name)
        parts = name.split(".")
        pending.extend(p for p in (".".join(parts[:end]) for end in range(1, len(parts))) if p in modules)
        for imported in imports_in(name, modules[name], modules):
            if imported in modules:
                pending.append(imported)
            else:
                outside.add(imported)
    return Closure(frozenset(ours), frozenset(outside))
