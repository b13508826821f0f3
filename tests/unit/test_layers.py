"""The package's layers, read from its sources: no import circle anywhere, and nothing imports upwards.

    record/  (in the job; the only part that imports torch)      cli/  parses, prints, picks exit codes
    sources/ -> model, match (+ group_columns), align -> diagnose/, report/ -> trace/, render/, compare/ -> cli/

``layout``, ``errors``, ``_version``, ``intervals``, ``group_names``, ``processes``, ``exchange``, ``lateness`` and
``render.words`` are leaves every layer may use. Imports inside
functions count: a circle there is one all the same, only deferred."""

from __future__ import annotations

import ast

import pytest

from support import import_graph

P = import_graph.PACKAGE
LEAVES = {f"{P}.layout", f"{P}.errors", f"{P}._version", f"{P}.intervals", f"{P}.group_names", f"{P}.processes",
          f"{P}.exchange", f"{P}.lateness", f"{P}.render.words"}
# What each part may import besides itself and the leaves.
ALLOWED = {
    "record": set(),
    "sources": {"model"},
    "model": {"sources"},  # for the type checker only (checked below)
    "align": {"model"},
    "group_columns": {"model", "sources"},  # the views over each rank's columns that match builds
    "match": {"model", "group_columns", "align", "sources"},
    "diagnose": {"model", "match", "group_columns", "align", "sources"},
    "report": {"model", "match", "group_columns", "align", "sources"},
    "trace": {"model", "match", "group_columns", "align", "sources", "diagnose", "report"},
    "render": {"model", "diagnose", "report", "compare", "sources"},  # sources: the live window it shows
    "compare": {"model", "report", "sources"},
}


@pytest.fixture(scope="module")
def graphs() -> dict[bool, dict[str, set[str]]]:
    """The import graph, read from the sources once for every test here (``[True]``: with the type checker's
    imports)."""
    return import_graph.graphs()


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_the_reader_sees_relative_and_function_level_imports(graphs):
    edges = graphs[True]
    assert f"{P}.trace.sink" in edges[f"{P}.trace.perfetto"]  # from .sink import ...
    assert f"{P}.record.recorder" in edges[f"{P}.record.session"]  # inside a function
    assert f"{P}.layout" in edges[f"{P}.record.flight"]  # from comm2perfetto import layout


@pytest.mark.parametrize("with_typing", [False, True], ids=["runtime", "with type-checking imports"])
def test_no_import_circle_in_the_package(graphs, with_typing):
    assert import_graph.cycle(graphs[with_typing]) is None


@pytest.mark.parametrize("part", sorted(ALLOWED))
def test_nothing_imports_upwards(graphs, part):
    edges = graphs[True]
    wrong = {(module, target) for module, targets in edges.items() if _part(module) == part
             for target in targets - LEAVES if _part(target) not in ALLOWED[part] | {part}}
    assert not wrong, sorted(wrong)


def test_the_model_imports_the_readers_only_for_the_type_checker(graphs):
    assert not {t for t in graphs[False][f"{P}.model"] if t not in LEAVES}


def test_only_the_recorder_imports_torch():
    """diagnose, merge, report and compare run on a laptop without torch: only record/ (and the example jobs,
    which run under torchrun) import it; the CLI asks for it through importlib when `record` or `demo` runs."""
    importers = set()
    for name, path in import_graph.package_modules().items():
        if _part(name) in ("record", "examples"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                roots = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                roots = [(node.module or "").split(".")[0]]
            else:
                continue
            if "torch" in roots:
                importers.add(name)
    assert not importers, sorted(importers)
