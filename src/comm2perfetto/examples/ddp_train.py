"""DDP training of a small MLP on synthetic MNIST-shaped data: the healthy job comm2perfetto records.

The model and loop follow a classic DDP MNIST script: DDP broadcasts the parameters at wrap time, backward
all-reduces the gradients, each epoch ends with ``dist.reduce`` of the loss to rank 0 and a ``dist.barrier``.
The data are random tensors, so nothing is downloaded and a run takes a few seconds on CPU.

Run it either way::

    torchrun --nproc_per_node 2 examples/ddp_train.py [--epochs E] [--steps S] [--batch B]
    python -m comm2perfetto.examples.ddp_train --nproc 2            # spawns the ranks itself

and under the recorder::

    comm2perfetto record -o c2p-ddp -- torchrun --nproc_per_node 2 examples/ddp_train.py

``--report-step-time`` makes rank 0 print ``step_time_ms median=<x> mean=<y> steps=<n>``
(benchmarks/bench_record.py parses it). ``--bind-cpu`` pins rank r to CPU core r (modulo the cores), as a
launcher's CPU binding does: the scheduler then stops moving ranks between cores, and step times scatter less.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
from collections.abc import Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from comm2perfetto.examples._launch import launch

WARMUP_STEPS = 5  # steps left out of the step-time figures: first calls allocate and build DDP buckets


class Net(nn.Module):
    """Flatten, then a 784-128-64-10 MLP with ReLUs."""

    def __init__(self) -> None:
        super().__init__()
        self.flatten = nn.Flatten()
        self.seq = nn.Sequential(
            nn.Linear(28 * 28, 128),
            nn.ReLU(),
            nn.Linear(128, 64),
            nn.ReLU(),
            nn.Linear(64, 10),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.seq(self.flatten(x))


def synthetic_mnist(samples: int, seed: int = 0) -> TensorDataset:
    """Random images of shape (1, 28, 28) with random labels 0..9.

    The fixed seed gives every rank the same dataset, as a real dataset on disk would; DistributedSampler then
    hands each rank its own part.
    """
    gen = torch.Generator().manual_seed(seed)
    images = torch.randn(samples, 1, 28, 28, generator=gen)
    labels = torch.randint(0, 10, (samples,), generator=gen)
    return TensorDataset(images, labels)


def pick_backend(requested: str) -> str:
    """``auto`` means nccl when CUDA is available, else gloo."""
    if requested != "auto":
        return requested
    return "nccl" if torch.cuda.is_available() else "gloo"


def train_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor
) -> torch.Tensor:
    """One optimisation step; backward is where DDP all-reduces the gradients."""
    loss = F.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.detach()


def train(args: argparse.Namespace) -> None:
    """The body of one rank; expects the torchrun environment (RANK, WORLD_SIZE, MASTER_ADDR, ...)."""
    backend = pick_backend(args.backend)
    dist.init_process_group(backend=backend)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if args.bind_cpu and hasattr(os, "sched_setaffinity"):  # Linux only; elsewhere the flag does nothing
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[rank % len(cores)]})
    if backend == "nccl":
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")

    torch.manual_seed(rank)  # different initial weights per rank: DDP's broadcast from rank 0 must fix that
    model = DDP(Net().to(device), bucket_cap_mb=args.bucket_cap_mb)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    # Exactly args.steps batches per rank and epoch.
    dataset = synthetic_mnist(args.steps * args.batch * world_size)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=args.batch, sampler=sampler, num_workers=0)

    step_ns: list[int] = []
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        loss = torch.zeros((), device=device)
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            start = time.perf_counter_ns()
            loss = train_step(model, optimizer, x, y)
            if device.type == "cuda":
                torch.cuda.synchronize()  # a step's time includes its kernels, not only their launch
            step_ns.append(time.perf_counter_ns() - start)

        dist.reduce(loss, dst=0)  # the last batch's loss, summed on rank 0
        if rank == 0:
            print(f"epoch {epoch} train_loss {loss.item() / world_size:.4f}", flush=True)

    dist.barrier()
    if args.report_step_time and rank == 0:
        timed = step_ns[WARMUP_STEPS:] or step_ns
        print(f"step_time_ms median={statistics.median(timed) / 1e6:.4f} mean={statistics.fmean(timed) / 1e6:.4f} "
              f"steps={len(timed)}", flush=True)
    dist.destroy_process_group()
    # DDP's hooks keep the model in reference cycles, and with it the gloo group and its work objects: freed
    # now, while Python is whole, rather than at exit, where gloo can abort the process ("terminate called
    # without an active exception", about one run in eight here; pytorch/pytorch#179291 describes it).
    del model, optimizer, loader
    gc.collect()


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nproc", type=int, default=None, help="spawn this many ranks (without torchrun)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20, help="steps per epoch and rank")
    parser.add_argument("--batch", type=int, default=32, help="batch size per rank")
    parser.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto")
    parser.add_argument("--bucket-cap-mb", type=float, default=25.0,
                        help="DDP's gradient bucket size in MiB (torch's default 25: the whole model in one bucket)")
    parser.add_argument(
        "--report-step-time",
        action="store_true",
        help=f"rank 0 prints the median and mean step time, leaving out the first {WARMUP_STEPS} steps",
    )
    parser.add_argument("--bind-cpu", action="store_true", help="pin rank r to CPU core r (modulo the cores; Linux)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    launch(train, parse_args())
