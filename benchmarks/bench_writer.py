"""Trace writer micro-benchmark: µs per ``complete()`` slice and bytes per slice, on merge-like data.

Writes what ``comm2perfetto merge`` writes for a job: one process per rank with one slice track, one slice per
collective per rank with 10 args (a few change per collective, the rest repeat), jittered CLOCK_REALTIME
times, and one flow per collective through every rank (start on rank 0, steps, end on the last rank).
Args are built outside the timed calls; only the writer's calls and ``close()`` are timed::

    python benchmarks/bench_writer.py                        # 128 ranks x 2000 collectives, all writers
    python benchmarks/bench_writer.py --ranks 1024           # the 2M-slice merge
    python benchmarks/bench_writer.py --levels 1 3 5 6 9     # zlib levels for the compressed protobuf
    python benchmarks/bench_writer.py --order time --check   # collective-major order; decode and check

Each line: writer, µs per slice (wall time of the calls and close() / slices; CPU: all threads, compression
included), bytes of file per slice, file size.

Measured on the development VM (2 vCPUs, Python 3.11), 1024 ranks x 2000 collectives, rank-major:

    protobuf, uncompressed      3.86 us/slice (CPU 3.86)   131.8 B/slice   270.0 MB
    protobuf, zlib level 1      3.94 us/slice (CPU 4.58)    30.6 B/slice    62.6 MB
    protobuf, zlib level 5      3.89 us/slice (CPU 4.78)    24.6 B/slice    50.3 MB   <- the default
    protobuf, zlib level 6      3.94 us/slice (CPU 6.28)    24.4 B/slice    50.0 MB

Collective-major order compresses better (level 5: 18.0 B/slice, level 6: 17.6). Chrome JSON: 4.6-8 us and
~405 B/slice, gzipped ~30 B/slice. Of the ~3.9 us, ~0.8 us is the one arg whose value never repeats
(``arrival_skew_ns``); with every arg value seen before, complete() with 10 args costs ~2.4 us, ~2.8 us with
a flow id. Timings on that VM vary by +-20% from run to run.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from comm2perfetto.export.check import check_trace
from comm2perfetto.export.chrome_json import ChromeJsonWriter
from comm2perfetto.export.perfetto import ZLIB_LEVEL, PerfettoWriter

T0_NS = 1_795_313_447_000_000_000
STEP_NS = 2_000_000
TRACK_BASE = 1 << 20  # track uuids; processes are 1 + rank
OPS = ("all_reduce", "all_reduce", "broadcast", "all_gather")
SIZES = (16 << 20, 16 << 20, 4096, 1 << 20)

Event = tuple[int, int, int, str, dict[str, Any], tuple[int, ...], tuple[int, ...], tuple[int, ...]]


def events(ranks: int, collectives: int, order: str, seed: int = 1) -> Iterator[list[Event]]:
    """Batches of complete() calls: per rank (``order="rank"``) or per collective (``"time"``)."""
    rng = random.Random(seed)
    starts = [T0_NS + k * STEP_NS + rng.randrange(200_000) for k in range(collectives)]

    def skew(rank: int, k: int) -> int:  # arrival skew between ranks, the same whenever asked
        return (rank * 7919 + k * 104_729) * 2_654_435_761 % (1 << 32) % 50_000

    # A flow goes through the collective's slices in time order: from the first rank to arrive to the last.
    first = [min(range(ranks), key=lambda r, k=k: (skew(r, k), r)) for k in range(collectives)]
    last = [max(range(ranks), key=lambda r, k=k: (skew(r, k), -r)) for k in range(collectives)]

    def one(rank: int, k: int) -> Event:
        ts = starts[k] + skew(rank, k)
        dur = 900_000 + rng.randrange(100_000)
        op = OPS[k % len(OPS)]
        size = SIZES[k % len(SIZES)]
        args = {"seq": k, "pg": "default_pg", "op": op, "bytes": size, "dtype": "BFloat16", "state": "completed",
                "input_sizes": f"[[{size // 2}]]", "group_size": ranks, "record_id": k + 7,
                "arrival_skew_ns": ts - starts[k]}
        flow = (k + 1,)
        start, step, end = (flow, (), ()) if rank == first[k] else ((), (), flow) if rank == last[k] \
            else ((), flow, ())
        return (TRACK_BASE + rank, ts, dur, op, args, start, step, end)

    if order == "rank":
        for rank in range(ranks):
            yield [one(rank, k) for k in range(collectives)]
    else:
        for k in range(collectives):
            yield [one(rank, k) for rank in range(ranks)]


def write(make: Callable[[str], Any], path: str, ranks: int, collectives: int,
          order: str) -> tuple[float, float, Any]:
    """(wall s, CPU s of every thread, WriteStats) of the writer's calls."""
    writer = make(path)
    for rank in range(ranks):
        writer.process(1 + rank, pid=10_000 + rank, name=f"rank {rank}", sort_index=rank)
        writer.track(TRACK_BASE + rank, parent=1 + rank, name="default_pg", sort_index=0)
    spent = cpu = 0.0
    for batch in events(ranks, collectives, order):
        complete = writer.complete
        t0, c0 = time.perf_counter(), time.process_time()
        for track, ts, dur, name, args, start, step, end in batch:
            complete(track, ts, dur, name, args, category="collective", flow_start=start, flow_step=step,
                     flow_end=end)
        spent += time.perf_counter() - t0
        cpu += time.process_time() - c0
    t0, c0 = time.perf_counter(), time.process_time()
    stats = writer.close()
    spent += time.perf_counter() - t0
    cpu += time.process_time() - c0
    return spent, cpu, stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=128)
    parser.add_argument("--collectives", type=int, default=2000)
    parser.add_argument("--order", choices=("rank", "time"), default="rank")
    parser.add_argument("--levels", type=int, nargs="*", default=[ZLIB_LEVEL],
                        help="zlib levels to try for the compressed protobuf")
    parser.add_argument("--no-json", action="store_true", help="skip the Chrome JSON writers")
    parser.add_argument("--check", action="store_true", help="decode and check every file written")
    opts = parser.parse_args()

    slices = opts.ranks * opts.collectives
    print(f"{opts.ranks} ranks x {opts.collectives} collectives = {slices} slices, 10 args + 1 flow each, "
          f"{opts.order}-major; Python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    writers: list[tuple[str, str, Callable[[str], Any]]] = [
        ("protobuf, uncompressed", ".pftrace", lambda p: PerfettoWriter(p, compress=False))]
    writers += [(f"protobuf, zlib level {level}", ".pftrace",
                 lambda p, level=level: PerfettoWriter(p, zlib_level=level)) for level in opts.levels]
    if not opts.no_json:
        writers += [("Chrome JSON", ".json", lambda p: ChromeJsonWriter(p, time_origin_ns=T0_NS)),
                    ("Chrome JSON, gzip", ".json.gz", lambda p: ChromeJsonWriter(p, time_origin_ns=T0_NS))]
    with tempfile.TemporaryDirectory() as tmp:
        for label, suffix, make in writers:
            path = os.path.join(tmp, "trace" + suffix)
            spent, cpu, stats = write(make, path, opts.ranks, opts.collectives, opts.order)
            assert stats.slices == slices and stats.flows == opts.collectives, stats
            line = (f"{label:26s} {spent / slices * 1e6:5.2f} us/slice (CPU {cpu / slices * 1e6:5.2f})  "
                    f"{stats.bytes / slices:6.1f} B/slice  {stats.bytes / 1e6:7.1f} MB")
            if opts.check:
                t0 = time.perf_counter()
                trace = check_trace(path)
                assert sum(e.kind == "slice" for e in trace.events) == slices
                line += f"  checked in {time.perf_counter() - t0:.1f} s"
            print(line, flush=True)
            os.unlink(path)


if __name__ == "__main__":
    main()
