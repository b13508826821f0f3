"""A job whose ranks disagree on a collective's shape: it fails, and that is the point.

After a few good all-reduces, rank 1 all-reduces a tensor of a different shape than rank 0 (as when ranks take
different code paths, or a model is built differently on one rank). On gloo a peer then aborts from C++
(SIGABRT, "Received data size doesn't match expected size") and the others see the connection close; on NCCL
the job hangs until the process group's timeout instead.

The recorder's job here is that nothing is lost: the event log of the aborted rank still holds its last call,
with the shapes each rank passed, so ``comm2perfetto diagnose`` can name the mismatch.

    torchrun --nproc_per_node 2 examples/shape_mismatch.py
    python -m comm2perfetto.examples.shape_mismatch --nproc 2
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from datetime import timedelta

import torch
import torch.distributed as dist

from comm2perfetto.examples._launch import launch

GOOD_STEPS = 3  # all-reduces on which the ranks still agree
SHAPE = (256,)
WRONG_SHAPE = (512,)  # what rank 1 sends instead
ODD_RANK = 1


def run(args: argparse.Namespace) -> None:
    """The body of one rank; expects the torchrun environment (RANK, WORLD_SIZE, MASTER_ADDR, ...)."""
    # A short timeout: should the backend hang instead of failing, the job still ends.
    dist.init_process_group(backend="gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    if dist.get_world_size() <= ODD_RANK:
        raise SystemExit(f"needs at least {ODD_RANK + 1} ranks")

    for _ in range(GOOD_STEPS):
        dist.all_reduce(torch.ones(SHAPE))
    if rank == 0:
        print(f"{GOOD_STEPS} all-reduces agreed; rank {ODD_RANK} now sends shape {WRONG_SHAPE}", flush=True)

    shape = WRONG_SHAPE if rank == ODD_RANK else SHAPE
    dist.all_reduce(torch.ones(shape))  # gloo aborts a rank here
    print(f"rank {rank}: the mismatched all_reduce returned (the backend did not notice)\n", end="", flush=True)
    dist.destroy_process_group()


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nproc", type=int, default=None, help="spawn this many ranks (without torchrun)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    launch(run, parse_args())
