"""Trace writer micro-benchmark: µs per slice and bytes per slice, on merge-like data.

Writes what ``comm2perfetto merge`` writes for a job: one process per rank with one slice track, one slice per
collective per rank, jittered CLOCK_REALTIME times, and one flow per collective through every rank (from the
first rank to arrive to the last). As merge does (``--api events``, the default): per rank one ``events()``
call; each slice carries the collective's ``SharedArgs`` (9 args that every rank's slice repeats, and the
flow role: one object for all the middle ranks, one for the first, one for the last) and one arg of its own
whose value never repeats (``arrival_skew_ns``). ``--api complete``: one ``complete()`` call per slice with
the 10 args and the flow inline, as slices of other tracks are written. Events are built outside the timed
calls; only the writer's calls and ``close()`` are timed::

    python benchmarks/bench_writer.py                        # 128 ranks x 2000 collectives, all writers
    python benchmarks/bench_writer.py --ranks 1024           # the 2M-slice merge
    python benchmarks/bench_writer.py --levels 1 3 5 6 9     # zlib levels for the compressed protobuf
    python benchmarks/bench_writer.py --order time --check   # collective-major order; decode and check
    python benchmarks/bench_writer.py --api complete         # one complete() call per slice

Each line: writer, µs per slice (wall time of the calls and close() / slices; CPU: all threads, compression
included), bytes of file per slice, file size.

Measured on the development VM (2 vCPUs, Python 3.11, noisy: +-20% from run to run), 128 ranks x 2000
collectives, rank-major:

    events()      protobuf 2.4 us/slice uncompressed, 2.5 with zlib level 2 (CPU 3.0), 26.7 B/slice
    complete()    protobuf 4.5 us/slice uncompressed, 4.5 with zlib level 2 (CPU 4.9), 28.1 B/slice

With events(), a slice whose own arg's value was seen before costs about 0.7 us less (merge's lateness on
synthetic dumps). zlib levels (events(), CPU of every thread): 1 is 12% bigger for the same CPU as 2 (the
default), 5 is 8% smaller for 0.5 us more a slice, 6 9% smaller for 2.1 us more. Collective-major order
compresses better. Chrome JSON: 8-10 us and ~410 B/slice, gzipped ~30 B/slice.
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

from comm2perfetto.trace.check import check_trace
from comm2perfetto.trace.chrome_json import ChromeJsonWriter
from comm2perfetto.trace.perfetto import ZLIB_LEVEL, PerfettoWriter
from comm2perfetto.trace.sink import NO_FLOWS, EventItem, SharedArgs

T0_NS = 1_795_313_447_000_000_000
STEP_NS = 2_000_000
TRACK_BASE = 1 << 20  # track uuids; processes are 1 + rank
OPS = ("all_reduce", "all_reduce", "broadcast", "all_gather")
SIZES = (16 << 20, 16 << 20, 4096, 1 << 20)


def batches(ranks: int, collectives: int, order: str, seed: int = 1) -> Iterator[tuple[int, list[EventItem]]]:
    """(track, its events() items): per rank (``order="rank"``) or per collective and rank (``"time"``)."""
    rng = random.Random(seed)
    starts = [T0_NS + k * STEP_NS + rng.randrange(200_000) for k in range(collectives)]

    def skew(rank: int, k: int) -> int:  # arrival skew between ranks, the same whenever asked
        return (rank * 7919 + k * 104_729) * 2_654_435_761 % (1 << 32) % 50_000

    # A flow goes through the collective's slices in time order: from the first rank to arrive to the last.
    first = [min(range(ranks), key=lambda r, k=k: (skew(r, k), r)) for k in range(collectives)]
    last = [max(range(ranks), key=lambda r, k=k: (skew(r, k), -r)) for k in range(collectives)]
    shared = []  # per collective: its SharedArgs for the first rank, the middle ones and the last one
    for k in range(collectives):
        op, size = OPS[k % len(OPS)], SIZES[k % len(SIZES)]
        args = {"seq": k, "pg": "default_pg", "op": op, "bytes": size, "dtype": "BFloat16", "state": "completed",
                "input_sizes": f"[[{size // 2}]]", "group_size": ranks, "record_id": k + 7}
        ids = (k + 1,)
        shared.append((SharedArgs(args, flow_start=ids), SharedArgs(args, flow_step=ids),
                       SharedArgs(args, flow_end=ids)))

    def one(rank: int, k: int) -> EventItem:
        ts = starts[k] + skew(rank, k)
        role = 0 if rank == first[k] else 2 if rank == last[k] else 1
        return (ts, ts + 900_000 + rng.randrange(100_000), OPS[k % len(OPS)], {"arrival_skew_ns": ts - starts[k]},
                "collective", shared[k][role], NO_FLOWS)

    if order == "rank":
        for rank in range(ranks):
            yield TRACK_BASE + rank, [one(rank, k) for k in range(collectives)]
    else:
        for k in range(collectives):
            for rank in range(ranks):
                yield TRACK_BASE + rank, [one(rank, k)]


def _complete_calls(items: list[EventItem]) -> list[tuple]:
    """The complete() calls writing the same: (ts, dur, name, args, category, flow_start, flow_step, flow_end)."""
    return [(ts, end - ts, name, {**shared.args, **args}, category, *shared.flows)  # type: ignore[union-attr]
            for ts, end, name, args, category, shared, _ in items]


def write(make: Callable[[str], Any], path: str, ranks: int, collectives: int, order: str,
          api: str) -> tuple[float, float, Any]:
    """(wall s, CPU s of every thread, WriteStats) of the writer's calls."""
    writer = make(path)
    for rank in range(ranks):
        writer.process(1 + rank, pid=10_000 + rank, name=f"rank {rank}", sort_index=rank)
        writer.track(TRACK_BASE + rank, parent=1 + rank, name="default_pg", sort_index=0)
    spent = cpu = 0.0
    for track, items in batches(ranks, collectives, order):
        calls = _complete_calls(items) if api == "complete" else []
        complete = writer.complete
        t0, c0 = time.perf_counter(), time.process_time()
        if api == "events":
            writer.events(track, items)
        for ts, dur, name, args, category, flow_start, flow_step, flow_end in calls:
            complete(track, ts, dur, name, args, category=category, flow_start=flow_start, flow_step=flow_step,
                     flow_end=flow_end)
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
    parser.add_argument("--api", choices=("events", "complete"), default="events",
                        help="one events() call per rank, as merge writes (default), or complete() per slice")
    opts = parser.parse_args()

    slices = opts.ranks * opts.collectives
    print(f"{opts.ranks} ranks x {opts.collectives} collectives = {slices} slices, 10 args + 1 flow each, "
          f"{opts.order}-major, {opts.api}(); Python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
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
            spent, cpu, stats = write(make, path, opts.ranks, opts.collectives, opts.order, opts.api)
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
