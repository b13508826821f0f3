"""Running the command line in tests: one way in the test process, one in a process of its own, one result.

- ``run_cli("diagnose", folder, "--format", "json")`` calls ``comm2perfetto.cli.main`` here, with stdout and
  stderr captured: fast, and what a test of a command's output uses;
- ``run_cli_process(...)`` runs ``python -m comm2perfetto`` as a user does: for what only a new interpreter
  shows (torch not imported, the environment a recorded job's readers get) and for the readers of a real job;

both return ``Ran(code, out, err)``, the exit status and what the command printed::

    code, out, _ = run_cli("diagnose", tmp_path)
    assert code == 1 and out.startswith("STUCK")
    assert run_cli_process("report", rec, "--format", "json").json()["world_size"] == 2

``COMMAND`` is the command line itself, for a test that starts and watches the process (a job under
``record``, a pipe its reader closes early, a memory limit).
"""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from collections.abc import Mapping
from os import PathLike
from pathlib import Path
from typing import Any, NamedTuple

COMMAND = (sys.executable, "-m", "comm2perfetto")  # what a user's `comm2perfetto` runs
PROCESS_TIMEOUT_S = 300.0


class Ran(NamedTuple):
    code: int
    out: str
    err: str

    def json(self) -> Any:
        """stdout as JSON (``--format json``), or a failure that shows what the command said instead."""
        assert self.out, f"exit status {self.code}, nothing on stdout; stderr:\n{self.err}"
        return json.loads(self.out)


def run_cli(*argv: str | PathLike[str]) -> Ran:
    """``comm2perfetto ARGV`` in this process (argparse's own exit, for ``--help`` or a usage error, included)."""
    from comm2perfetto.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 2
    return Ran(code, out.getvalue(), err.getvalue())


def run_cli_process(*argv: str | PathLike[str], cwd: Path | None = None, env: Mapping[str, str] | None = None,
                    timeout: float = PROCESS_TIMEOUT_S) -> Ran:
    """``comm2perfetto ARGV`` in a new interpreter; ``env`` replaces the environment when given."""
    done = subprocess.run([*COMMAND, *map(str, argv)], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)
    return Ran(done.returncode, done.stdout, done.stderr)
