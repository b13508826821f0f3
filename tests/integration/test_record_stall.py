"""A stall on a real 2-rank gloo job: rank 0 waits in an all_reduce while rank 1 sleeps in
``slow_data_loader()``, outside any collective. With ``--stall-after 2`` rank 0's watchdog reports the pending
call and, through the job's store, makes rank 1 dump too: both leave their Python stacks, and rank 1's shows
where it really is. The job then completes normally."""

from __future__ import annotations

import pytest

from support.torch_features import needs_gloo_flight_recorder

pytestmark = pytest.mark.integration

SLEEP_S = 8

JOB = f"""
import time
import torch
import torch.distributed as dist


def slow_data_loader():
    time.sleep({SLEEP_S})  # @sleep


dist.init_process_group("gloo")
rank = dist.get_rank()
dist.all_reduce(torch.ones(2))  # @warmup
if rank == 1:
    slow_data_loader()  # @call_loader
t = torch.ones(3)
dist.all_reduce(t)  # @stalled
assert t.tolist() == [2.0] * 3
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def stall_job(module_jobs):
    job = module_jobs.run(JOB, record_args=["--stall-after", "2"])
    assert job.returncode == 0, job.explain()
    return job


def _main_thread(stacks):
    (main,) = [t for t in stacks.threads if t.name == "MainThread"]
    return main


def test_job_completes_and_reports_the_stall(stall_job):
    assert "rank 0: all_reduce (group 0, seq 2) pending for" in stall_job.stderr
    for rank in (0, 1):
        log = stall_job.log(rank)
        assert log.closed_reason == "exit" and log.problems == []
        assert [c.op for c in log.calls] == ["all_reduce", "all_reduce"]


def test_rank_waiting_in_the_collective(stall_job):
    from comm2perfetto.sources.stacks import read_stacks

    log = stall_job.log(0)
    stalled = log.calls[1]
    assert stalled.site == f"job.py:{stall_job.line_of('@stalled')} <module>"
    stall = stall_job.stall_between(0, stalled.t_call_ns, stalled.t_return_ns)
    assert (stall.reason, stall.trigger_rank, stall.cid) == ("pending", 0, stalled.cid)
    assert stall.t_ns >= stalled.t_call_ns + 2e9  # reported after --stall-after

    stacks = read_stacks(stall_job.out / stall.stacks_file)
    assert (stacks.rank, stacks.reason, stacks.trigger_rank) == (0, "pending", 0)
    assert [(p.cid, p.op, p.gid, p.seq) for p in stacks.pending] == [(stalled.cid, "all_reduce", 0, 2)]
    assert stacks.pending[0].since_ns == stalled.t_call_ns
    frames = _main_thread(stacks).frames
    job_frames = [(line, func) for file, line, func in frames if file.endswith("job.py")]
    assert job_frames == [(stall_job.line_of("@stalled"), "<module>")]
    assert frames[0][2] == "all_reduce"  # innermost first: torch's all_reduce (our wrapper is left out)
    assert not any("comm2perfetto" in file for file, _, _ in frames)


def test_rank_outside_any_collective_leaves_its_stack(stall_job):
    from comm2perfetto.sources.stacks import read_stacks

    log = stall_job.log(1)
    warmup, after = log.calls
    # Dumped while rank 1 was in slow_data_loader: after its first call returned, before its second began.
    stall = stall_job.stall_between(1, warmup.t_return_ns, after.t_call_ns)
    assert (stall.reason, stall.trigger_rank, stall.cid) == ("remote", 0, None)

    stacks = read_stacks(stall_job.out / stall.stacks_file)
    assert (stacks.rank, stacks.reason, stacks.trigger_rank) == (1, "remote", 0)
    assert stacks.pending == ()
    frames = _main_thread(stacks).frames
    assert [(func, line) for _, line, func in frames[:2]] == [
        ("slow_data_loader", stall_job.line_of("@sleep")),
        ("<module>", stall_job.line_of("@call_loader")),
    ]
    # The watchdog thread that wrote the file is not in it; every other thread is.
    names = [t.name for t in stacks.threads]
    assert "comm2perfetto-watchdog" not in names


@needs_gloo_flight_recorder()
@pytest.mark.parametrize("rank", [0, 1])
def test_flight_recorder_dumped_at_the_stall(stall_job, rank):
    log = stall_job.log(rank)
    warmup, stalled = log.calls
    stall = stall_job.stall_between(rank, warmup.t_return_ns, stalled.t_return_ns)
    # Each stall is followed by its dump; the job's end adds two more.
    assert [reason for _t, _name, reason in log.fr_dumps] == ["stall"] * len(log.stalls) + ["destroy", "exit"]
    (name,) = [name for t, name, reason in log.fr_dumps if reason == "stall" and t >= stall.t_ns][:1]
    assert (stall_job.out / name).exists()
    entries = stall_job.fr_entries(rank)
    assert [e["profiling_name"] for e in entries] == ["gloo:all_reduce", "gloo:all_reduce"]
    job = stall_job.job_file()
    assert job["exit_status"] == 0
