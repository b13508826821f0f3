"""The package's layers, read from its sources: no import circle anywhere, and nothing imports upwards.

    record/  (in the job; the only part that imports torch)      cli/  parses, prints, picks exit codes
    sources/ -> model, job, match (+ tracks, group_columns), align -> diagnose/ -> report/ -> trace/, render/,
    compare/ -> cli/
    launch (starts the job under record)

``layout``, ``errors``, ``_version``, ``intervals``, ``group_names``, ``processes``, ``exchange``, ``strenum``,
``load_options``, ``report_doc``, ``words`` and ``lateness`` are leaves every layer may use. Imports inside
functions count: a circle there is one all the same, only deferred."""

from __future__ import annotations

import ast

import pytest

from support import import_graph

P = import_graph.PACKAGE
LEAVES = {f"{P}.layout", f"{P}.errors", f"{P}._version", f"{P}.intervals", f"{P}.group_names", f"{P}.processes",
          f"{P}.exchange", f"{P}.strenum", f"{P}.load_options", f"{P}.report_doc", f"{P}.words", f"{P}.lateness"}
# What each part may import besides itself and the leaves.
ALLOWED = {
    "record": set(),
    "sources": {"model"},
    "model": set(),
    "job": {"model", "sources"},  # the readers for the type checker only (checked below)
    "align": {"model"},
    "group_columns": {"model", "sources"},  # the views over each rank's columns that match builds
    "tracks": {"model", "group_columns", "sources"},  # each rank's records of a group, joined
    "match": {"model", "job", "group_columns", "tracks", "align", "sources"},
    "diagnose": {"model", "job", "match", "group_columns", "align", "sources"},
    # report's notes say how a restarted job's other attempts ended: diagnose's verdict on each
    "report": {"model", "job", "match", "group_columns", "align", "sources", "diagnose"},
    "trace": {"model", "job", "match", "group_columns", "align", "sources", "diagnose", "report"},
    "render": {"model", "job", "diagnose", "report", "compare", "sources"},  # sources: the live window top shows
    "compare": {"model", "job", "match", "report", "sources"},  # a side is a saved report or what report builds
    "launch": {"record"},  # record's own process starting the job: the recorder's configuration and boot code
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


def test_the_model_and_the_job_import_the_readers_only_for_the_type_checker(graphs):
    assert not {t for t in graphs[False][f"{P}.model"] if t not in LEAVES}
    assert not {t for t in graphs[False][f"{P}.job"] if t not in LEAVES | {f"{P}.model"}}


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
