"""What the recorder's watchdog costs per tick when it looks for unfinished NCCL work in a full Flight Recorder ring.

The watchdog wakes every second. Before issue 26 it read NCCL's "only active" entries at every tick
(``_dump_nccl_trace_json(True, True)``); the ops of batched send/recv never leave that list (no CUDA events), so on
a pipeline's ring every tick copied, encoded and parsed thousands of entries: on an H200 (torch 2.11, 13,333 such
entries of a 20,000-entry ring) 265 ms of JSON and 400-530 ms for the whole ``unfinished()``, every second. Now a
tick reads the groups' status only (``includeCollectives=False``) and the whole ring is read once the status has
stood still for the stall threshold.

Without a GPU the same C++ code is driven through gloo's Flight Recorder, whose entries are never marked
completed: every entry of its ring is "only active", as every op of a batched send/recv is on NCCL. Measured in
one process, against the old per-tick read in the same run (figures only; nothing here asserts a timing):

  before  one tick as before: the "only active" JSON of the whole ring, parsed, scanned per counter
  after   one tick now: ``FlightRecorderDumps.unfinished`` with the status unchanged (no ring read)
  ring    the read made once the status stood still: the whole ring as a pickle, unpickled, and
          ``nccl_unfinished`` over it (also on a synthetic ring of batched send/recv, the pipeline's shape)

    python benchmarks/bench_watchdog_tick.py             # a 20,000-entry ring
    python benchmarks/bench_watchdog_tick.py --ring 2000 --reps 5
"""

from __future__ import annotations

import argparse
import os
import pickle
import socket
import statistics
import time
from collections.abc import Callable


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _median_ms(fn: Callable[[], object], reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t0)
    return statistics.median(times) / 1e6


def _old_tick(json_dump: Callable[[bool, bool], bytes]) -> dict:
    """The per-tick NCCL read of the watchdog before issue 26 (record/flight.py at e8a0b6b)."""
    import orjson

    out: dict = {}
    for entry in orjson.loads(json_dump(True, True)).get("entries", []):
        p2p = bool(entry.get("is_p2p"))
        seq = entry.get("p2p_seq_id" if p2p else "collective_seq_id")
        if isinstance(seq, int):
            key = ("fr-nccl", str(entry.get("pg_id")), "p2p" if p2p else "coll")
            out[key] = min(out.get(key, seq), seq)
    return out


def _pipeline_ring(size: int) -> list[dict]:
    """Entries shaped like an NCCL ring of batched send/recv (seen on an H200, torch 2.11): per batch a send and
    a recv that stay scheduled, then the closing ``nccl:coalesced`` entry with the batch's state."""
    entries = []
    for i in range(size):
        batch, part = divmod(i, 3)
        name = ("nccl:send 0->1", "nccl:recv 0<-1", "nccl:coalesced")[part]
        entries.append({
            "record_id": i, "pg_id": 0, "process_group": ("0", "default_pg"), "collective_seq_id": 7,
            "p2p_seq_id": batch + 1, "op_id": 2 * batch + min(part, 1) + 1, "profiling_name": name,
            "time_created_ns": 1795726348629307321 + i * 1000, "input_sizes": [[64]] if part < 2 else [],
            "input_dtypes": ["Float"] if part < 2 else [], "output_sizes": [[64]] if part < 2 else [],
            "output_dtypes": ["Float"] if part < 2 else [], "state": "scheduled" if part < 2 else "completed",
            "time_discovered_started_ns": None, "time_discovered_completed_ns": None if part < 2 else 1,
            "retired": part == 2, "timeout_ms": 600000, "is_p2p": part < 2, "thread_id": "1",
            "thread_name": "MainThread"})
    return entries


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ring", type=int, default=20000)
    p.add_argument("--reps", type=int, default=7)
    args = p.parse_args()

    os.environ.update(TORCH_FR_BUFFER_SIZE=str(args.ring), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()),
                      RANK="0", WORLD_SIZE="1")
    import torch
    import torch._C._distributed_c10d as c10d_C
    import torch.distributed as dist

    from comm2perfetto.record.flight import FlightRecorderDumps, nccl_unfinished

    dist.init_process_group("gloo")
    x = torch.ones(1)
    for _ in range(args.ring + 100):
        dist.all_reduce(x)
    json_dump, pickle_dump = c10d_C._dump_fr_trace_json, c10d_C._dump_fr_trace
    active = len(pickle.loads(pickle_dump(True, False, True))["entries"])

    dumps = FlightRecorderDumps(recorder=None, out_dir=".", buffer_size=args.ring)
    dumps._generic_json, dumps._nccl_json, dumps._nccl = None, json_dump, pickle_dump
    dumps._uses_nccl = lambda: True  # gloo's recorder stands in for NCCL's
    quiet_ns = 60 * 10**9
    dumps.unfinished(quiet_ns)  # the first tick notes the status

    before = _median_ms(lambda: _old_tick(json_dump), args.reps)
    after = _median_ms(lambda: dumps.unfinished(quiet_ns), args.reps * 20)
    ring = _median_ms(lambda: nccl_unfinished(pickle.loads(pickle_dump(True, False, False))["entries"]), args.reps)
    synthetic = pickle.dumps({"entries": _pipeline_ring(args.ring)})
    shaped = _median_ms(lambda: nccl_unfinished(pickle.loads(synthetic)["entries"]), args.reps)
    dist.destroy_process_group()

    print(f"torch {torch.__version__}, gloo Flight Recorder ring of {args.ring:,} entries, {active:,} of them "
          f"'only active'")
    print(f"  before: one tick read the 'only active' JSON      {before:9.3f} ms")
    print(f"  after:  one tick reads the status only            {after:9.3f} ms   ({before / after:,.0f}x less)")
    print(f"  once the status stood still for the threshold:    {ring:9.3f} ms   (whole ring, pickle)")
    print(f"    Python part on a pipeline-shaped NCCL ring:     {shaped:9.3f} ms   (unpickle + nccl_unfinished)")


if __name__ == "__main__":
    main()
