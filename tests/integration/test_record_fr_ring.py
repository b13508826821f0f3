"""Flight Recorder keeps only the last N entries in a ring. On a real 2-rank gloo job that issues five times
more collectives than a deliberately small ring holds (DDP's from C++ and the script's own), the recorder's
dumps must together still hold every one of them: it dumps whenever half a ring has accumulated."""

from __future__ import annotations

import pytest

from support.torch_features import needs_gloo_flight_recorder

pytestmark = [pytest.mark.integration, needs_gloo_flight_recorder()]

RING = 16
STEPS = 12
CALLS_PER_STEP = 5  # Python all-reduces per step, besides DDP's gradient all-reduce(s)

JOB = f"""
import gc
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
model = DistributedDataParallel(nn.Linear(4, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range({STEPS}):
    for _ in range({CALLS_PER_STEP}):
        dist.all_reduce(torch.ones(2))
    optimizer.zero_grad()
    model(torch.randn(8, 4)).sum().backward()
    optimizer.step()
dist.destroy_process_group()
del model, optimizer  # DDP's reference cycles hold the gloo group: freed while Python is whole (examples/ddp_train.py)
gc.collect()
"""


@pytest.fixture(scope="module")
def ring_job(module_jobs):
    job = module_jobs.run(JOB, record_args=["--fr-buffer", str(RING)])
    assert job.returncode == 0, job.explain()
    return job


@pytest.mark.parametrize("rank", [0, 1])
def test_dumps_together_hold_every_collective(ring_job, rank):
    seqs = sorted(e["collective_seq_id"] for e in ring_job.fr_entries(rank) if e["process_group"][0] == "0")
    issued = STEPS * (CALLS_PER_STEP + 1) + 1  # + DDP's gradient all-reduce each step, + its first broadcast
    assert seqs[-1] >= issued > 4 * RING
    assert seqs == list(range(1, seqs[-1] + 1)), "entries were dropped between dumps"
    dumps = ring_job.fr_dumps(rank)
    assert len(dumps) >= issued // RING  # about one per half ring, not one at exit
    ops = {e["profiling_name"] for e in ring_job.fr_entries(rank)}
    assert {"gloo:all_reduce", "gloo:broadcast"} <= ops
