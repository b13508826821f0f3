"""Recorder dumps never race the job's own imports (issue 12, item 1).

Symbolising a Flight Recorder dump's Python frames makes torch import ``torch._inductor`` (about 800 modules)
unless the job imported it already; DDP's constructor imports ``torch._dynamo``, which imports inductor too.
Both at once broke the job with ``ImportError: cannot import name 'IndentedBuffer' from partially initialized
module 'torch._inductor.utils'``. Here every rank dumps every 0.1 s (the watchdog's tick
with ``--stall-after 0.4``) while its main thread constructs DDP for the first time: a thread of the job starts
issuing collectives on a group of its own a little after DDP's constructor begins, so each tick has half a
ring (2 entries) to dump. The sweep moves the delay between the first collective and DDP, and the first dump
later into DDP's imports. Without the fix every one of these jobs died.
"""

from __future__ import annotations

import json

import pytest

from support.jobs import torchrun

pytestmark = pytest.mark.integration

torch_c10d = pytest.importorskip("torch._C._distributed_c10d")
if not hasattr(torch_c10d, "_dump_fr_trace"):
    pytest.skip("this torch has no gloo Flight Recorder dump: no dump symbolises frames", allow_module_level=True)

JOB = """
import gc
import json, sys, threading, time
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

delay, lag = float(sys.argv[1]), float(sys.argv[2])
dist.init_process_group("gloo")
side = dist.new_group()
dist.all_reduce(torch.ones(2))
time.sleep(delay)
building = threading.Event()
building.set()


def keep_issuing():  # both ranks stop after the same call: the first that sees a rank done (MIN)
    time.sleep(lag)
    go = torch.ones(1)
    while go.item():
        go = torch.tensor([float(building.is_set())])
        dist.all_reduce(go, op=dist.ReduceOp.MIN, group=side)
        time.sleep(0.01)


thread = threading.Thread(target=keep_issuing, daemon=True)  # a job that failed exits
thread.start()
t_begin = time.time_ns()
model = DistributedDataParallel(nn.Linear(4, 2))
t_end = time.time_ns()
building.clear()
thread.join()
model(torch.randn(8, 4)).sum().backward()
with open(f"window.{dist.get_rank()}.json", "w") as f:
    json.dump({"begin": t_begin, "end": t_end, "inductor": "torch._inductor" in sys.modules}, f)
dist.destroy_process_group()
del model  # DDP's reference cycles hold the gloo group: freed while Python is whole (examples/ddp_train.py)
gc.collect()
"""

# (seconds from the first collective to DDP, seconds from DDP's start to the side thread's first collective)
SWEEP = ((0.3, 0.0), (0.6, 0.15), (0.9, 0.3))


def test_dumps_during_ddp_construction_leave_the_job_alone(record_job):
    dumps_inside = 0
    for delay, lag in SWEEP:
        # a ring of 4: the first collective alone (and the group's creation) leaves no dump due before DDP
        running = record_job.start(JOB, job=[*torchrun(2), str(delay), str(lag)],
                                   record_args=["--fr-buffer", "4", "--stall-after", "0.4"])
        job = running.finish(timeout=60)
        assert job.returncode == 0, f"delay {delay} s, lag {lag} s: " + job.explain()
        for rank in (0, 1):
            log = job.log(rank)
            assert log.closed_reason == "exit" and log.problems == [], (delay, lag, rank, log.problems)
            window = json.loads((job.cwd / f"window.{rank}.json").read_text())
            dumps_inside += sum(window["begin"] <= t_ns <= window["end"] for t_ns, _name, _why in log.fr_dumps)
    # The sweep did what it is for: dumps were written while DDP was being constructed (and importing).
    assert dumps_inside > 0
