"""The autouse fixture of tests/conftest.py fails a test that leaves comm2perfetto installed."""

from __future__ import annotations

import ast
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

LEAKY_TESTS = '''
import torch.distributed as dist
from comm2perfetto.record import patch, state
from comm2perfetto.record.bootstrap import install_patches


def test_leaves_patches():
    install_patches(dist.distributed_c10d, dist)


def test_leaves_a_recorder():
    state.recorder = object()


def test_clean():
    install_patches(dist.distributed_c10d, dist)
    patch.uninstall()


def test_after_the_leaks():
    assert not patch.installed() and state.recorder is None
'''


def test_leaks_fail_the_test_that_caused_them(tmp_path, clean_env):
    tests = Path(__file__).parent.parent
    shutil.copy(tests / "conftest.py", tmp_path / "conftest.py")
    shutil.copytree(tests / "support", tmp_path / "support")  # the conftest's helpers, found beside it
    (tmp_path / "test_leaky.py").write_text(LEAKY_TESTS)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA", "test_leaky.py"],
                          cwd=tmp_path, env=clean_env, capture_output=True, text=True, timeout=120, check=False)
    report = proc.stdout
    assert proc.returncode == 1, report
    assert "ERROR test_leaky.py::test_leaves_patches" in report
    assert "torch.distributed patches" in report
    assert "ERROR test_leaky.py::test_leaves_a_recorder" in report
    assert "an active recorder (state.recorder)" in report
    # The fixture cleaned up after each leak: the next tests start clean and pass.
    assert "PASSED test_leaky.py::test_clean" in report
    assert "PASSED test_leaky.py::test_after_the_leaks" in report
    summary = report.strip().splitlines()[-1]  # e.g. "4 passed, 1 warning, 2 errors in 1.25s"
    assert "4 passed" in summary and "2 errors" in summary  # the leaky tests pass, then error in teardown


# --- the import graph of record/ ----------------------------------------------------------------------------

PACKAGE = "comm2perfetto.record"
RECORD = Path(importlib.util.find_spec(PACKAGE).origin).parent
# The modules that put the recorder together; every other part sees it as a view.RecorderView.
WIRING = {"session", "bootstrap"}


def _record_modules() -> dict[str, Path]:
    """record/'s modules by name relative to the package: ``recorder``, ``_boot.sitecustomize``."""
    modules = {}
    for path in sorted(RECORD.rglob("*.py")):
        parts = path.relative_to(RECORD).with_suffix("").parts
        if parts[-1] != "__init__":
            modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(path: Path, modules: set[str]) -> list[tuple[str, bool]]:
    """(record module, imported only for the type checker) for every import in ``path``, at module level or
    inside a function."""
    found: list[tuple[str, bool]] = []

    def targets(node: ast.Import | ast.ImportFrom) -> list[str]:
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif node.module == PACKAGE:  # from comm2perfetto.record import patch, session
            names = [f"{PACKAGE}.{alias.name}" for alias in node.names]
        else:
            names = [node.module or ""]
        prefix = PACKAGE + "."
        return [name[len(prefix):] for name in names if name.startswith(prefix) and name[len(prefix):] in modules]

    def visit(node: ast.AST, typing_only: bool) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.extend((target, typing_only) for target in targets(node))
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, True)
            for child in node.orelse:
                visit(child, typing_only)
            return
        for child in ast.iter_child_nodes(node):
            visit(child, typing_only)

    visit(ast.parse(path.read_text()), False)
    return found


def _graph(with_typing: bool) -> dict[str, set[str]]:
    modules = _record_modules()
    return {name: {target for target, typing_only in _imports(path, set(modules)) if with_typing or not typing_only}
            for name, path in modules.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph``, as the modules along it, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def walk(name: str) -> list[str] | None:
        state[name] = 1
        path.append(name)
        for target in sorted(graph[name]):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state:
                found = walk(target)
                if found:
                    return found
        path.pop()
        state[name] = 2
        return None

    for name in sorted(graph):
        if name not in state:
            found = walk(name)
            if found:
                return found
    return None


def test_the_graph_reader_sees_every_kind_of_import():
    graph = _graph(with_typing=False)
    assert "recorder" in graph["session"]  # inside a function: from comm2perfetto.record.recorder import ...
    assert "state" in graph["nvtx"]  # at module level: from comm2perfetto.record import state
    assert "bootstrap" in graph["_boot.sitecustomize"]
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_record_has_no_import_cycle():
    """Counting imports inside functions too: a cycle there is one all the same, only deferred."""
    assert _cycle(_graph(with_typing=False)) is None
    assert _cycle(_graph(with_typing=True)) is None  # nor one that only the type checker follows


def test_only_the_wiring_imports_the_recorder():
    """The parts (watchdog, live, flight, profiler, context, nvtx ...) see the recorder through view.py's
    protocols, not as the Recorder class; the patch layer is handed its wrapper and hooks."""
    importers = {name for name, targets in _graph(with_typing=True).items() if "recorder" in targets}
    assert importers <= WIRING, importers - WIRING
    assert not {"recorder", "session"} & _graph(with_typing=True)["patch"]
