"""The outputs the docs show (README.md, examples/README.md, docs/*.md) are what the commands print (see
tests/support/doc_outputs.py; tests/unit/test_docs.py checks that every output block is marked).

Each document's commands run in order, in one folder of their own (the recordings one block makes are read
by the next), with ``examples/`` at hand as in a checkout; ``comm2perfetto`` and ``torchrun`` are this
Python's. Real jobs: the demo, the hang example (8 and 10 s away), the shape mismatch and the DDP example.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from support.cli import COMMAND
from support.doc_outputs import doc_blocks, mismatch
from support.jobs import job_env, kill_tree
from support.torch_features import gloo_flight_recorder

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
COMMAND_TIMEOUT_S = 240.0
# the documents that show what a command prints (the others show outputs marked "not checked", or none)
RUN = sorted({b.doc for b in doc_blocks(ROOT) for step in b.steps if step.expected is not None})


def _shell_prelude() -> str:
    return (f'comm2perfetto() {{ {shlex.join(COMMAND)} "$@"; }}\n'
            f'torchrun() {{ {shlex.join([sys.executable, "-m", "torch.distributed.run"])} "$@"; }}\n')


def run_command(command: str, cwd: Path) -> tuple[int, str]:
    proc = subprocess.Popen(["bash", "-c", _shell_prelude() + command], cwd=cwd, env=job_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=COMMAND_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        kill_tree(proc)
        pytest.fail(f"{command!r} did not finish within {COMMAND_TIMEOUT_S:.0f} s")
    return proc.returncode, out


# What each command printed, for a document whose only command another document ran before in this session
# (the stall example the README and docs/record.md both show): command -> (exit status, output, its folder).
_PRINTED: dict[str, tuple[int, str, Path]] = {}


@pytest.mark.skipif(not gloo_flight_recorder(), reason="the docs show what torch >= 2.8 prints: its Flight Recorder "
                                                     "records gloo (2.4-2.7: the dispatcher fallback's closing lines)")
@pytest.mark.parametrize("doc", RUN)
def test_shown_outputs_match_what_runs(doc, tmp_path):
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    blocks = [b for b in doc_blocks(ROOT) if b.doc == doc and b.steps]
    only = len([step for b in blocks for step in b.steps]) == 1
    for block in blocks:
        for step in block.steps:
            if only and step.command in _PRINTED:  # a folder of its own: it prints what it printed there
                status, out, ran_in = _PRINTED[step.command]
            else:
                (status, out), ran_in = run_command(step.command, tmp_path), tmp_path
                _PRINTED[step.command] = (status, out, ran_in)
            if step.expected is None:
                continue
            problem = mismatch(step.expected, out, str(ran_in))
            assert problem is None, (f"{doc}:{block.line}: `{step.command}` (exit status {status}) printed "
                                     f"something else than shown.\n{problem}\n\nfull output:\n{out}")
