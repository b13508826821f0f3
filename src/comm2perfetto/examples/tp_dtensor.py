"""Tensor parallelism with DTensor: the MLP of torch's own TP tests, split over the ranks of a 1-D device mesh.

``net1`` is split by columns and ``net2`` by rows (Megatron style), so each rank holds half of each weight
and the forward pass needs one collective: RowwiseParallel's output hook all-reduces ``net2``'s partial sums.
The input requires grad, so backward all-reduces the input's gradient once more (in ``net1``, where
ColwiseParallel made the input a replicated DTensor). DTensor issues these through
``torch.distributed._functional_collectives``, never through ``torch.distributed.all_reduce``.

Each step runs under torch's ``CommDebugMode``, which counts the collectives per module and pass; with
``--comm-counts FILE`` rank 0 writes its counts, summed over the steps, as JSON (module path -> "forward" or
"backward" -> op -> count), to compare with what comm2perfetto records.

    torchrun --nproc_per_node 2 examples/tp_dtensor.py [--steps S] [--comm-counts FILE]
    python -m comm2perfetto.examples.tp_dtensor --nproc 2            # spawns the ranks itself

and under the recorder::

    comm2perfetto record -o c2p-tp -- torchrun --nproc_per_node 2 examples/tp_dtensor.py
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

try:
    from torch.distributed.tensor.debug import CommDebugMode
except ModuleNotFoundError as missing:  # it imports numpy, which torch (and the `record` extra) do not install
    raise SystemExit(f"tp_dtensor.py: torch's CommDebugMode needs {missing.name}, which is not installed: "
                     f"pip install {missing.name}") from None

from comm2perfetto.examples._launch import launch


class MLPModule(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net1 = nn.Linear(16, 64)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(64, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net2(self.relu(self.net1(x)))


def add_counts(total: dict, comm: CommDebugMode) -> None:
    """Add CommDebugMode's per-module counts to ``total``, keys as strings (``c10d_functional.all_reduce``)."""
    for module, passes in comm.comm_module_counts.items():
        for pass_, ops in passes.items():
            for op, count in ops.items():
                by_op = total.setdefault(module, {}).setdefault(pass_, {})
                by_op[str(op)] = by_op.get(str(op), 0) + count


def train(args: argparse.Namespace) -> None:
    """The body of one rank; expects the torchrun environment (RANK, WORLD_SIZE, MASTER_ADDR, ...)."""
    mesh = init_device_mesh("cpu", (int(os.environ["WORLD_SIZE"]),))  # also creates the (gloo) process group
    torch.manual_seed(0)  # the same weights and inputs on every rank, as TP needs
    model = parallelize_module(MLPModule(), mesh, {"net1": ColwiseParallel(), "net2": RowwiseParallel()})
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    counts: dict = {}
    for step in range(args.steps):
        x = torch.randn(4, 16, requires_grad=True)
        with CommDebugMode() as comm:  # a fresh one per step: its module tracker is meant for one pass
            loss = model(x).sum()
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        add_counts(counts, comm)
        if dist.get_rank() == 0:
            print(f"step {step} loss {loss.item():.4f} collectives {comm.get_total_counts()}", flush=True)

    if args.comm_counts and dist.get_rank() == 0:
        with open(args.comm_counts, "w") as f:
            json.dump(counts, f, indent=1, sort_keys=True)
    dist.destroy_process_group()


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nproc", type=int, default=None, help="spawn this many ranks (without torchrun)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--comm-counts", default=None, help="rank 0 writes CommDebugMode's counts here (JSON)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    launch(train, parse_args())
