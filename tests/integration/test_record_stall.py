"""Stalls on real 2-rank gloo jobs, found by the watchdog with ``--stall-after 2`` while rank 1 sleeps 8 s:

- outside any collective: rank 0 waits in an all_reduce while rank 1 sleeps in ``slow_data_loader()``. Rank 0's
  watchdog reports the pending call and, through the job's store, makes rank 1 dump too: both leave their Python
  stacks, and rank 1's shows where it really is. The job then completes normally.
- inside a collective the patch layer never sees: DDP's gradient all-reduce, issued from C++. Rank 1 sleeps in
  ``slow_batch()`` before its third backward pass while rank 0 waits in that step's all-reduce inside
  ``loss.backward()``. No Python ``torch.distributed`` call is pending, so the watchdog finds the stall from
  Flight Recorder's ``pg_status`` (enqueued > completed, unchanged past ``--stall-after``), or on torch 2.4-2.7
  (no Flight Recorder for gloo) from the all-reduce the dispatcher fallback recorded, pending, and makes every
  rank dump; ``diagnose`` then names rank 1 and shows where it was.

The two jobs run at once (``stall_jobs``): each mostly waits for rank 1.
"""

from __future__ import annotations

import json

import pytest

from support.cli import run_cli_process
from support.torch_features import gloo_flight_recorder, needs_gloo_flight_recorder

pytestmark = pytest.mark.integration

SLEEP_S = 8

LOADER_JOB = f"""
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

DDP_JOB = f"""
import gc
import time
from datetime import timedelta
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def slow_batch():
    time.sleep({SLEEP_S})  # @sleep


dist.init_process_group("gloo", timeout=timedelta(seconds=120))
rank = dist.get_rank()
model = DDP(torch.nn.Linear(8, 8))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    if step == 2 and rank == 1:
        slow_batch()  # @call_slow
    model(torch.randn(4, 8)).sum().backward()  # @backward
    optimizer.step()
dist.destroy_process_group()
del model, optimizer  # DDP's reference cycles hold the gloo group: freed while Python is whole (examples/ddp_train.py)
gc.collect()
"""


@pytest.fixture(scope="module")
def stall_jobs(module_jobs):
    stall = {"record_args": ["--stall-after", "2"]}
    jobs = module_jobs.run_together({"loader": (LOADER_JOB, stall), "ddp": (DDP_JOB, stall)})
    for job in jobs.values():
        assert job.returncode == 0, job.explain()
    return jobs


@pytest.fixture(scope="module")
def stall_job(stall_jobs):
    return stall_jobs["loader"]


@pytest.fixture(scope="module")
def ddp_stall(stall_jobs):
    return stall_jobs["ddp"]


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


def _the_stall(job, rank: int):
    """The stall ``rank`` logged during the third step, while rank 1 slept."""
    steps = {step: t for step, t, _source in job.log(rank).steps}
    return job.stall_between(rank, steps[2], steps[3])


def test_stall_found_where_ddps_collectives_are_seen(ddp_stall):
    stall0, stall1 = _the_stall(ddp_stall, 0), _the_stall(ddp_stall, 1)
    if gloo_flight_recorder():  # from Flight Recorder: the patch layer saw nothing, DDP issued all from C++
        assert ddp_stall.log(0).calls == [] and ddp_stall.log(1).calls == []
        assert (stall0.reason, stall0.trigger_rank, stall0.cid) == ("fr_pending", 0, None)
        assert "rank 0: gloo:all_reduce (group default_pg, seq" in ddp_stall.stderr
    else:  # from the dispatcher fallback's record of DDP's all-reduce, pending
        calls = {c.cid: c for c in ddp_stall.log(0).calls}
        assert calls and all(c.from_cpp for c in calls.values())
        assert (stall0.reason, stall0.trigger_rank) == ("pending", 0)
        stalled = calls[stall0.cid]
        assert (stalled.op, stalled.pass_, stalled.step) == ("all_reduce", "backward", 2)
        assert f"rank 0: all_reduce (group 0, seq {stalled.seq}) pending for" in ddp_stall.stderr
    # Rank 1 was caught while sleeping, after its second optimizer step and before its third.
    assert (stall1.reason, stall1.trigger_rank) == ("remote", 0)


def test_both_ranks_leave_their_stacks(ddp_stall):
    from comm2perfetto.sources.stacks import read_stacks

    def main_frames(rank: int) -> list[tuple[str, int]]:
        stacks = read_stacks(ddp_stall.out / _the_stall(ddp_stall, rank).stacks_file)
        return [(func, line) for file, line, func in _main_thread(stacks).frames if file.endswith("job.py")]

    assert main_frames(0) == [("<module>", ddp_stall.line_of("@backward"))]
    assert main_frames(1) == [("slow_batch", ddp_stall.line_of("@sleep")),
                              ("<module>", ddp_stall.line_of("@call_slow"))]


def test_diagnose_names_the_sleeping_rank(ddp_stall):
    proc = run_cli_process("diagnose", str(ddp_stall.out), "--format", "json", timeout=120)
    assert proc.code == 0, proc.err  # the stall resolved: reported, and no problem left
    report = json.loads(proc.out)
    (finding,) = report["findings"]
    assert (finding["kind"], finding["op"], finding["culprit_ranks"], finding["resolved"]) == \
        ("missing_ranks", "all_reduce", [1], True)
    assert finding["stacks"]["1"][0] == f"job.py:{ddp_stall.line_of('@sleep')} slow_batch"
