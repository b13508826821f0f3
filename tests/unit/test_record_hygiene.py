"""The autouse fixture of tests/conftest.py fails a test that leaves comm2perfetto installed."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from support import import_graph

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
# The modules that put the recorder together; every other part sees it as a view.RecorderView.
WIRING = {"session", "bootstrap"}


def _graph(with_typing: bool) -> dict[str, set[str]]:
    """record/'s graph, by names relative to record/ (``recorder``, ``_boot.sitecustomize``)."""
    prefix = PACKAGE + "."
    short = {name: name[len(prefix):] for name in import_graph.package_modules(PACKAGE) if name != PACKAGE}
    full = import_graph.graph(PACKAGE, with_typing=with_typing)
    return {short[name]: {short[t] for t in targets if t in short} for name, targets in full.items() if name in short}


_cycle = import_graph.cycle


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
