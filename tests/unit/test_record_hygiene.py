"""The autouse fixture of tests/conftest.py fails a test that leaves comm2perfetto installed."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

LEAKY_TESTS = '''
import torch.distributed as dist
from comm2perfetto.record import patch, state


def test_leaves_patches():
    patch.install(dist.distributed_c10d, dist)


def test_leaves_a_recorder():
    state.recorder = object()


def test_clean():
    patch.install(dist.distributed_c10d, dist)
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
