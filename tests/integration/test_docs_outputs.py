"""The outputs README.md and examples/README.md show are what the commands print (see tests/support/doc_outputs.py).

Each document's commands run in order, in one folder of their own (the recordings one block makes are read
by the next), with ``examples/`` at hand as in a checkout; ``comm2perfetto`` and ``torchrun`` are this
Python's. Real jobs: the demo, the hang example (8 s away) and the shape mismatch.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from support.doc_outputs import DOCS, doc_blocks, mismatch
from support.jobs import job_env, kill_tree
from support.torch_features import gloo_flight_recorder

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
COMMAND_TIMEOUT_S = 240.0


def _shell_prelude() -> str:
    py = sys.executable
    return (f'comm2perfetto() {{ "{py}" -m comm2perfetto "$@"; }}\n'
            f'torchrun() {{ "{py}" -m torch.distributed.run "$@"; }}\n')


def run_command(command: str, cwd: Path) -> tuple[int, str]:
    proc = subprocess.Popen(["bash", "-c", _shell_prelude() + command], cwd=cwd, env=job_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=COMMAND_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        kill_tree(proc)
        pytest.fail(f"{command!r} did not finish within {COMMAND_TIMEOUT_S:.0f} s")
    return proc.returncode, out


def test_every_shown_output_is_marked():
    unmarked = [f"{b.doc}:{b.line}" for b in doc_blocks(ROOT) if not b.kind]
    assert not unmarked, ("output blocks with neither <!-- output of: CMD -->, <!-- checked --> nor "
                          f"<!-- not checked: why -->: {unmarked}")
    unchecked = [b for b in doc_blocks(ROOT) if b.kind == "not checked" and not b.note]
    assert not unchecked, "a <!-- not checked: --> block must say why"


@pytest.mark.skipif(not gloo_flight_recorder(), reason="the docs show what torch >= 2.8 prints: its Flight Recorder "
                                                     "records gloo (2.4-2.7: the dispatcher fallback's closing lines)")
@pytest.mark.parametrize("doc", DOCS)
def test_shown_outputs_match_what_runs(doc, tmp_path):
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    blocks = [b for b in doc_blocks(ROOT) if b.doc == doc and b.steps]
    assert blocks, f"{doc} shows no checked output"
    for block in blocks:
        for step in block.steps:
            status, out = run_command(step.command, tmp_path)
            if step.expected is None:
                continue
            problem = mismatch(step.expected, out, str(tmp_path))
            assert problem is None, (f"{doc}:{block.line}: `{step.command}` (exit status {status}) printed "
                                     f"something else than shown.\n{problem}\n\nfull output:\n{out}")
