"""``comm2perfetto report`` on a real 2-rank DDP job on gloo, profiled, where rank 1 is late by a known delay.

Each of 8 steps, on both ranks: forward, backward (DDP's gradient all-reduces, issued from C++ inside autograd's
``AccumulateGrad``: the patch layer does not see them and gloo's Flight Recorder does not time them), optimizer
step. In steps 4-7 rank 1 sleeps ``LAG_S`` before its backward, so rank 0 waits for it in DDP's all-reduces.
Steps 2-7 are profiled. The waiting rank's compute must not grow by the delay (its wait is communication,
wherever it blocks), its exposed communication must; and DDP's all-reduces have times, from the profiler's
gloo events.
"""

from __future__ import annotations

import pytest

from support.cli import run_cli

pytestmark = pytest.mark.integration

LAG_S = 0.100
LATE_STEPS = (4, 7)

JOB = f"""
import gc
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(nn.Sequential(*[nn.Linear(256, 256) for _ in range(4)]), bucket_cap_mb=0.25)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(32, 256)
for step in range(8):
    loss = model(x).square().mean()
    if rank == 1 and {LATE_STEPS[0]} <= step <= {LATE_STEPS[1]}:
        time.sleep({LAG_S})  # the late rank
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
dist.destroy_process_group()
del model, optimizer  # DDP's reference cycles hold the gloo group: freed while Python is whole
gc.collect()
"""


@pytest.fixture(scope="module")
def late_ddp(module_jobs):
    result = module_jobs.run(JOB, record_args=["--stall-after", "off", "--profile-steps", "2-7"])
    assert result.returncode == 0, result.explain()
    return result.out


def _report(out, steps: str) -> dict:
    done = run_cli("report", out, "--steps", steps, "--format", "json")
    assert done.code == 0, done.err
    return done.json()


def test_the_wait_for_a_late_rank_is_communication_not_compute(late_ddp):
    doc = _report(late_ddp, f"{LATE_STEPS[0]}-{LATE_STEPS[1]}")
    late_steps = LATE_STEPS[1] - LATE_STEPS[0] + 1
    waiting, late = doc["ranks"]["0"], doc["ranks"]["1"]
    assert waiting["basis"] == late["basis"] == "cpu"
    # both ranks do the same work: the 400 ms rank 0 waits is not its compute (one delay is 25 % of it)
    assert waiting["compute_s"] < late["compute_s"] + LAG_S, (waiting, late)
    assert waiting["exposed_comm_s"] > late_steps * LAG_S * 0.8, waiting
    assert waiting["exposed_comm_s"] > late["exposed_comm_s"] + late_steps * LAG_S * 0.5, (waiting, late)
    for step in doc["steps"]:
        row = step["ranks"]["0"]
        assert row["exposed_comm_s"] > LAG_S * 0.8 and row["compute_s"] < LAG_S, step


def test_ddp_all_reduces_on_gloo_are_timed_in_the_profiled_steps(late_ddp):
    """Flight Recorder does not time gloo's collectives; the profiler's gloo events do."""
    doc = _report(late_ddp, "2-7")
    [row] = [r for r in doc["collectives"] if r["op"] == "all_reduce"]
    assert row["count"] >= 6 and row["timed"] == row["count"], row
    assert row["algbw_gbps"] is not None and row["algbw_gbps"] > 0, row
    durations = [d for d in row["instances"]["duration_s"] if d is not None]
    assert len(durations) == row["count"] and max(durations) > LAG_S * 0.8  # a wait for the late rank is in one
