"""What recording costs an NCCL job, measured on and off in one process (world size 1, one GPU).

Run directly (``python tests/gpu/jobs/costs.py --out DIR --json FILE``), not under ``record``: it switches
recording on itself (``comm2perfetto.enable()`` before ``init_process_group``, as a user would) and compares,
in the same process, with the same group:

A. per call: ``dist.all_reduce`` of a 1-float tensor, torch's own function against the recorder's wrapper,
   in interleaved blocks (benchmarks/bench_record.py's method, part a), there on gloo);
B. Flight Recorder with a full ring (the recorder's 20,000 entries): the wall time of the recorder's periodic
   dump (no stacks) and stall dump (with stacks), of torch's raw dumps, of the "only active" JSON the watchdog
   read every tick before issue 26's fix, and of the watchdog's reads now (a tick: the groups' status only; the
   whole ring, once the status stood still for the threshold); for each, the longest gap a 1 ms ticker thread
   saw meanwhile: how long it held the GIL; then the same once the ring is full of batched self send/recv (GPU
   only): Flight Recorder's entries for the ops inside a batch carry no events and are never retired, so "only
   active" returns all of them;
C. after ``disable()``: DDP steps on two new groups, one created with ``TORCH_NCCL_ENABLE_TIMING=1`` and one
   with ``=0`` (ProcessGroupNCCL reads it in its constructor), in alternating blocks: the step-time cost of
   NCCL's timing events. Flight Recorder's entries of each group show whether timing took effect.

Figures only; nothing here asserts a timing. On the CPU (``C2P_GPU_CHECK_CPU=1``) the same code runs on gloo
with fewer calls, to exercise the plumbing.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import socket
import statistics
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def orjson_loads(data: bytes) -> dict:
    import orjson

    return orjson.loads(data)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Ticker:
    """A thread that sleeps 1 ms at a time and notes when it woke late: a gap of G ms means some other thread
    held the GIL for about G - 1 ms."""

    def __init__(self) -> None:
        self.samples: list[tuple[int, int]] = []  # (start ns, gap ns)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="gil-ticker")

    def _run(self) -> None:
        clock = time.perf_counter_ns
        while not self._stop.is_set():
            t = clock()
            time.sleep(0.001)
            self.samples.append((t, clock() - t))

    def __enter__(self) -> Ticker:
        self._thread.start()
        time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        time.sleep(0.02)
        self._stop.set()
        self._thread.join()

    def max_gap_ms(self, t0: int, t1: int) -> float | None:
        gaps = [g for t, g in self.samples if t + g >= t0 and t <= t1]
        return max(gaps) / 1e6 if gaps else None  # None: the call was shorter than a tick


def timed(fn, ticker: Ticker) -> tuple[float, float, object]:
    t0 = time.perf_counter_ns()
    value = fn()
    t1 = time.perf_counter_ns()
    return (t1 - t0) / 1e6, ticker.max_gap_ms(t0, t1), value


def per_call(fn, arg, n: int, out: list[int]) -> None:
    clock, append = time.perf_counter_ns, out.append
    for _ in range(n):
        t = clock()
        fn(arg)
        append(clock() - t)


def watchdog_ticks(flight, rows: list, ticker: Ticker, ring: str) -> None:
    """The watchdog's NCCL reads now: a tick (``unfinished`` with the default 60 s threshold, the groups'
    status unchanged since the call before: no entry is read), and the whole-ring read made once the status has
    stood still for the threshold (pickle without stacks, unpickled, batches decided by their closing entry)."""
    import pickle

    from comm2perfetto.record.flight import nccl_unfinished

    quiet_ns = 60 * 10**9
    flight.unfinished(quiet_ns)
    for i in range(5):
        wall, gap, _ = timed(lambda: flight.unfinished(quiet_ns), ticker)
        rows.append({"what": f"watchdog tick now: unfinished(), status unchanged ({ring})", "rep": i + 1,
                     "wall_ms": wall, "max_tick_gap_ms": gap, "bytes": None})
    ring_dump = getattr(flight, "_nccl", None) or flight._generic  # gloo (dry run): its own ring
    for i in range(2):
        wall, gap, _ = timed(lambda: nccl_unfinished(pickle.loads(ring_dump(True, False, False))["entries"]), ticker)
        rows.append({"what": f"watchdog ring read once the status stood still ({ring})", "rep": i + 1,
                     "wall_ms": wall, "max_tick_gap_ms": gap, "bytes": None})


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, help="recording folder for the enabled phases")
    p.add_argument("--json", required=True, help="write the figures here")
    p.add_argument("--calls", type=int, default=2000, help="per variant, part A")
    p.add_argument("--block", type=int, default=100)
    p.add_argument("--ring", type=int, default=20000)
    p.add_argument("--ddp-rounds", type=int, default=8)
    p.add_argument("--ddp-steps", type=int, default=50, help="steps per block, part C")
    args = p.parse_args()

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    import torch
    import torch.distributed as dist
    from common import CPU, info, setup, sync

    import comm2perfetto

    figures: dict[str, object] = {"torch": torch.__version__, "cpu_mode": CPU}
    if not CPU:
        figures["gpu"] = torch.cuda.get_device_name(0)
        figures["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))

    def save() -> None:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2, default=str)

    original = dist.all_reduce
    original_batch = dist.batch_isend_irecv
    comm2perfetto.enable(args.out, fr_buffer=args.ring)  # before the group: ring size and NCCL timing apply
    rank, _, device = setup()
    recording = dist.all_reduce
    figures["patched"] = recording is not original
    tensor = torch.ones(1, device=device)

    # --- A. per call ---------------------------------------------------------------------------------------
    variants = {"torch": original, "recorded": recording}
    samples: dict[str, list[int]] = {k: [] for k in variants}
    block_medians: dict[str, list[float]] = {k: [] for k in variants}
    for fn in variants.values():
        per_call(fn, tensor, args.block * 2, [])  # warm-up (first recorded call interns its site and args)
    sync(device)
    for r in range(max(1, args.calls // args.block)):
        for name in (("torch", "recorded") if r % 2 == 0 else ("recorded", "torch")):
            ns: list[int] = []
            per_call(variants[name], tensor, args.block, ns)
            sync(device)
            samples[name] += ns
            block_medians[name].append(statistics.median(ns))
    a = {name: {"median_us": statistics.median(ns) / 1e3, "mean_us": statistics.fmean(ns) / 1e3, "calls": len(ns)}
         for name, ns in samples.items()}
    a["overhead_median_us"] = a["recorded"]["median_us"] - a["torch"]["median_us"]
    a["overhead_mean_us"] = a["recorded"]["mean_us"] - a["torch"]["mean_us"]
    paired = [r - t for r, t in zip(block_medians["recorded"], block_medians["torch"])]
    a["overhead_block_median_us"] = statistics.median(paired) / 1e3
    figures["per_call"] = a
    info(what="per_call", **{k: v for k, v in a.items() if not isinstance(v, dict)},
         torch_us=a["torch"]["median_us"], recorded_us=a["recorded"]["median_us"])
    save()

    # --- B. Flight Recorder dumps with a full ring ------------------------------------------------------------
    from comm2perfetto.record import session

    rec = session.active_recorder()
    c10d_C = torch._C._distributed_c10d
    nccl_dump = getattr(c10d_C, "_dump_nccl_trace", None) if not CPU else None
    nccl_json = getattr(c10d_C, "_dump_nccl_trace_json", None) if not CPU else None
    raw_dump = nccl_dump or c10d_C._dump_fr_trace
    raw_json = nccl_json or getattr(c10d_C, "_dump_fr_trace_json", None)
    fill = args.ring + 100
    t = time.perf_counter()
    per_call(original, tensor, fill, [])
    sync(device)
    fill_s = time.perf_counter() - t
    while rec is not None and rec.flight is not None and rec.flight.busy():  # the watchdog's periodic dump
        time.sleep(0.05)
    time.sleep(0.2)
    b: dict[str, object] = {"ring_filled_with": fill, "fill_s": fill_s,
                            "dump_fn": getattr(raw_dump, "__name__", str(raw_dump))}
    try:
        b["entries_in_ring"] = len(pickle.loads(raw_dump(True, False, False)).get("entries", []))
    except Exception as exc:
        b["entries_in_ring"] = f"{type(exc).__name__}: {exc}"
    measurements = []
    if rec is not None and rec.flight is not None:
        measurements += [("recorder periodic dump (no stacks)", lambda: rec.flight.dump("periodic"), 3),
                         ("recorder stall dump (with stacks)", lambda: rec.flight.dump("stall"), 2)]
    try:  # symbolising as the recorder does: without importing torch._inductor from the dumping thread
        from comm2perfetto.record.flight import no_inductor_import_on_this_thread as no_inductor
    except ImportError:
        import contextlib

        no_inductor = contextlib.nullcontext

    def with_stacks() -> bytes:
        with no_inductor():
            return raw_dump(True, True, False)

    measurements += [("raw dump, no stacks", lambda: raw_dump(True, False, False), 3),
                     ("raw dump, with stacks", with_stacks, 2)]
    if raw_json is not None:
        measurements.append(("watchdog tick read: json, only active", lambda: raw_json(True, True), 3))
    generic_json = getattr(c10d_C, "_dump_fr_trace_json", None)
    if generic_json is not None:
        measurements.append(("watchdog tick read: generic pg_status", lambda: generic_json(False), 3))
    def p2p_ring(b: dict, rows: list, ticker: Ticker) -> None:
        """B2: a ring of batched send/recv to itself (world size 1), as pipeline parallelism issues; then the
        watchdog's per-tick reads again."""
        send = torch.arange(64, dtype=torch.float32, device=device)
        recv = torch.zeros(64, device=device)
        t = time.perf_counter()
        works: list = []
        for _ in range(args.ring // 3 + 50):
            works = original_batch([dist.P2POp(dist.isend, send, rank), dist.P2POp(dist.irecv, recv, rank)])
        deadline = time.monotonic() + 20  # a hang here must not eat the step's time
        while not all(w.is_completed() for w in works) and time.monotonic() < deadline:
            time.sleep(0.01)
        b["p2p_fill_s"] = time.perf_counter() - t
        if not all(w.is_completed() for w in works):
            b["p2p_ring_error"] = "the batched self send/recv did not complete within 20 s"
            return
        time.sleep(0.3)
        active = orjson_loads(raw_json(True, True)).get("entries", [])
        b["p2p_ring_active_entries"] = len(active)
        b["p2p_ring_active_names"] = sorted({str(e.get("profiling_name")).split(" ")[0] for e in active})
        for i in range(2):  # what each tick read before issue 26's fix
            wall, gap, value = timed(lambda: raw_json(True, True), ticker)
            rows.append({"what": "watchdog tick read: json, only active (p2p ring)", "rep": i + 1, "wall_ms": wall,
                         "max_tick_gap_ms": gap, "bytes": len(value)})
        if rec is not None and rec.flight is not None:
            watchdog_ticks(rec.flight, rows, ticker, "p2p ring")
            value = rec.flight.unfinished(0)  # the ring read now: every batch's closing entry says completed
            b["p2p_ring_unfinished"] = {"/".join(k): v for k, v in value.items()} if isinstance(value, dict) \
                else value

    rows = []
    with Ticker() as ticker:
        time.sleep(0.1)
        idle = ticker.max_gap_ms(time.perf_counter_ns() - 90_000_000, time.perf_counter_ns())
        for label, fn, reps in measurements:
            for i in range(reps):
                try:
                    wall, gap, value = timed(fn, ticker)
                    size = len(value) if isinstance(value, (bytes, str)) else None
                    rows.append({"what": label, "rep": i + 1, "wall_ms": wall, "max_tick_gap_ms": gap, "bytes": size})
                except Exception as exc:
                    rows.append({"what": label, "rep": i + 1, "error": f"{type(exc).__name__}: {exc}"[:300]})
                time.sleep(0.05)
        if rec is not None and rec.flight is not None:
            watchdog_ticks(rec.flight, rows, ticker, "all_reduce ring")
        b["rows"] = rows
        figures["dumps"] = b
        save()
        if not CPU and raw_json is not None:
            try:
                p2p_ring(b, rows, ticker)
            except Exception as exc:
                b["p2p_ring_error"] = f"{type(exc).__name__}: {exc}"[:300]
    b["idle_max_tick_gap_ms"] = idle
    b["rows"] = rows
    figures["dumps"] = b
    for row in rows:
        info(what="dump", **{("kind" if k == "what" else k): v for k, v in row.items()})
    save()

    comm2perfetto.disable()

    # --- C. TORCH_NCCL_ENABLE_TIMING on and off ----------------------------------------------------------------
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    groups, models, opts = {}, {}, {}
    for label, value in (("timing_on", "1"), ("timing_off", "0")):
        os.environ["TORCH_NCCL_ENABLE_TIMING"] = value
        groups[label] = dist.new_group([0])
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                              nn.Linear(1024, 16)).to(device)
        models[label] = DistributedDataParallel(model, process_group=groups[label])
        opts[label] = torch.optim.SGD(models[label].parameters(), lr=0.001)
    batch = torch.randn(256, 1024, device=device)

    def steps(label: str, n: int) -> float:
        model, opt = models[label], opts[label]
        sync(device)
        t0 = time.perf_counter()
        for _ in range(n):
            opt.zero_grad()
            model(batch).sum().backward()
            opt.step()
        sync(device)
        return (time.perf_counter() - t0) * 1000 / n

    for label in models:
        steps(label, 10)  # warm-up
    block_ms: dict[str, list[float]] = {k: [] for k in models}
    for r in range(args.ddp_rounds):
        for label in (("timing_on", "timing_off") if r % 2 == 0 else ("timing_off", "timing_on")):
            block_ms[label].append(steps(label, args.ddp_steps))
    c: dict[str, object] = {label: {"step_ms_median": statistics.median(v), "blocks": v}
                            for label, v in block_ms.items()}
    on, off = c["timing_on"]["step_ms_median"], c["timing_off"]["step_ms_median"]  # type: ignore[index]
    c["ratio_on_off"] = on / off if off else None
    ratios = [x / y for x, y in zip(block_ms["timing_on"], block_ms["timing_off"])]
    c["paired_ratio_median"] = statistics.median(ratios)
    if nccl_dump is not None:
        entries = pickle.loads(nccl_dump(True, False, False)).get("entries", [])
        for label, pg in groups.items():
            name = dist.distributed_c10d._get_process_group_name(pg)
            mine = [e for e in entries if (e.get("process_group") or ["?"])[0] == name]
            timed_n = sum(1 for e in mine if e.get("duration_ms") is not None)
            c[f"{label}_fr_entries"] = len(mine)
            c[f"{label}_fr_with_duration"] = timed_n
    figures["nccl_timing"] = c
    info(what="nccl_timing", on_ms=on, off_ms=off, ratio=c["ratio_on_off"], paired=c["paired_ratio_median"],
         **{k: v for k, v in c.items() if k.endswith(("_entries", "_duration"))})
    save()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
