"""torch.profiler on a real 2-rank gloo job: ``--profile-steps 1-2`` records a window of an optimizer loop,
and a profiler the user runs keeps its ``on_trace_ready`` callback while its trace is also saved."""

from __future__ import annotations

import gzip
import json

import pytest

pytestmark = pytest.mark.integration

JOB = """
from pathlib import Path
import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

dist.init_process_group("gloo")
rank = dist.get_rank()
model = torch.nn.Linear(4, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(4):
    optimizer.zero_grad()
    model(torch.randn(2, 4)).sum().backward()
    dist.all_reduce(model.weight.grad)  # @loop
    optimizer.step()

calls = []


def on_ready(prof):
    calls.append(prof)
    prof.export_chrome_trace(f"user_trace_rank{rank}.json")


with profile(activities=[ProfilerActivity.CPU], on_trace_ready=on_ready):
    dist.broadcast(torch.ones(5), src=0)  # @user_profiled
assert len(calls) == 1, calls
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def profiler_job(module_jobs):
    job = module_jobs.run(JOB, record_args=["--stall-after", "30", "--profile-steps", "1-2"])
    assert job.returncode == 0, job.explain()
    return job


def _trace(path):
    with gzip.open(path, "rb") as f:
        return json.load(f)


@pytest.mark.parametrize("rank", [0, 1])
def test_profile_steps_window_is_saved(profiler_job, rank):
    log = profiler_job.log(rank)
    assert log.closed_reason == "exit" and log.problems == []
    assert log.header["config"]["profile_steps"] == [1, 2]
    assert [name for _t, name in log.profiler_traces] == [f"rank{rank}.kineto.1.json.gz",
                                                          f"rank{rank}.kineto.2.json.gz"]
    steps = {step: t for step, t, _source in log.steps}
    assert sorted(steps) == [1, 2, 3, 4]
    # Our window: started when step 1 began, saved when step 3 began (the end of step 2).
    (t_saved, _name) = log.profiler_traces[0]
    assert steps[3] <= t_saved < steps[4]
    trace = _trace(profiler_job.out / f"rank{rank}.kineto.1.json.gz")
    events = trace["traceEvents"]
    assert events
    assert trace.get("distributedInfo", {}).get("rank") == rank
    # Steps 1 and 2 each ran one all_reduce inside the window; steps 0 and 3 ran outside it.
    all_reduces = [e for e in events if e.get("ph") == "X" and e.get("name") == "c10d::allreduce_"]
    assert len(all_reduces) == 2, sorted({e.get("name") for e in events})
    # The window marks its steps as a scheduled profiler does, numbered as the job counts them: readers project
    # them onto the GPU ("steps (GPU)") and report per step from them.
    marked = sorted(e["name"] for e in events if e.get("ph") == "X" and e.get("name", "").startswith("ProfilerStep#"))
    assert marked == ["ProfilerStep#1", "ProfilerStep#2"]


@pytest.mark.parametrize("rank", [0, 1])
def test_users_profiler_keeps_its_callback_and_is_saved_too(profiler_job, rank):
    # The user's callback ran (it wrote its own trace), and the same trace is in the output folder.
    user_trace = json.loads((profiler_job.cwd / f"user_trace_rank{rank}.json").read_text())
    ours = _trace(profiler_job.out / f"rank{rank}.kineto.2.json.gz")
    def timed(trace):  # (name, absolute ns) of every operator: Kineto's own file also has metadata events, and
        base = trace.get("baseTimeNanoseconds", 0)  # the profiler's own span starts at a different point in each
        return {(e["name"], base + round(e["ts"] * 1000)) for e in trace["traceEvents"]
                if e.get("ph") == "X" and not e["name"].startswith("PyTorch Profiler")}

    names = {name for name, _t in timed(ours)}
    assert "c10d::broadcast_" in names
    assert "c10d::allreduce_" not in names
    # The same operators at the same times (torch < 2.13 exports its function events, timed from the start)
    assert timed(user_trace) == timed(ours)
    assert ours["distributedInfo"]["rank"] == rank
