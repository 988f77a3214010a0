"""The test suite itself: defects that once hid regressions must not come back.

Over every tests/**/*.py (AST, no imports):

(a) no module imports from a test module (`tests/**/test_*.py`) or from a conftest.py: shared
    things live in the shared modules beside them (tests/helpers.py, and tests/sidecar_rigs.py for
    what only the sidecar's tests read) or in the bench rig bench/rig/fidelity.py;
(b) no `pytest.importorskip` and no `pytest.skip`: a dependency the project declares is imported
    plainly, and a test that cannot run fails rather than skips;
(c) no `except Exception` / `except BaseException` / bare `except:` handler that does not re-raise
    (a `raise` or `pytest.fail(...)` statement directly in its body): a broad fallback turns a
    regression into a pass. Catch the specific exception instead.

Over tests/unit/*.py (issue 33: unit tests need no process, port or subprocess; the rest is
integration's):

(d) no import of `subprocess`, `socket` or `multiprocessing`, nor of a process starter (tritongen's
    `TritonServer`, `SidecarProcess`, or tritongen/shared/processes.py's preexec helpers and
    `free_port`), and no use of `tests.helpers.cli`, the subprocess runner: `run_cli` runs the same
    entry point in the process;
(e) no listener, even in the process on loopback: no `asyncio.start_server` (or the loop's
    `create_server`), no `grpc.server` / `grpc.aio.server`, no aiohttp runner or site (`AppRunner`,
    `TCPSite`, ...) nor `aiohttp.test_utils`, no `http.server` / `socketserver`, no `.bind(`. A test
    that needs a server on a port is a loopback test in tests/integration/.

Each finding names its file and line. The checkers are tested on small snippets too, so a checker
that stopped finding anything would fail here rather than pass the whole suite.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT

TESTS = REPO_ROOT / "tests"
SKIPPERS = {"skip", "importorskip"}
BROAD = {"Exception", "BaseException"}
PROCESS_MODULES = {"subprocess", "socket", "multiprocessing"}
PROCESS_HELPERS = "tritongen.shared.processes"
PROCESS_STARTERS = {"TritonServer", "SidecarProcess"}
PORT_MODULES = {"http.server", "socketserver", "aiohttp.test_utils"}
# what listens on a port or socket, by the name it is called or imported by
LISTENERS = {"start_server", "start_unix_server", "create_server", "create_unix_server", "AppRunner", "ServerRunner",
             "TCPSite", "UnixSite", "SockSite", "NamedPipeSite", "run_app", "bind"}
GRPC_SERVERS = {"grpc.server", "grpc.aio.server"}


def _suite_files() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if "__pycache__" not in p.parts)


def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _where(path: Path, node: ast.AST) -> str:
    return f"{path.relative_to(REPO_ROOT)}:{getattr(node, 'lineno', 0)}"


def _module_file(module: str) -> Path | None:
    """The file under REPO_ROOT a dotted module name stands for, if it is one."""
    base = REPO_ROOT.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _package_of(path: Path) -> list[str]:
    return list(path.relative_to(REPO_ROOT).with_suffix("").parts[:-1])


def _imported_modules(path: Path, tree: ast.Module) -> Iterator[tuple[ast.AST, str]]:
    """Every module an import statement names: `from a.b import c` gives a.b and a.b.c."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = _package_of(path)
                package = package[: len(package) - node.level + 1]
                base = ".".join([*package, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            yield node, base
            for alias in node.names:
                yield node, f"{base}.{alias.name}"


def _is_test_module(file: Path) -> bool:
    return file.name == "conftest.py" or (file.name.startswith("test_") and file.suffix == ".py")


def imports_of_test_modules(path: Path, tree: ast.Module) -> list[str]:
    found = []
    for node, module in _imported_modules(path, tree):
        file = _module_file(module)
        if file is not None and _is_test_module(file):
            found.append(f"{_where(path, node)}: imports {module} ({file.relative_to(REPO_ROOT)}); "
                         "move what is shared into tests/helpers.py or tests/sidecar_rigs.py")
    return found


def skips(path: Path, tree: ast.Module) -> list[str]:
    aliases = {"pytest"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliases |= {a.asname or a.name for a in node.names if a.name == "pytest"}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "pytest":
            for alias in node.names:
                if alias.name in SKIPPERS:
                    found.append(f"{_where(path, node)}: imports pytest.{alias.name}, which hides what did not run")
        elif (isinstance(node, ast.Attribute) and node.attr in SKIPPERS and isinstance(node.value, ast.Name)
              and node.value.id in aliases):
            found.append(f"{_where(path, node)}: pytest.{node.attr} hides what did not run: import the "
                         "dependency plainly, or let the test fail")
    return found


def _is_broad(expr: ast.expr | None) -> bool:
    if expr is None:
        return True
    if isinstance(expr, ast.Tuple):
        return any(_is_broad(e) for e in expr.elts)
    if isinstance(expr, ast.Name):
        return expr.id in BROAD
    if isinstance(expr, ast.Attribute):  # builtins.Exception
        return expr.attr in BROAD
    return False


def _reraises(statement: ast.stmt) -> bool:
    if isinstance(statement, ast.Raise):
        return True
    return (isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call)
            and isinstance(statement.value.func, ast.Attribute) and statement.value.func.attr == "fail"
            and isinstance(statement.value.func.value, ast.Name) and statement.value.func.value.id == "pytest")


def swallowing_handlers(path: Path, tree: ast.Module) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ExceptHandler) and _is_broad(node.type) and not any(map(_reraises, node.body)):
            caught = "bare except" if node.type is None else f"except {ast.unparse(node.type)}"
            found.append(f"{_where(path, node)}: {caught} without a re-raise: catch the specific exception")
    return found


def _is_helpers_cli(node: ast.AST) -> bool:
    """`helpers.cli` or `tests.helpers.cli`, however it is then called."""
    if not (isinstance(node, ast.Attribute) and node.attr == "cli"):
        return False
    owner = node.value
    return (isinstance(owner, ast.Name) and owner.id == "helpers") or (
        isinstance(owner, ast.Attribute) and owner.attr == "helpers")


def _within(module: str, packages: set[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def _is_grpc_server(node: ast.AST) -> bool:
    """`grpc.server`, `grpc.aio.server` or `aio.server`, however it is then called."""
    if not (isinstance(node, ast.Attribute) and node.attr == "server"):
        return False
    owner = node.value
    return (isinstance(owner, ast.Name) and owner.id in {"grpc", "aio"}) or (
        isinstance(owner, ast.Attribute) and owner.attr == "aio")


def processes_in_unit_tests(path: Path, tree: ast.Module) -> list[str]:
    if path.parent != TESTS / "unit":
        return []
    found = []
    for node, module in _imported_modules(path, tree):
        if module.split(".")[0] in PROCESS_MODULES or module.split(".")[-1] in PROCESS_STARTERS or (
                _within(module, {PROCESS_HELPERS})):
            found.append(f"{_where(path, node)}: imports {module}: a unit test starts no process and opens no "
                         "port; move the test to tests/integration/")
        elif _within(module, PORT_MODULES) or module in GRPC_SERVERS or module.split(".")[-1] in LISTENERS:
            found.append(f"{_where(path, node)}: imports {module}, which listens on a port or socket: move the "
                         "test to a loopback test in tests/integration/")
        elif module == "tests.helpers.cli":
            found.append(f"{_where(path, node)}: imports tests.helpers.cli (a subprocess): use run_cli")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in PROCESS_STARTERS:
            found.append(f"{_where(path, node)}: uses {node.attr}, which starts a process: move the test to "
                         "tests/integration/")
        elif (isinstance(node, ast.Attribute) and node.attr in LISTENERS) or _is_grpc_server(node):
            found.append(f"{_where(path, node)}: uses {ast.unparse(node)}, which listens on a port or socket: "
                         "move the test to a loopback test in tests/integration/")
        elif _is_helpers_cli(node):
            found.append(f"{_where(path, node)}: calls helpers.cli (a subprocess): use run_cli")
    return list(dict.fromkeys(found))  # one finding per statement, however many names it imports


CHECKS = [imports_of_test_modules, skips, swallowing_handlers, processes_in_unit_tests]


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
def test_the_suite_is_clean(check) -> None:
    files = _suite_files()
    assert TESTS / "conftest.py" in files and TESTS / "unit" / "test_suite_hygiene.py" in files
    found = [finding for path in files for finding in check(path, _parse(path))]
    assert not found, "\n".join(found)


# ------------------------------------------------------------------------------------------------
# the checkers themselves, on snippets placed where a test module would be

SNIPPET = TESTS / "unit" / "test_snippet.py"

BAD = {
    imports_of_test_modules: [
        "from tests.conftest import cli",
        "from tests.unit.test_capacity import RANKER",
        "from tests.unit import test_capacity",
        "import tests.integration.test_sidecar",
        "from .test_admission import FakeClock",
        "from ..conftest import cli",
    ],
    skips: [
        "import pytest\npytest.skip('busy')",
        "import pytest\nmod = pytest.importorskip('tritonclient.grpc')",
        "import pytest as pt\npt.skip('x')",
        "from pytest import importorskip",
    ],
    swallowing_handlers: [
        "try:\n    f()\nexcept Exception:\n    pass",
        "try:\n    f()\nexcept:\n    x = 1",
        "try:\n    f()\nexcept (ValueError, BaseException) as err:\n    log(err)",
        "def t():\n    try:\n        f()\n    except Exception:\n        if cond:\n            raise\n        return None",
    ],
    processes_in_unit_tests: [
        "import subprocess",
        "def t():\n    import subprocess\n    subprocess.run(['ls'])",
        "from socket import socket",
        "import multiprocessing.pool",
        "from tritongen.server import ServerOptions, TritonServer",
        "import tritongen.server\nwith tritongen.server.TritonServer(opts):\n    pass",
        "from tritongen.sidecar_process import SidecarProcess",
        "from tritongen.shared.processes import free_port",
        "from tritongen.shared import processes",
        "from tests.helpers import EXAMPLES, cli",
        "from tests import helpers\nhelpers.cli('plan')",
        "import tests.helpers\ntests.helpers.cli('plan')",
        "import asyncio\nasync def t():\n    server = await asyncio.start_server(serve, '127.0.0.1', 0)",
        "from asyncio import start_server",
        "import asyncio\nasync def t():\n    await asyncio.get_running_loop().create_server(Proto, port=0)",
        "import grpc\nserver = grpc.aio.server()",
        "import grpc\nserver = grpc.server(pool)",
        "from grpc import aio\nserver = aio.server()",
        "from grpc.aio import server",
        "from aiohttp import web\nrunner = web.AppRunner(app)",
        "from aiohttp import web\nawait web.TCPSite(runner, '127.0.0.1', 0).start()",
        "from aiohttp.web import UnixSite",
        "from aiohttp.test_utils import TestServer",
        "import aiohttp.test_utils",
        "sock.bind(('127.0.0.1', 0))",
        "import http.server",
        "from http.server import HTTPServer",
        "import socketserver",
    ],
}
GOOD = {
    imports_of_test_modules: [
        "from tests.helpers import cli, RANKER",
        "from tests.sidecar_rigs import FakeClock, policy_doc",
        "from tests import sidecar_rigs",
        "from bench.rig.fidelity import traffic",
        "from bench.rig import fidelity",
        "from tritongen.render import write_repository",
    ],
    skips: ["import pytest\npytest.mark.integration", "import pytest\npytest.fail('no')"],
    swallowing_handlers: [
        "try:\n    f()\nexcept ValueError:\n    pass",
        "try:\n    f()\nexcept Exception:\n    cleanup()\n    raise",
        "try:\n    f()\nexcept Exception as err:\n    raise AssertionError('broke') from err",
        "import pytest\ntry:\n    f()\nexcept BaseException as err:\n    pytest.fail(str(err))",
    ],
    processes_in_unit_tests: [
        "from tritongen.server import ServerOptions, start_timeout",
        "from tests.helpers import EXAMPLES, run_cli\nrun_cli('plan').stdout",
        "from tritongen.shared.reach import stream_cause",
        "import asyncio\nasyncio.run(main())",
        "cli = typer.testing.CliRunner()\nresult = cli.invoke(app, [])",
        "from aiohttp import web\nresponse = web.json_response({})",
        "import grpc\nchannel = grpc.aio.insecure_channel(target)\ncode = grpc.StatusCode.OK",
        "import http\nstatus = http.HTTPStatus.OK",
        "from http.client import responses",
        "from sidecar.protocol import parse_generate\nparse_generate(b'{}')",
        "server = {'url': 'x'}['url']\nbinding = policy.binding",
    ],
}


@pytest.mark.parametrize(("check", "source"), [(c, s) for c, ss in BAD.items() for s in ss])
def test_each_checker_finds_its_defect_with_file_and_line(check, source: str) -> None:
    found = check(SNIPPET, ast.parse(source))
    assert found, source
    assert all(f.startswith("tests/unit/test_snippet.py:") for f in found), found


@pytest.mark.parametrize(("check", "source"), [(c, s) for c, ss in GOOD.items() for s in ss])
def test_each_checker_passes_what_is_allowed(check, source: str) -> None:
    assert check(SNIPPET, ast.parse(source)) == []


@pytest.mark.parametrize("source", BAD[processes_in_unit_tests])
def test_integration_tests_may_start_processes(source: str) -> None:
    for place in (TESTS / "integration" / "test_snippet.py", TESTS / "helpers.py", TESTS / "sidecar_rigs.py"):
        assert processes_in_unit_tests(place, ast.parse(source)) == []


# ------------------------------------------------------------------------------------------------
# benchmarks stand on their own (issue 33): they run as modules from the checkout (`python -m
# bench.NAME`) and share through bench/rig/, so a changed test helper or a path hack cannot break one


def test_benches_import_no_tests_and_leave_sys_path_alone() -> None:
    bench = REPO_ROOT / "bench"

    def findings(path: Path, tree: ast.Module) -> list[str]:
        imports = list(_imported_modules(path, tree))
        tests = [node for node, module in imports if module.split(".")[0] == "tests"]
        paths = [node for node, module in imports if module == "sys.path"] + [
            node for node in ast.walk(tree) if isinstance(node, ast.Attribute) and node.attr == "path"
            and isinstance(node.value, ast.Name) and node.value.id == "sys"]
        found = [f"{_where(path, node)}: imports tests: benches take shared things from bench/rig/" for node in tests]
        found += [f"{_where(path, node)}: touches sys.path: run the bench as a module (python -m bench.NAME)"
                  for node in paths]
        return list(dict.fromkeys(found))  # one finding per statement, however many names it imports

    snippet = bench / "bench_snippet.py"
    for source in ("from tests.helpers import cli", "import tests.integration", "from ..tests import helpers",
                   "import sys\nsys.path.insert(0, '.')", "from sys import path"):
        assert findings(snippet, ast.parse(source)), source
    assert findings(snippet, ast.parse("import sys\nfrom bench.rig import ROOT\nsys.exit(0)")) == []

    files = sorted(p for p in bench.rglob("*.py")  # not the tool venvs a bench installs under bench/.NAME
                   if not any(part.startswith(".") or part == "__pycache__" for part in p.relative_to(bench).parts))
    assert bench / "rig" / "fidelity.py" in files
    found = [finding for path in files for finding in findings(path, _parse(path))]
    assert not found, "\n".join(found)


# ------------------------------------------------------------------------------------------------
# the integration modules' order (tests/integration/conftest.py): a renamed or deleted module would
# silently lose its place and a long one could run last, alone, on one worker


def test_the_integration_order_names_modules_that_exist() -> None:
    conftest = TESTS / "integration" / "conftest.py"
    listed = [ast.literal_eval(node.value) for node in _parse(conftest).body
              if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "LONGEST_FIRST" for t in node.targets)]
    assert len(listed) == 1 and listed[0], "tests/integration/conftest.py: LONGEST_FIRST, a tuple of module names"
    missing = [name for name in listed[0] if not (conftest.parent / name).is_file()]
    assert not missing, f"tests/integration/conftest.py: LONGEST_FIRST names {missing}, not in tests/integration/"
    assert len(set(listed[0])) == len(listed[0])
