"""An async all_reduce and a batch_isend_irecv held pending, for the recorder's stall detection.

On a GPU (world size 1): after two settling all_reduces and a warm-up send/recv exchange, a
``torch.cuda._sleep`` kernel holds the current stream for ``--hold`` seconds (calibrated here), and an async
all_reduce and a batch_isend_irecv (to itself) are issued behind it: NCCL enqueues them at once (their futures
complete at enqueue), their work waits for the kernel. The main thread polls ``is_completed()``, as a training
loop between steps would, so the recorder's watchdog runs. Once everything completed the job stays idle for
``--after`` seconds: a stall reported then would be a false one. On the CPU (gloo, world size 2) rank 1 joins
``--hold`` seconds late instead.

``--hold 0`` is the control: the same calls complete at once, and the idle time after them must show no stall.
At the end the job prints what the recorder's watchdog sees in Flight Recorder then (``unfinished()``, the
active entries): anything left there after every work completed is what a false stall would come from.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from common import CPU, info, setup, sync


def cycles_per_second(device: torch.device) -> float:
    """GPU clock cycles per second of ``torch.cuda._sleep``, measured with CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cycles = 50_000_000
    torch.cuda._sleep(1_000_000)  # warm-up: the kernel's first launch loads it
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return cycles / (start.elapsed_time(end) / 1000)


def watchdog_view() -> dict:
    """What the recorder's watchdog reads from Flight Recorder now: its ``unfinished()`` and the active entries."""
    import orjson

    from comm2perfetto.record import session

    rec = session.active_recorder()
    out: dict = {}
    if rec is None or rec.flight is None:
        return {"recorder": None}
    try:
        out["unfinished"] = {"/".join(k): v for k, v in (rec.flight.unfinished() or {}).items()}
    except Exception as exc:
        out["unfinished"] = f"{type(exc).__name__}: {exc}"
    import torch._C._distributed_c10d as c10d_C

    dump = getattr(c10d_C, "_dump_fr_trace_json" if CPU else "_dump_nccl_trace_json", None)
    try:
        active = orjson.loads(dump(True, True)).get("entries", []) if dump else []
        out["active"] = [(e.get("profiling_name"), e.get("state"), e.get("is_p2p"), e.get("collective_seq_id"),
                          e.get("p2p_seq_id"), e.get("retired")) for e in active][:12]
    except Exception as exc:
        out["active"] = f"{type(exc).__name__}: {exc}"
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--hold", type=float, default=6.0)
    p.add_argument("--after", type=float, default=3.5)
    p.add_argument("--no-p2p", action="store_true", help="the all_reduce alone (if send/recv to itself hangs)")
    args = p.parse_args()

    rank, world, device = setup()
    x = torch.ones(4, device=device)
    for _ in range(2):  # two collectives: the group has settled (recorder's FlightRecorderDumps.groups_settled)
        dist.all_reduce(x)
    sync(device)
    peer = (rank + 1) % world
    send = torch.arange(256, dtype=torch.float32, device=device)
    recv = torch.zeros(256, device=device)
    y = torch.ones(1024, device=device)
    if not args.no_p2p:
        # NCCL connects a pair's p2p channels at its first send/recv, inside ncclGroupEnd, and on the H200 run
        # that first batch_isend_irecv returned only once the held kernel had finished: a warm-up exchange, so
        # that the held batch below is enqueued at once and Flight Recorder shows it pending (the p2p counter)
        for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, send, peer), dist.P2POp(dist.irecv, recv, peer)]):
            w.wait()
        sync(device)
    if not CPU and args.hold > 0:
        rate = cycles_per_second(device)
        info(what="calibrated", cycles_per_s=rate)
        torch.cuda._sleep(int(args.hold * rate))
    elif rank == 1:
        time.sleep(args.hold)
    recv.zero_()
    info(what="issuing", hold_s=args.hold)
    t0 = time.monotonic()
    work = dist.all_reduce(y, async_op=True)
    t1 = time.monotonic()
    reqs = [] if args.no_p2p else dist.batch_isend_irecv([dist.P2POp(dist.isend, send, peer),
                                                          dist.P2POp(dist.irecv, recv, peer)])
    t2 = time.monotonic()
    # how long each call held the CPU: a batch that returns only after the hold is never pending in Flight
    # Recorder (its closing entry's CUDA events are recorded after ncclGroupEnd returns)
    info(what="issued", n_p2p_works=len(reqs), all_reduce_call_s=round(t1 - t0, 4), batch_call_s=round(t2 - t1, 4))
    works = [work, *reqs] if not CPU else [work]  # gloo's p2p works say completed only once waited for
    deadline = time.monotonic() + args.hold + 20
    while not all(w.is_completed() for w in works) and time.monotonic() < deadline:
        time.sleep(0.05)
    completed = all(w.is_completed() for w in works)
    info(what="completed" if completed else "not_completed")
    for w in [work, *reqs]:  # gloo's p2p works too: a work never waited for is pending to the recorder
        w.wait()
    sync(device)
    info(what="waited", p2p_ok=None if args.no_p2p else bool(torch.equal(recv.cpu(), send.cpu())),
         all_reduce_ok=bool(y[0].item() == world))
    time.sleep(args.after)  # idle, everything complete
    info(what="idle_done", **watchdog_view())
    dist.all_reduce(x)
    sync(device)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
