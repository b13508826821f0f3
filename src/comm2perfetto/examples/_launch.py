"""Shared launcher of the examples: run under torchrun, or spawn ``--nproc N`` ranks here.

The examples import it from the package (``comm2perfetto.examples._launch``), so that each runs the same as a
module (``python -m comm2perfetto.examples.x``) from any install and as a script of a checkout.
"""

from __future__ import annotations

import argparse
import os
import socket
from collections.abc import Callable

import torch.multiprocessing as mp


def free_port() -> int:
    """A TCP port that was free a moment ago on localhost (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _spawned_rank(rank: int, world_size: int, port: int, body: Callable, args: argparse.Namespace) -> None:
    # The same environment torchrun gives a rank, so the body (and the recorder) cannot tell the difference.
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    body(args)


def launch(body: Callable[[argparse.Namespace], None], args: argparse.Namespace) -> None:
    """Run ``body(args)`` in this process (torchrun started it) or in ``args.nproc`` spawned ranks."""
    if args.nproc is None:
        body(args)
        return
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # as torchrun does: ranks share the cores
    mp.spawn(_spawned_rank, args=(args.nproc, free_port(), body, args), nprocs=args.nproc)
