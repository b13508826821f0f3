"""The examples without numpy, which neither torch nor the `record` extra installs: tp_dtensor.py (whose
CommDebugMode imports it) says so in one line; the DDP example, which `comm2perfetto demo` runs, needs none.
numpy is hidden by running Python without its site (``-S``) on a copy of site-packages that leaves it out."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # the examples run as their users run them: real 2-rank jobs

EXAMPLES = Path(__file__).resolve().parents[2] / "src" / "comm2perfetto" / "examples"


@pytest.fixture(scope="module")
def no_numpy(tmp_path_factory) -> Path:
    """A folder of links to every entry of torch's site-packages but numpy's."""
    import torch

    site = Path(torch.__file__).resolve().parents[1]
    folder = tmp_path_factory.mktemp("site-without-numpy")
    for entry in site.iterdir():
        if not entry.name.startswith("numpy"):
            (folder / entry.name).symlink_to(entry)
    return folder


def _run(no_numpy: Path, *argv: str) -> subprocess.CompletedProcess:
    # -S: no site, so no .pth of an editable install either: the checkout's src/ (the examples import the package)
    path = os.pathsep.join((str(no_numpy), str(EXAMPLES.parents[1])))
    return subprocess.run([sys.executable, "-S", *argv], env={"PYTHONPATH": path, "OMP_NUM_THREADS": "1",
                                                              "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=240)


def test_the_environment_has_no_numpy(no_numpy):
    proc = _run(no_numpy, "-c", "import importlib.util, torch; print(importlib.util.find_spec('numpy'))")
    assert proc.returncode == 0 and proc.stdout.strip() == "None", proc.stderr


def test_tp_example_says_it_needs_numpy_in_one_line(no_numpy):
    proc = _run(no_numpy, str(EXAMPLES / "tp_dtensor.py"), "--nproc", "2", "--steps", "1")
    # torch itself warns once, at import, that it runs without numpy (two lines): the example's own is the rest
    lines = [ln for ln in proc.stderr.splitlines()
             if "Failed to initialize NumPy" not in ln and "_conversion_method_template" not in ln]
    assert proc.returncode == 1
    assert lines == ["tp_dtensor.py: torch's CommDebugMode needs numpy, which is not installed: pip install numpy"]


def test_the_ddp_example_needs_no_numpy(no_numpy):
    proc = _run(no_numpy, str(EXAMPLES / "ddp_train.py"), "--nproc", "2", "--epochs", "1", "--steps", "3")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("epoch 0 train_loss ")
