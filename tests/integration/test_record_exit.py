"""A recorded job that exits right after creating its group exits cleanly: the recorder's threads (the clock
exchange, the watchdog) are stopped and joined when recording stops, not left inside a c10d store call while
the interpreter finalises, which ended a rank with SIGABRT ("terminate called without an active exception")
after a clean exit: CPython 3.11 unwinds such a daemon thread through a ``noexcept`` pybind11 destructor.

The job is shorter than the clock exchange (a few store round trips per rank, rank 0 serving the others one
after another), so the exchange is still running when it exits. Before the recorder stopped it, this 3-rank
job failed in 6 of 6 runs on the 2-core build machine under load (the job's own check below saw the clock
thread on every rank; at least one rank aborted in each run); with 2 ranks, 3 of 6. Chance is left only in
how far the exchange gets: tests/unit/test_record_clock.py checks the stop itself deterministically."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration

JOB = """
import atexit
import threading


def recorder_threads_left():
    # atexit runs the last registered first: this runs after the recorder's own handler, registered when
    # init_process_group created the group, has stopped recording.
    left = sorted(t.name for t in threading.enumerate() if t.name.startswith("comm2perfetto-"))
    if left:
        print(f"recorder threads still running after recording stopped: {left}", flush=True)


atexit.register(recorder_threads_left)

import torch.distributed as dist

dist.init_process_group("gloo")
print(f"rank {dist.get_rank()}: group created", flush=True)
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def short_job(module_jobs):
    return module_jobs.run(JOB, nproc=3)


def test_exits_cleanly(short_job):
    assert short_job.returncode == 0, short_job.explain()
    assert "terminate called" not in short_job.stderr
    assert sorted(line for line in short_job.stdout.splitlines() if line.startswith("rank")) == \
        [f"rank {rank}: group created" for rank in range(3)]


def test_no_recorder_thread_outlives_recording(short_job):
    assert "still running" not in short_job.stdout, short_job.stdout


@pytest.mark.parametrize("rank", [0, 1, 2])
def test_log_is_closed_at_exit(short_job, rank):
    log = short_job.log(rank)
    assert log.problems == []
    assert log.closed_reason == "exit"
