"""Every shipped example runs as the README says, as a module of the installed package
(``python -m comm2perfetto.examples.ddp_train --nproc 2``), from a folder that is no checkout: the wheel is
installed into a folder of its own, which alone provides ``comm2perfetto``.

Each example is run as ``-m`` runs it (``runpy.run_module`` as ``__main__``, with ``--help``: its imports and its
command line, in one process for all four), and one of them spawns its 2 ranks for real under ``-m`` (the
spawned ranks import the example by its module name); the others' jobs run in their own tests, as scripts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.wheel import install_wheel

pytestmark = pytest.mark.integration  # a real 2-rank gloo job

EXAMPLES = Path(__file__).resolve().parents[2] / "src" / "comm2perfetto" / "examples"
SHIPPED = sorted(p.stem for p in EXAMPLES.glob("*.py") if not p.stem.startswith("_"))
# Each example as `python -m` runs it, with --help; prints where it came from and its usage line.
AS_MODULES = """
import runpy, sys
for name in sys.argv[1:]:
    module = f"comm2perfetto.examples.{name}"
    sys.argv = [module, "--help"]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as done:
        print(name, done.code, sys.modules["comm2perfetto.examples._launch"].__file__)
"""


@pytest.fixture(scope="module")
def installed(built_wheel, tmp_path_factory) -> Path:
    return install_wheel(built_wheel, tmp_path_factory.mktemp("installed"))


def _run(installed: Path, cwd: Path, *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(installed), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=240,
                          check=False)


def test_every_example_runs_as_a_module_of_the_installed_package(installed, tmp_path):
    proc = _run(installed, tmp_path, "-c", AS_MODULES, *SHIPPED)
    assert proc.returncode == 0, proc.stderr
    assert "ModuleNotFoundError" not in proc.stderr, proc.stderr
    ran = [line.split(" ", 2) for line in proc.stdout.splitlines() if line.split(" ", 1)[0] in SHIPPED]
    assert [name for name, _, _ in ran] == SHIPPED, proc.stdout
    for name, code, launcher in ran:
        assert code == "0", (name, proc.stdout)
        assert Path(launcher).is_relative_to(installed), launcher  # not the checkout's
    assert proc.stdout.count("usage: ") == len(SHIPPED), proc.stdout


def test_an_example_spawns_its_ranks_as_a_module(installed, tmp_path):
    proc = _run(installed, tmp_path, "-m", "comm2perfetto.examples.hang_missing_rank", "--nproc", "2",
                "--hang-seconds", "0")
    assert proc.returncode == 0, proc.stderr
    assert "3 all-reduces done; rank 1 now leaves for 0.0s" in proc.stdout, proc.stdout
    returned = sorted(line.split(":")[0] for line in proc.stdout.splitlines() if "after the hang returned" in line)
    assert returned == ["rank 0", "rank 1"], proc.stdout
