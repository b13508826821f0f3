"""What the live windows cost (issue 36): the recorder's overhead with windows on, the gatherer's time at 1,024
ranks and the store traffic per window. Figures only, against baselines measured in the same run.

a) cost: a DDP step (examples/ddp_train.py's model, which also all-reduces its loss at each step, as training
   loops do for logging: one call the patch layer records per step) at world size 2 (torch.multiprocessing),
   recorded with windows every 5 s. The window work of each watchdog tick is timed where it runs (record/
   window.py's ``tick``: reading the last second's records back, and at a window's end summarising,
   publishing, gathering and copying), in CPU time of the watchdog's thread. Its share of the run's wall time
   is the most the training threads can lose to it (they share the GIL): per tick plus per window, at the
   default cadence (60 s) and at 5 s. Target: <= 0.5 % of the step.
b) steps: the same DDP step in blocks, recorded with windows off, every 5 s and every 60 s
   (``enable()``/``disable()`` between blocks, in rotating order): each variant's step time against the blocks
   without windows next to it, the median ratio with its 95 % interval. The direct measurement, and noisier.
c) gather: 1,024 simulated ranks (2 processes of 512 store clients each: 128 hosts of 8 ranks, a default group
   and a node-local group each, rank 517 arriving 30 ms late) publish summaries of window.py's shape through
   record/gather.py's ``WindowExchange`` into a real TCPStore served by a process of its own; rank 0's
   exchange gathers each window: the time from its claim to the window published and copied into its folder.
   Target: <= 200 ms per window. Also the store traffic per window: bytes and calls of a rank, of the gatherer
   and of a copying rank.

On a GPU, the overhead with NCCL timing on is tests/gpu's (device_check.sh); not measured here.

    python benchmarks/bench_live.py                   # every part, a few minutes
    python benchmarks/bench_live.py --only gather     # one part: cost, steps or gather
    python benchmarks/bench_live.py --quick           # a smoke run
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

from bench_record import DDP_SCRIPT, bootstrap_interval, free_port

OVERHEAD_TARGET_PCT = 0.5
GATHER_TARGET_MS = 200.0
DEFAULT_EVERY_S = 60.0
SHORT_EVERY_S = 5.0


# --- the DDP step ---------------------------------------------------------------------------------------------


def _ddp(rank: int, world_size: int, port: int) -> tuple[Callable[[], None], Any]:
    """Set up one rank of the DDP job; returns its step (DDP's backward, the optimizer, the loss all-reduced)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    sys.path.insert(0, str(DDP_SCRIPT.parent))
    from ddp_train import Net, train_step

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=120))
    model = DistributedDataParallel(Net())
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(rank)
    batches = [(torch.randn(64, 1, 28, 28, generator=gen), torch.randint(0, 10, (64,), generator=gen))
               for _ in range(8)]
    state = {"i": 0}

    def step() -> None:
        x, y = batches[state["i"] % len(batches)]
        state["i"] += 1
        loss = train_step(model, optimizer, x, y)
        dist.all_reduce(loss)  # the loss averaged for logging: recorded by the patch layer

    return step, dist


# --- a) cost of the window work, where it runs -----------------------------------------------------------------


def cost_rank(rank: int, world_size: int, port: int, seconds: float, work_dir: str) -> None:
    from comm2perfetto.record.window import WindowSummaries

    ticks: list[tuple[int, bool]] = []  # (CPU ns of the tick's window work, whether a window ended in it)
    original = WindowSummaries.tick

    def timed_tick(self: WindowSummaries) -> None:
        window = self._window
        start = time.thread_time_ns()
        original(self)
        ticks.append((time.thread_time_ns() - start, self._window != window))

    WindowSummaries.tick = timed_tick  # type: ignore[method-assign]
    step, dist = _ddp(rank, world_size, port)
    import comm2perfetto

    for _ in range(20):
        step()
    comm2perfetto.enable(str(Path(work_dir) / "cost"), live_every=SHORT_EVERY_S)
    dist.barrier()
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        step()
        steps += 1
    elapsed = time.perf_counter() - start
    comm2perfetto.disable()
    dist.destroy_process_group()
    with open(Path(work_dir) / "cost" / f"rank{rank}.events.jsonl", "rb") as f:
        lines = sum(1 for line in f if line.startswith((b'["b"', b'["e"', b'["p"')))
    (Path(work_dir) / f"cost.{rank}.json").write_text(json.dumps(
        {"ticks": ticks, "elapsed_s": elapsed, "step_ms": elapsed / steps * 1e3, "records": lines}))


def measure_cost(seconds: float) -> None:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="c2p-bench-live-") as work_dir:
        mp.spawn(cost_rank, args=(2, free_port(), seconds, work_dir), nprocs=2)
        results = [json.loads((Path(work_dir) / f"cost.{rank}.json").read_text()) for rank in (0, 1)]
    print(f"a) window work on the watchdog's thread, DDP step + loss all-reduce, 2 ranks, {seconds:g} s at "
          f"{SHORT_EVERY_S:g} s windows (CPU time; rank 0 also gathers and copies):")
    for rank, result in enumerate(results):
        plain = [ns for ns, closed in result["ticks"] if not closed]
        closing = [ns for ns, closed in result["ticks"] if closed]
        if not plain or not closing:
            print(f"  rank {rank}: {len(plain)} ticks, {len(closing)} windows: run longer (--cost-seconds)")
            continue
        tick_us = statistics.fmean(plain) / 1e3
        close_ms = (statistics.fmean(closing) - statistics.fmean(plain)) / 1e6
        ticks_per_s = len(result["ticks"]) / result["elapsed_s"]
        per_record = sum(ns for ns, _ in result["ticks"]) / 1e3 / result["records"]
        print(f"  rank {rank}: step {result['step_ms']:.2f} ms; a tick {tick_us:.0f} us "
              f"({ticks_per_s:.2f} ticks/s), a window's end {close_ms:.2f} ms more ({len(closing)} windows); "
              f"{per_record:.1f} us per call or step record read ({result['records']} of them)")
        for every in (DEFAULT_EVERY_S, SHORT_EVERY_S):
            share = (ticks_per_s * tick_us / 1e6 + close_ms / 1e3 / every) * 100
            verdict = "ok" if share <= OVERHEAD_TARGET_PCT else "OVER TARGET"
            print(f"    windows every {every:g} s: {share:.3f} % of wall time at most "
                  f"(target <= {OVERHEAD_TARGET_PCT:g} %): {verdict}")


# --- b) step time in blocks ------------------------------------------------------------------------------------

VARIANTS = {"off": None, "every 5 s": SHORT_EVERY_S, "every 60 s": DEFAULT_EVERY_S}


def steps_rank(rank: int, world_size: int, port: int, rounds: int, block_s: float, work_dir: str) -> None:
    step, dist = _ddp(rank, world_size, port)
    import torch

    import comm2perfetto

    for _ in range(20):
        step()
    names = list(VARIANTS)
    means: dict[str, list[float]] = {name: [] for name in names}
    flag = torch.zeros(1)
    for round_no in range(rounds):
        shift = round_no % len(names)
        for name in names[shift:] + names[:shift]:
            comm2perfetto.enable(str(Path(work_dir) / f"r{round_no}-{name.replace(' ', '')}"), stall_after=None,
                                 live_every=VARIANTS[name])
            for _ in range(5):
                step()
            dist.barrier()
            steps, start = 0, time.perf_counter()
            while True:  # until block_s passed on rank 0: the ranks stop together
                step()
                steps += 1
                flag[0] = float(time.perf_counter() - start >= block_s)
                dist.broadcast(flag, 0)
                if flag[0]:
                    break
            means[name].append((time.perf_counter() - start) / steps * 1e3)
            comm2perfetto.disable()
    dist.destroy_process_group()
    (Path(work_dir) / f"steps.{rank}.json").write_text(json.dumps(means))


def measure_steps(rounds: int, block_s: float) -> None:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="c2p-bench-live-") as work_dir:
        mp.spawn(steps_rank, args=(2, free_port(), rounds, block_s, work_dir), nprocs=2)
        means = json.loads((Path(work_dir) / "steps.0.json").read_text())
    print(f"b) DDP step time in blocks of {block_s:g} s, {rounds} rounds, 2 ranks (rank 0's):")
    for name, values in means.items():
        print(f"  {name:>10}: median {statistics.median(values):.3f} ms (min {min(values):.3f}, "
              f"max {max(values):.3f})")
    for name in ("every 5 s", "every 60 s"):
        ratios = [v / off for v, off in zip(means[name], means["off"])]
        low, high = ((r - 1) * 100 for r in bootstrap_interval(ratios))
        print(f"  {name} against off: {(statistics.median(ratios) - 1) * 100:+.2f} % (95 % interval {low:+.2f} % "
              f"to {high:+.2f} %; target <= {OVERHEAD_TARGET_PCT:g} %)")


# --- c) the gatherer at 1,024 ranks ------------------------------------------------------------------------------

RANKS_PER_HOST = 8
LATE_RANK = 517


def summary(rank: int, window: int, every_s: float, late_ms: float, folder: str) -> bytes:
    """A rank's published summary of window.py's shape: a default group and its host's tensor-parallel group,
    32 sampled arrivals each (window.MAX_ARRIVALS), three ops."""
    import orjson

    t0 = window * round(every_s * 1e9)
    host = rank // RANKS_PER_HOST
    ops = {"all_reduce": {"n": 640, "bytes": 640 * 4096, "time_ns": 812_345_678, "timed": 640},
           "all_gather_into_tensor": {"n": 320, "bytes": 320 * 65536, "time_ns": 401_234_567, "timed": 320},
           "reduce_scatter_tensor": {"n": 320, "bytes": 320 * 524288, "time_ns": 612_345_678, "timed": 320}}

    def arrivals(spacing_us: int) -> dict[str, list[int]]:
        return {"seqs": [seq * 4 for seq in range(1, 33)],
                "arrivals_us": [seq * spacing_us + int(late_ms * 1000) + (rank * 7919) % 300 for seq in range(1, 33)]}

    doc = {"steps": 12, "step_ns": 410_000_000, "exposed_ns": None, "rank": rank, "host": f"node{host:03d}",
           "folder": folder, "window": window, "t0_ns": t0, "t1_ns": t0 + round(every_s * 1e9),
           "clock_rtt_ns": 180_000, "pid": 10_000 + rank,
           "groups": {"0": {"issued": 640, "ops": {"all_reduce": ops["all_reduce"]}, "stride": 4,
                            **arrivals(60_000), "desc": "default_pg", "ranks_span": [0, 1024]},
                      str(1 + host): {"issued": 640, "stride": 4, **arrivals(50_000), "desc": "mesh_tp",
                                      "ops": {k: ops[k] for k in ("all_gather_into_tensor", "reduce_scatter_tensor")},
                                      "ranks_span": [host * RANKS_PER_HOST, (host + 1) * RANKS_PER_HOST]}}}
    return orjson.dumps(doc)


def serve_store(port: int, stop: Any) -> None:
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=300))
    stop.wait()
    del store


def client_ranks(port: int, ranks: Sequence[int], windows: int, every_s: float, folder: str, go: Any,
                 done: Any) -> None:
    """``ranks``' store clients (one connection each); at each ``go`` every one publishes its window."""
    from types import SimpleNamespace

    import torch.distributed as dist

    from comm2perfetto.record.gather import WindowExchange

    def connect(rank: int) -> WindowExchange:
        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=300))
        return WindowExchange(SimpleNamespace(rank=rank), store, 1024, every_s, folder,
                              f"node{rank // RANKS_PER_HOST:03d}")

    # In parallel: now and then a connection to the server takes 5 s (seen here), which in turn would add up.
    with ThreadPoolExecutor(64) as pool:
        exchanges = list(pool.map(connect, ranks))
    for window in range(1, windows + 1):
        go.wait()
        for ex in exchanges:
            late = 30.0 if ex._rec.rank == LATE_RANK else 0.0
            ex.publish(window, summary(ex._rec.rank, window, every_s, late, folder))
        done.wait()


class CountingStore:
    """A store that counts the calls made through it, their time and the bytes that went each way."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.calls: dict[str, int] = {}
        self.sent = self.received = 0
        self.seconds = 0.0

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self.store, name)

        def call(*args: Any) -> Any:
            self.calls[name] = self.calls.get(name, 0) + 1
            self.sent += sum(len(a) for a in args[1:2] if isinstance(a, (bytes, str)))
            start = time.perf_counter()
            result = method(*args)
            self.seconds += time.perf_counter() - start
            if isinstance(result, bytes):
                self.received += len(result)
            elif isinstance(result, list):
                self.received += sum(len(r) for r in result if isinstance(r, bytes))
            return result

        return call


def measure_gather(windows: int, processes: int) -> None:
    import orjson
    import torch.distributed as dist

    from comm2perfetto import layout
    from comm2perfetto.record import gather
    from comm2perfetto.record.gather import WindowExchange

    world = 1024
    ctx = multiprocessing.get_context("spawn")
    port = free_port()
    stop = ctx.Event()
    server = ctx.Process(target=serve_store, args=(port, stop))
    server.start()
    time.sleep(1.0)
    go, done = ctx.Barrier(processes + 1), ctx.Barrier(processes + 1)
    per = (world - 1) // processes + 1
    times_ms: list[float] = []
    cpu_ms: list[float] = []
    store_ms: list[float] = []
    doc_ms: list[float] = []
    original, original_doc = WindowExchange._gather, gather.window_doc

    def timed_gather(self: WindowExchange, window: int) -> None:
        start, cpu, in_store = time.perf_counter(), time.thread_time(), store.seconds
        original(self, window)
        times_ms.append((time.perf_counter() - start) * 1e3)
        cpu_ms.append((time.thread_time() - cpu) * 1e3)
        store_ms.append((store.seconds - in_store) * 1e3)

    def timed_doc(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        result = original_doc(*args, **kwargs)
        doc_ms.append((time.perf_counter() - start) * 1e3)
        return result

    WindowExchange._gather = timed_gather  # type: ignore[method-assign]
    gather.window_doc = timed_doc
    events = []
    with tempfile.TemporaryDirectory(prefix="c2p-bench-gather-") as folder:
        from types import SimpleNamespace

        clients = [ctx.Process(target=client_ranks, args=(port, range(max(1, i * per), min(world, (i + 1) * per)),
                                                          windows, DEFAULT_EVERY_S, folder, go, done))
                   for i in range(processes)]
        for c in clients:
            c.start()
        store = CountingStore(dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=300)))
        rank0 = WindowExchange(SimpleNamespace(rank=0), store, world, DEFAULT_EVERY_S, folder, "node000")
        started = time.monotonic()
        for window in range(1, windows + 1):
            go.wait()  # every client connected (the first time) and ready to publish
            if window == 1:
                print(f"  ({world - 1} store clients connected in {time.monotonic() - started:.0f} s)", flush=True)
            rank0.publish(window, summary(0, window, DEFAULT_EVERY_S, 0.0, folder))
            deadline = time.monotonic() + 120
            while len(times_ms) < window and time.monotonic() < deadline:
                rank0.tick()
                time.sleep(0.01)
            done.wait()
            doc = orjson.loads((Path(folder) / layout.LIVE_WINDOW_FILE).read_bytes())
            events += doc["events"]
        all_bytes = len(store.store.get(gather.ALL_KEY.format(windows)))
        detail = len(doc["detail"])
        sizes = [len(summary(r, 1, DEFAULT_EVERY_S, 0.0, folder)) for r in range(world)]
        for c in clients:
            c.join()
    stop.set()
    server.join()
    print(f"c) the gatherer at {world} simulated ranks ({processes} processes of store clients, a real TCPStore in "
          f"its own process), {windows} windows:")
    print(f"  gather, per window: median {statistics.median(times_ms):.1f} ms (min {min(times_ms):.1f}, max "
          f"{max(times_ms):.1f}; target <= {GATHER_TARGET_MS:g} ms): "
          f"{'ok' if statistics.median(times_ms) <= GATHER_TARGET_MS else 'OVER TARGET'}; of which store calls "
          f"{statistics.median(store_ms):.1f} ms, matching and judging (window_doc) {statistics.median(doc_ms):.1f} ms;"
          f" the gathering thread's CPU time {statistics.median(cpu_ms):.1f} ms (wall time on a loaded machine is "
          f"longer: {machine_speed()})")
    print(f"  straggler events: {[(e['event'], e['rank'], e['group'], e['windows']) for e in events]}")
    calls = {k: v / windows for k, v in store.calls.items()}
    print(f"  store traffic per window: each rank sets {statistics.median(sizes) / 1024:.1f} KiB "
          f"({sum(sizes) / 2**20:.2f} MiB for the job) and makes 3 calls publishing, 1 check a tick while the "
          f"window is open, 1 add when it could take over; the gatherer reads {store.received / windows / 2**20:.2f}"
          f" MiB and writes {store.sent / windows / 1024:.0f} KiB in {sum(calls.values()):.0f} calls "
          f"({', '.join(f'{k} {v:.0f}' for k, v in sorted(calls.items()))}); the gathered window is "
          f"{all_bytes / 1024:.0f} KiB, which each copying rank (one per host and folder) reads, with its "
          f"{detail} ranks' summaries")


def machine_speed() -> str:
    """A reference to read the wall times by: how long plain Python takes here now (about 0.1 s on an idle
    recent x86 core)."""
    import timeit

    return f"sum(range(1000)) 10,000 times takes {timeit.timeit('sum(range(1000))', number=10_000):.2f} s here now"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=["cost", "steps", "gather"])
    parser.add_argument("--quick", action="store_true", help="a smoke run: short and few")
    parser.add_argument("--cost-seconds", type=float, default=40.0)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--block-seconds", type=float, default=8.0)
    parser.add_argument("--windows", type=int, default=5)
    parser.add_argument("--processes", type=int, default=2, help="processes holding the store clients")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.quick:
        args.cost_seconds, args.rounds, args.block_seconds, args.windows = 12.0, 1, 3.0, 2
    if args.only in (None, "cost"):
        measure_cost(args.cost_seconds)
    if args.only in (None, "steps"):
        measure_steps(args.rounds, args.block_seconds)
    if args.only in (None, "gather"):
        measure_gather(args.windows, args.processes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
