"""A stall inside a collective the patch layer never sees: DDP's gradient all-reduce, issued from C++.

Rank 1 sleeps in ``slow_batch()`` before its third backward pass while rank 0 waits in that step's
all-reduce inside ``loss.backward()``. No Python ``torch.distributed`` call is pending, so the watchdog finds
the stall from Flight Recorder's ``pg_status`` (enqueued > completed, unchanged past ``--stall-after``), or on
torch 2.4-2.7 (no Flight Recorder for gloo) from the all-reduce the dispatcher fallback recorded, pending, and
makes every rank dump; ``diagnose`` then names rank 1 and shows where it was.
"""

from __future__ import annotations

import json

import pytest

from support.cli import run_cli_process
from support.torch_features import gloo_flight_recorder

pytestmark = pytest.mark.integration

SLEEP_S = 8

JOB = f"""
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
def ddp_stall(module_jobs):
    job = module_jobs.run(JOB, record_args=["--stall-after", "2"])
    assert job.returncode == 0, job.explain()
    return job


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
        (main,) = [t for t in stacks.threads if t.name == "MainThread"]
        return [(func, line) for file, line, func in main.frames if file.endswith("job.py")]

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
