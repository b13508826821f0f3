"""An internal error in the recorder's hot path (injected with COMM2PERFETTO_TEST_FAULT) disables recording
on that rank with one line on stderr and a ``w`` record; training goes on with correct results, and the log
and Flight Recorder dumps are still closed and written at exit."""

from __future__ import annotations

import pytest

from support.torch_features import gloo_flight_recorder, needs_gloo_flight_recorder

pytestmark = pytest.mark.integration

JOB = """
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
dist.broadcast(torch.zeros(1), src=0)  # @before
for i in range(3):
    t = torch.full((2,), float(rank + i))
    dist.all_reduce(t)  # @faulty
    assert t.tolist() == [float(2 * i + 1)] * 2, t  # (0 + i) + (1 + i)
dist.barrier()
print(f"rank {rank}: sums correct", flush=True)
dist.destroy_process_group()
"""

FAULT_LINE = ("comm2perfetto: recording disabled on rank {rank} after an internal error: RuntimeError: "
              "injected recorder fault in all_reduce (COMM2PERFETTO_TEST_FAULT)")


@pytest.fixture(scope="module")
def fault_job(module_jobs):
    job = module_jobs.run(JOB, record_args=["--stall-after", "30"], env={"COMM2PERFETTO_TEST_FAULT": "all_reduce"})
    assert job.returncode == 0, job.explain()
    return job


def test_training_finishes_with_correct_results(fault_job):
    assert "rank 0: sums correct" in fault_job.stdout
    assert "rank 1: sums correct" in fault_job.stdout


def test_one_line_per_rank_on_stderr(fault_job):
    lines = [line for line in fault_job.stderr.splitlines() if "recording disabled" in line]
    assert sorted(lines) == [FAULT_LINE.format(rank=rank) for rank in (0, 1)]
    assert "Traceback" not in fault_job.stderr


@pytest.mark.parametrize("rank", [0, 1])
def test_log_records_the_fault_and_still_closes(fault_job, rank):
    log = fault_job.log(rank)
    assert log.problems == []
    assert [message for _t, message in log.warnings] == [FAULT_LINE.format(rank=rank)]
    # Only the call before the fault was recorded; nothing after it (the barrier included).
    assert [(c.op, c.site) for c in log.calls] == [("broadcast", f"job.py:{fault_job.line_of('@before')} <module>")]
    assert log.closed_reason == "exit"
    assert [reason for _t, _name, reason in log.fr_dumps] == (["destroy", "exit"] if gloo_flight_recorder() else [])


@needs_gloo_flight_recorder()
@pytest.mark.parametrize("rank", [0, 1])
def test_flight_recorder_still_saw_everything(fault_job, rank):
    names = [e["profiling_name"] for e in fault_job.fr_entries(rank)]
    assert names == ["gloo:broadcast"] + ["gloo:all_reduce"] * 3 + ["gloo:barrier"]
