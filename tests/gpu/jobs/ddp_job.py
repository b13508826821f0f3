"""A small healthy DDP job for the GPU check, with the calls whose recording the check verifies.

Before training: an async all_reduce issued inside NVTX ranges of two domains (``data`` through the ``nvtx``
package, the default one through ``torch.cuda.nvtx``) and waited for; the ``data`` range closed first (NVTX
keeps one stack per domain) and a synchronous all_reduce inside the default-domain range alone. Then
``--steps`` DDP steps, each with a ``data`` range, a ``comm2perfetto.range`` and an ``optim``-domain
``nvtx.annotate``. On a GPU each step can also all-reduce with a pre-multiplied sum (``--premul``: at world
size 1 NCCL runs no kernel for a plain sum, in place, but does for PreMulSum) and exchange a tensor with
itself through ``batch_isend_irecv`` (``--p2p``: NCCL's SendRecv kernel), so that a profiled step has NCCL
work on the GPU. ``--user-profiler`` runs the whole loop under the job's own ``torch.profiler.profile`` with a
schedule and ``prof.step()`` (its trace has ``ProfilerStep#n``, which ``--profile-steps`` traces lack). Prints
``C2P_INFO {"step_ms": ...}`` (mean over the steps after ``--warmup``).
"""

from __future__ import annotations

import argparse
import contextlib
import time

import nvtx
import torch
import torch.distributed as dist
from common import CPU, info, nvtx_pop, nvtx_push, setup, sync
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import comm2perfetto


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--premul", action="store_true")
    p.add_argument("--p2p", action="store_true")
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--user-profiler", action="store_true")
    args = p.parse_args()

    rank, world, device = setup()
    x = torch.ones(1 << 20, device=device)
    nvtx_push("outer-data", domain="data")
    nvtx_push("inner-default")
    work = dist.all_reduce(x, async_op=True)  # context: outer-data, inner-default
    nvtx_pop(domain="data")  # closes outer-data although inner-default opened after it
    work.wait()
    dist.all_reduce(x)  # context: inner-default
    nvtx_pop()
    info(what="nvtx_calls_done")

    model = DistributedDataParallel(
        nn.Sequential(nn.Linear(args.width, args.width), nn.ReLU(), nn.Linear(args.width, 8)).to(device))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    premul = dist._make_nccl_premul_sum(0.5) if args.premul and not CPU else None
    y = torch.ones(1 << 16, device=device)
    peer = (rank + 1) % world
    send, recv = torch.arange(1024, dtype=torch.float32, device=device), torch.zeros(1024, device=device)
    prof = None
    if args.user_profiler:
        from torch.profiler import ProfilerActivity, profile, schedule

        activities = [ProfilerActivity.CPU] + ([] if CPU else [ProfilerActivity.CUDA])
        prof = profile(activities=activities, schedule=schedule(wait=1, warmup=1, active=3, repeat=1),
                       on_trace_ready=lambda p: info(what="user_trace_ready", step_num=p.step_num))
    with prof if prof is not None else contextlib.nullcontext():
        t0 = train(args, model, opt, premul, y, send, recv, peer, device, prof)
    sync(device)
    measured = args.steps - args.warmup
    info(what="steps_done", step_ms=(time.perf_counter() - t0) * 1000 / measured if t0 else None,
         steps=measured, p2p_ok=bool(torch.equal(recv.cpu(), send.cpu())) if args.p2p else None)
    dist.destroy_process_group()


def train(args, model, opt, premul, y, send, recv, peer, device, prof) -> float | None:
    t0 = None
    for step in range(args.steps):
        if step == args.warmup:
            sync(device)
            t0 = time.perf_counter()
        nvtx.push_range("batch", domain="data")
        batch = torch.randn(64, args.width, device=device)
        nvtx.pop_range(domain="data")
        with comm2perfetto.range("fwd-bwd"):
            opt.zero_grad()
            model(batch).sum().backward()
        with nvtx.annotate("optimizer", domain="optim"):
            opt.step()
        if premul is not None:
            dist.all_reduce(y, op=premul)
        if args.p2p:
            for req in dist.batch_isend_irecv([dist.P2POp(dist.isend, send, peer),
                                                dist.P2POp(dist.irecv, recv, peer)]):
                req.wait()
        if prof is not None:
            prof.step()
    return t0


if __name__ == "__main__":
    main()
