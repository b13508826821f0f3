"""Makes gloo_ddp_rank0.json.gz: a 2-rank gloo DDP job profiled with torch.profiler (CPU, with_stack).

Run from the repository root (see README.md in this folder)::

    comm2perfetto record -o /tmp/c2p-kineto -- \
        python -m torch.distributed.run --standalone --nproc_per_node 2 \
        tests/data/kineto/record_gloo_ddp.py /tmp/c2p-kineto-traces

The schedule (wait 1, warmup 1, active 2) records ProfilerStep#2 and #3; each step runs DDP's gradient
all-reduce (issued from C++), an explicit ``dist.all_reduce`` and a ``dist.broadcast``.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile, schedule


def main(out_dir: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def save(prof: profile) -> None:
        prof.export_chrome_trace(os.path.join(out_dir, f"gloo_ddp_rank{rank}.json.gz"))

    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=2),
                 on_trace_ready=save, with_stack=True) as prof:
        for _step in range(5):
            loss = model(torch.randn(16, 64)).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            dist.all_reduce(loss.detach())
            dist.broadcast(torch.zeros(3), src=0)
            prof.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.makedirs(sys.argv[1], exist_ok=True)
    main(sys.argv[1])
