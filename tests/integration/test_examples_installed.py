"""Every shipped example runs as the README says, as a module of the installed package
(``python -m comm2perfetto.examples.ddp_train --nproc 2``), from a folder that is no checkout: the package is
built as a wheel and installed into a folder of its own, which alone provides ``comm2perfetto`` (each run is
short: 2 ranks, a step or two)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.wheel import build_wheel, install_wheel

pytestmark = pytest.mark.integration  # real 2-rank gloo jobs

EXAMPLES = {  # module -> its shortest run, and what rank 0 prints once it ran
    "ddp_train": (["--epochs", "1", "--steps", "2"], "epoch 0 train_loss "),
    "tp_dtensor": (["--steps", "1"], "step 0 loss "),
    "hang_missing_rank": (["--hang-seconds", "0.2"], "3 all-reduces done; rank 1 now leaves for 0.2s"),
    "shape_mismatch": ([], "3 all-reduces agreed; rank 1 now sends shape (512,)"),
}
SHIPPED = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "src" / "comm2perfetto" / "examples")
                 .glob("*.py") if not p.stem.startswith("_"))


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("installed")
    return install_wheel(build_wheel(folder), folder / "site")


def _run(installed: Path, cwd: Path, *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(installed), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=240,
                          check=False)


def test_every_shipped_example_is_tested():
    assert sorted(EXAMPLES) == SHIPPED


def test_the_examples_come_from_the_installed_package(installed, tmp_path):
    proc = _run(installed, tmp_path, "-c", "import comm2perfetto.examples._launch as m; print(m.__file__)")
    assert proc.returncode == 0, proc.stderr
    assert Path(proc.stdout.strip()).is_relative_to(installed)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_each_example_runs_as_a_module_of_the_installed_package(installed, tmp_path, name):
    argv, printed = EXAMPLES[name]
    proc = _run(installed, tmp_path, "-m", f"comm2perfetto.examples.{name}", "--nproc", "2", *argv)
    assert "ModuleNotFoundError" not in proc.stderr, proc.stderr
    assert printed in proc.stdout, proc.stdout + proc.stderr
    if name == "shape_mismatch":  # the job fails on purpose: gloo aborts a rank from C++
        assert proc.returncode != 0 and "SIGABRT" in proc.stderr, proc.stderr
    else:
        assert proc.returncode == 0, proc.stderr
