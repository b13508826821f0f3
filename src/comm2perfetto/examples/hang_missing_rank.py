"""A job that stalls because one rank stops joining collectives for a while.

Every rank all-reduces for a few steps. Then the culprit rank (the last one, or ``--culprit R``) goes off
"loading the next shard" (``load_next_shard``, a sleep loop outside any collective) for ``--hang-seconds``,
while every other rank sits blocked in the next all-reduce. Then the culprit comes back, joins, and the job
finishes normally, so a test can run it without killing anything.

This is the picture comm2perfetto's stall detection is for: with ``--stall-after`` shorter than the hang, the
waiting ranks' pending all-reduce triggers a job-wide stack dump, and the culprit's stack shows it inside
``load_next_shard`` instead of a collective.

    torchrun --nproc_per_node 2 examples/hang_missing_rank.py --hang-seconds 5
    python -m comm2perfetto.examples.hang_missing_rank --nproc 2 --hang-seconds 5
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from datetime import timedelta

import torch
import torch.distributed as dist

from comm2perfetto.examples._launch import launch

GOOD_STEPS = 3  # all-reduces every rank completes before the culprit wanders off
TIMEOUT_MARGIN_S = 100  # the process group outlives the hang by this much, so the wait never times out


def load_next_shard(seconds: float) -> None:
    """Stand-in for slow work outside any collective (I/O, a data-loader stall, a checkpoint write)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.1)  # short sleeps: a stack sample taken at any moment lands here


def run(args: argparse.Namespace) -> None:
    """The body of one rank; expects the torchrun environment (RANK, WORLD_SIZE, MASTER_ADDR, ...)."""
    timeout = timedelta(seconds=max(120, args.hang_seconds + TIMEOUT_MARGIN_S))
    dist.init_process_group(backend="gloo", timeout=timeout)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    culprit = world_size - 1 if args.culprit is None else args.culprit
    if not 0 <= culprit < world_size:
        raise SystemExit(f"--culprit {culprit} is not a rank of this {world_size}-rank job")

    grad = torch.ones(1024)
    for _ in range(GOOD_STEPS):
        dist.all_reduce(grad)
    if rank == 0:
        print(f"{GOOD_STEPS} all-reduces done; rank {culprit} now leaves for {args.hang_seconds}s", flush=True)

    if rank == culprit:
        load_next_shard(args.hang_seconds)
    start = time.monotonic()
    dist.all_reduce(grad)  # the others wait here for the culprit
    waited = time.monotonic() - start
    # One write per line, so the ranks' lines do not interleave on a shared terminal.
    print(f"rank {rank}: all_reduce after the hang returned in {waited:.1f}s\n", end="", flush=True)

    dist.barrier()
    dist.destroy_process_group()


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nproc", type=int, default=None, help="spawn this many ranks (without torchrun)")
    parser.add_argument("--culprit", type=int, default=None, help="the rank that goes missing (default: last)")
    parser.add_argument("--hang-seconds", type=float, default=20.0, help="how long the culprit stays away")
    return parser.parse_args(argv)


if __name__ == "__main__":
    launch(run, parse_args())
