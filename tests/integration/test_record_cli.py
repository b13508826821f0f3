"""``comm2perfetto record`` as a user runs it: refusals before the job starts (exit status 2, one line, the job
never ran), the job's exit status passed through, and SIGTERM forwarded to the job."""

from __future__ import annotations

import json
import signal
import sys

import pytest

from support.cli import Ran, run_cli_process
from support.torch_features import gloo_flight_recorder

pytestmark = pytest.mark.integration

# The job: creates a marker file, so that a test can prove whether it ran.
MARKER_JOB = [sys.executable, "-c", "open('job-ran', 'w').close()"]


@pytest.fixture
def record(tmp_path, clean_env):
    """``record(args, job)``: run ``comm2perfetto record ARGS -- JOB`` in tmp_path and wait for it."""

    def run(args: list[str], job: list[str] = MARKER_JOB) -> Ran:
        return run_cli_process("record", *args, "--", *job, cwd=tmp_path, env=clean_env, timeout=60)

    return run


def _one_error_line(proc: Ran) -> str:
    lines = proc.err.strip().splitlines()
    assert len(lines) == 1, proc.err
    assert lines[0].startswith("comm2perfetto record: error: "), lines[0]
    assert "Traceback" not in proc.err
    return lines[0]


def test_output_folder_that_cannot_be_created(tmp_path, record):
    proc = record(["-o", "/proc/nope"])
    assert proc.code == 2
    line = _one_error_line(proc)
    assert "/proc/nope" in line and "-o" in line
    assert not (tmp_path / "job-ran").exists()


def test_output_folder_that_is_a_file(tmp_path, record):
    (tmp_path / "taken").write_text("not a folder")
    proc = record(["-o", "taken"])
    assert proc.code == 2
    line = _one_error_line(proc)
    assert str(tmp_path / "taken") in line and "not a folder" in line
    assert not (tmp_path / "job-ran").exists()
    assert (tmp_path / "taken").read_text() == "not a folder"


def test_command_not_found(tmp_path, record):
    proc = record(["-o", "out"], job=["no-such-command-c2p", "--flag"])
    assert proc.code == 2
    assert "command not found: no-such-command-c2p" in _one_error_line(proc)
    proc = record(["-o", "out"], job=[])
    assert proc.code == 2
    assert "no command given" in _one_error_line(proc)


def test_existing_recording_needs_overwrite(tmp_path, record):
    out = tmp_path / "out"
    out.mkdir()
    (out / "rank0.events.jsonl").write_text("an earlier recording\n")
    proc = record(["-o", "out"])
    assert proc.code == 2
    line = _one_error_line(proc)
    assert "already holds a recording" in line and "--overwrite" in line
    assert not (tmp_path / "job-ran").exists()
    assert (out / "rank0.events.jsonl").read_text() == "an earlier recording\n"

    proc = record(["-o", "out", "--overwrite"])
    assert proc.code == 0, proc.err
    assert (tmp_path / "job-ran").exists()
    assert not (out / "rank0.events.jsonl").exists()  # the earlier recording is gone, nothing recorded since


@pytest.mark.parametrize("args, message", [
    (["--profile-steps", "5-3"], "--profile-steps"),
    (["--stall-after", "soon"], "--stall-after"),
    (["--stall-after", "0"], "--stall-after"),
    (["--fr-buffer", "0"], "--fr-buffer"),
    (["--on-stall", "true", "--no-live-verdict"], "--on-stall needs the live verdict"),
    (["--on-stall", "true", "--stall-after", "off"], "--on-stall needs the live verdict"),
    (["--on-stall-timeout", "0"], "--on-stall-timeout"),
])
def test_bad_options_are_refused_before_the_job_starts(tmp_path, record, args, message):
    proc = record(["-o", "out", *args])
    assert proc.code == 2
    assert message in _one_error_line(proc)
    assert not (tmp_path / "job-ran").exists()


def test_exit_status_of_the_job_is_passed_through(tmp_path, record):
    proc = record(["-o", "out"], job=[sys.executable, "-c", "import sys; sys.exit(3)"])
    assert proc.code == 3
    (path,) = (tmp_path / "out").glob("job.*.json")
    job = json.loads(path.read_text())
    assert job["exit_status"] == 3
    assert job["signal"] is None
    assert job["command"] == [sys.executable, "-c", "import sys; sys.exit(3)"]
    assert job["ended_ns"] >= job["started_ns"]
    assert "job exited with status 3" in proc.err
    assert "no rank recorded anything" in proc.err  # it never called init_process_group


# One rank, the job itself (no launcher in between), so the CLI's child is the rank.
SIGTERM_JOB = """
import signal, sys, time
from pathlib import Path
import torch
import torch.distributed as dist

HANDLER = {handler}
if HANDLER:
    def on_sigterm(signum, frame):
        Path("got-sigterm").write_text(str(signum))
        sys.exit(0)

    signal.signal(signal.SIGTERM, on_sigterm)
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
dist.all_reduce(torch.ones(2))
Path("ready").touch()
time.sleep(60)
Path("not-interrupted").touch()
"""


def _record_then_sigterm(record_job, handler: bool):
    running = record_job.start(SIGTERM_JOB.format(handler=handler), job=[sys.executable, "job.py"])
    running.wait_for("ready", timeout=60)
    running.proc.send_signal(signal.SIGTERM)  # to `comm2perfetto record`, not to the job
    return running.finish(timeout=60)


def test_sigterm_reaches_the_jobs_own_handler(record_job):
    job = _record_then_sigterm(record_job, handler=True)
    assert job.returncode == 0, job.explain()
    assert (job.cwd / "got-sigterm").read_text() == str(int(signal.SIGTERM))
    assert not (job.cwd / "not-interrupted").exists()
    log = job.log(0)
    assert [(e.cause, e.detail) for e in log.endings] == [("signal", "SIGTERM")]
    assert job.job_file()["signal"] == "SIGTERM"
    assert log.closed_reason == "exit"
    if gloo_flight_recorder():  # torch 2.4-2.7 have no gloo dump to write
        # Flight Recorder dumped when the signal came, before the job's handler ran; again at exit.
        assert [reason for _t, _name, reason in log.fr_dumps] == ["signal", "exit"]
        assert [e["profiling_name"] for e in job.fr_entries(0)] == ["gloo:all_reduce"]


def test_job_killed_by_sigterm_dies_at_once_as_it_would_without_the_recorder(record_job):
    """SIGTERM's default action kills at once, also a rank blocked in a collective's C++, where no Python
    handler could run: the recorder installs none in front of it (a handler would keep such a rank alive until
    a SIGKILL), so the rank dies of SIGTERM with its log unclosed, and everything it wrote before stays."""
    job = _record_then_sigterm(record_job, handler=False)
    assert job.returncode == 128 + signal.SIGTERM, job.explain()
    assert job.job_file()["exit_status"] == 128 + signal.SIGTERM
    assert not (job.cwd / "not-interrupted").exists()
    log = job.log(0)
    assert (log.endings, log.closed_reason) == ([], None)
    assert [c.op for c in log.calls] == ["all_reduce"]
