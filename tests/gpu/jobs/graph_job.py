"""A CUDA graph that captures all_reduces, then replays them: the recorder must touch no CUDA state meanwhile.

``--captured N`` all_reduces are captured (each after an ``add_(1)``, so the result after ``--replays R``
replays is ``1 + R * N`` at world size 1): enough to pass half of a small Flight Recorder ring
(``record --fr-buffer 64``), so a periodic dump is due while the capture is open; the capture also stays open
``--hold`` seconds (a CPU sleep, legal during a capture) so the watchdog ticks inside it. Under
``record --sync`` nothing may be synchronised during the capture either. Prints the capture's wall-clock
window and the replay result. On the CPU (no CUDA graphs) the same calls run uncaptured, to exercise the
driver's plumbing.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from common import CPU, info, setup, sync


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--captured", type=int, default=40)
    p.add_argument("--replays", type=int, default=5)
    p.add_argument("--hold", type=float, default=1.5)
    p.add_argument("--after", type=float, default=1.5)
    args = p.parse_args()

    _, _, device = setup()
    x = torch.ones(1024, device=device)
    for _ in range(3):  # warm-up outside the capture (torch.cuda.graph's docs: on a side stream)
        dist.all_reduce(x)
    sync(device)
    y = torch.ones(1024, device=device)
    graph = None
    t_begin = time.time_ns()
    if CPU:
        for _ in range(args.captured):
            y.add_(1)
            dist.all_reduce(y)
        time.sleep(args.hold)
    else:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                dist.all_reduce(x)
        torch.cuda.current_stream().wait_stream(side)
        sync(device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(args.captured):
                y.add_(1)
                dist.all_reduce(y)  # world size 1: the sum leaves y as it is
            time.sleep(args.hold)
    t_end = time.time_ns()
    info(what="captured", capture_begin_ns=t_begin, capture_end_ns=t_end, captured=args.captured)
    if graph is not None:
        y.fill_(1.0)
        for _ in range(args.replays):
            graph.replay()
        sync(device)
        expected = 1.0 + args.replays * args.captured  # world size 1
        info(what="replayed", value=float(y[0].item()), expected=expected, ok=float(y[0].item()) == expected)
    time.sleep(args.after)  # the watchdog's ticks after the capture: the periodic dump it had to skip
    dist.all_reduce(x)
    sync(device)
    info(what="done")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
