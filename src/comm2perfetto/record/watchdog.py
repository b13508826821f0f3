"""Stall detection and job-wide stack dumps through the job's c10d store.

A daemon thread per rank wakes every second. When one of this rank's recorded calls has been pending longer
than ``stall_after_s`` (or, for collectives issued from C++ that the patch layer never sees and async NCCL
work, Flight Recorder shows a group's first unfinished collective or send/recv unchanged for that long: on
NCCL, an unfinished operation on groups whose status has not changed for that long), the rank records the
stall, writes every thread's Python stack and a Flight Recorder dump, and publishes the stall in the store
(``comm2perfetto/stall/<n>``). Every other rank's watchdog sees the new generation and does the same,
whatever its main thread is doing: the rank everybody waits for is usually busy outside any collective
(loading data, stuck in compute), and its stack is the answer.

The job keeps running. Each pending call is reported once and a rank writes at most ``MAX_STALL_DUMPS`` stack
files, so a long hang does not fill the disk.

Store keys, under the job's default store::

    comm2perfetto/stall_gen        counter, incremented by each rank that detects a stall
    comm2perfetto/stall/<gen>      JSON: {"rank": 0, "op": "all_reduce", "seq": 12, "group": 0, "t_ns": ...}
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from typing import TYPE_CHECKING, Any

import orjson

from comm2perfetto import layout
from comm2perfetto.record import capture

if TYPE_CHECKING:
    from comm2perfetto.record.live import LiveVerdict
    from comm2perfetto.record.view import RecorderView
    from comm2perfetto.record.window import WindowSummaries

GEN_KEY = "comm2perfetto/stall_gen"
STALL_KEY = "comm2perfetto/stall/{}"
MAX_STALL_DUMPS = 5
HEARTBEAT_NS = 1_000_000_000  # an `h` record at most this often (docs/log-format.md)
JOIN_TIMEOUT_S = 5.0  # a tick takes milliseconds; a store call can wait longer, and exit must not hang on it


class Watchdog:
    def __init__(self, recorder: RecorderView, store: Any, stall_after_s: float | None, out_dir: str,
                 interval_s: float = 1.0, live: LiveVerdict | None = None,
                 windows: WindowSummaries | None = None) -> None:
        self._recorder = recorder
        self._store = store
        self._live = live if store is not None else None
        self._windows = windows
        # Stalls this rank detected whose trigger has not completed yet: cid, or the Flight Recorder item
        # ((kind, pg_id, counter), seq) for an operation the patch layer does not see -> its stall generation.
        self._open_stalls: dict[Any, int] = {}
        self._ended_fr: set[Any] = set()  # Flight Recorder stalls whose collective ended at the last look
        self._stall_ns = None if stall_after_s is None else int(stall_after_s * 1e9)
        self._out_dir = out_dir
        self._interval_s = min(interval_s, stall_after_s / 4) if stall_after_s else interval_s
        self._reported: set[int] = set()
        # Flight Recorder's first unfinished op per (dump kind, pg_id, counter) -> when first seen so.
        self._fr_first_seen: dict[tuple[tuple[str, str, str], int], int] = {}
        self._fr_reported: set[tuple[tuple[str, str, str], int]] = set()
        self._seen_gen = 0
        self._last_heartbeat_ns = 0
        self._dumps = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="comm2perfetto-watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, wait: bool = True) -> None:
        """Stop ticking. ``wait``: also wait (a few seconds at most) until a tick in progress has returned, so
        that at exit no recorder thread is left inside torch's C++ (a store or Flight Recorder call) while the
        interpreter finalises."""
        self._stop.set()
        if wait and self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(JOIN_TIMEOUT_S)
        if wait and self._windows is not None and not self._thread.is_alive():
            self._window_step(self._windows.close)  # the last, partial window into the log
        if wait and self._live is not None and not self._thread.is_alive():
            # A last look, as the rank stops: a stall whose call completed a moment ago is told resolved (the
            # ticks that would have said so do not come). Best effort: the store may be gone already.
            try:
                self._check_resolved(final=True)
                self._live.write_resolved()
            except Exception:
                pass

    def _run(self) -> None:
        from comm2perfetto.record import state

        while not self._stop.wait(self._interval_s):
            if state.recorder is not self._recorder:
                return
            try:
                self.tick()
            except Exception as exc:
                self._recorder.fault(exc)
                return

    def tick(self) -> None:
        rec = self._recorder
        now = time.time_ns()
        if now - self._last_heartbeat_ns >= HEARTBEAT_NS:
            # Tells a reader this rank was alive then: a log whose last heartbeat is old was not closed
            # because its process died, not because it still runs.
            self._last_heartbeat_ns = now
            rec.log.write(["h", now])
        if self._windows is not None:
            self._window_step(self._windows.tick)
        if capture.active:  # Flight Recorder's dumps and status query CUDA events: not during a capture
            return
        if rec.flight is not None:
            rec.flight.maybe_dump()
        if self._stall_ns is None:
            return
        stalled = False
        for record in rec.in_flight():
            cid, t_begin, op, gid, seq = record[1:6]  # the call's `b` record
            if now - t_begin > self._stall_ns:
                stalled = True
                if cid not in self._reported:
                    self._reported.add(cid)
                    self._on_local_stall(cid, op, gid, seq, t_begin, "pending")
                break
        if not stalled and rec.flight is not None:
            self._check_flight_recorder(now)
        if self._store is not None:
            self._check_remote()
        if self._live is not None:
            self._live_step(self._check_resolved)
        if self._live is not None:
            self._live_step(self._live.tick)

    def _live_step(self, step: Any) -> None:
        """Run one step of the live verdict. A failure there (the store gone, a full disk) turns the live
        verdict off with one warning; the stall detection and dumps, and training, go on."""
        try:
            step()
        except Exception as exc:
            self._live = None
            self._recorder.warn(f"live verdict off after an error: {type(exc).__name__}: {exc}"[:500])

    def _window_step(self, step: Any) -> None:
        """Run one step of the window summaries. A failure there (the store gone, a full disk) turns them off on
        this rank with one warning; the stall detection, the live verdict and training go on."""
        try:
            step()
        except Exception as exc:
            self._windows = None
            self._recorder.warn(f"live windows off after an error: {type(exc).__name__}: {exc}"[:500])

    def _check_resolved(self, final: bool = False) -> None:
        """Tell the live verdict when a stall this rank detected is over: its call completed. ``final``: the last
        look, as the rank stops (an uncaught exception has been seen by then, if one ends it)."""
        live = self._live
        if not self._open_stalls or live is None:
            return
        in_flight = {record[1] for record in self._recorder.in_flight()}
        fr_items = set(self._fr_first_seen)
        for trigger, gen in list(self._open_stalls.items()):
            if isinstance(trigger, int):
                if trigger not in in_flight:
                    del self._open_stalls[trigger]
                    if trigger not in self._recorder.failed_calls:  # a call that raised (a timeout) resolved nothing
                        live.resolved(gen)
            elif trigger not in fr_items:
                # A C++ collective (DDP's) that ended may have raised (gloo's timeout): the exception reaches
                # Python a moment later. Told a tick after it ended, unless an uncaught exception came first.
                if self._recorder.uncaught:
                    del self._open_stalls[trigger]
                elif final or trigger in self._ended_fr:
                    del self._open_stalls[trigger]
                    self._ended_fr.discard(trigger)
                    live.resolved(gen)
                else:
                    self._ended_fr.add(trigger)

    def _check_flight_recorder(self, now: int) -> None:
        """Stalls in operations the patch layer never sees, or sees return at enqueue (DDP's and FSDP's
        collectives, NCCL's async work): a group whose first unfinished collective, or send/recv, stays the
        same for longer than the threshold (on NCCL: since the groups' status last changed, see
        ``FlightRecorderDumps.unfinished``)."""
        flight = self._recorder.flight
        if flight is None or self._stall_ns is None:  # tick() asks only with both
            return
        unfinished = flight.unfinished(self._stall_ns)
        if unfinished is None:  # groups still changing: Flight Recorder is not read, nothing is concluded
            return
        watched = {(key, seq) for key, seq in unfinished.items()}
        for item in list(self._fr_first_seen):
            if item not in watched:  # it completed: the group moved on
                del self._fr_first_seen[item]
        for item in watched:
            since = self._fr_first_seen.setdefault(item, flight.since(*item) or now)
            if now - since > self._stall_ns and item not in self._fr_reported:
                self._fr_reported.add(item)
                (kind, pg_id, counter), seq = item
                found = flight.active_entry(kind, pg_id, seq, counter)
                if found is not None and counter == "coll" and self._recorder.completed_on_cpu(found[1], seq):
                    continue  # gloo's status lagging behind a call the patch layer saw return
                op, group = (found[0], found[2] or found[1]) if found is not None else ("collective", f"pg_id {pg_id}")
                self._on_local_stall(None, op, group, seq, since, "fr_pending", fr_item=item)
                break

    def _on_local_stall(self, cid: int | None, op: str, group: int | str, seq: int | None, t_begin: int,
                        reason: str, fr_item: Any = None) -> None:
        rec = self._recorder
        waited_s = (time.time_ns() - t_begin) / 1e9
        print(f"comm2perfetto: rank {rec.rank}: {op} (group {group}, seq {seq}) pending for {waited_s:.0f}s; "
              f"dumping stacks on every rank", file=sys.stderr, flush=True)
        gen = None
        if self._store is not None:
            latest = self._store.add(GEN_KEY, 0)
            if not self._joins(latest):  # a stall another rank detected and still open: this one is part of it
                info = {"rank": rec.rank, "op": op, "seq": seq, "group": group, "t_ns": time.time_ns()}
                latest = self._store.add(GEN_KEY, 1)
                self._store.set(STALL_KEY.format(latest), orjson.dumps(info))
            gen = latest
            self._seen_gen = max(self._seen_gen, gen)
        self._dump(reason, rec.rank, cid)
        # After the dump: the stall's own record and stacks come first, as every other rank's do.
        if gen is not None and self._live is not None:
            self._open_stalls[cid if cid is not None else fr_item] = gen
            self._live_step(lambda: self._live.on_stall(gen, self._fr_pending(), detected=True))

    def _joins(self, gen: int) -> bool:
        """With the live verdict on, a stall detected while generation ``gen`` is open joins it: one stall that
        several ranks detect is one generation, gathered once."""
        if self._live is None or gen <= 0 or gen in self._open_stalls.values():
            return False
        try:
            return self._live.still_open(gen)
        except Exception:  # the store gone: a generation of its own, as without the live verdict
            return False

    def _fr_pending(self) -> dict[str, dict]:
        """The collectives Flight Recorder shows unfinished, by group name, for the live verdict."""
        flight = self._recorder.flight
        out: dict[str, dict] = {}
        if flight is None:
            return out
        for ((kind, pg_id, counter), seq), since in self._fr_first_seen.items():
            if counter != "coll":  # the live verdict compares collective sequence numbers
                continue
            found = flight.active_entry(kind, pg_id, seq)
            if found is not None and not self._recorder.completed_on_cpu(found[1], seq):
                profiling_name, name, desc = found
                op = profiling_name.partition(":")[2].split(" ")[0] or profiling_name
                out.setdefault(name, {"op": op, "seq": seq, "since_ns": since, "desc": desc})
        return out

    def _check_remote(self) -> None:
        gen = self._store.add(GEN_KEY, 0)
        if gen <= self._seen_gen:
            return
        trigger = None  # the details may not be published yet: dump all the same
        key = STALL_KEY.format(gen)
        if self._store.check([key]):
            trigger = orjson.loads(self._store.get(key)).get("rank")
        self._seen_gen = gen
        if trigger != self._recorder.rank:
            self._dump("remote", trigger, None)
            if self._live is not None:
                self._live_step(lambda: self._live.on_stall(gen, self._fr_pending()))

    def _dump(self, reason: str, trigger_rank: int | None, cid: int | None) -> None:
        rec = self._recorder
        rec.declare_all_groups()  # the log then names every group this rank created, in its creation order
        stacks_file = None
        if self._dumps < MAX_STALL_DUMPS:
            self._dumps += 1
            stacks_file = write_stacks(rec, self._out_dir, self._dumps, reason, trigger_rank)
        rec.log.write(["k", time.time_ns(), reason, trigger_rank, cid, stacks_file])
        rec.dump_flight_recorder("stall")


def write_stacks(rec: RecorderView, out_dir: str, n: int, reason: str, trigger_rank: int | None) -> str:
    """Write every thread's Python stack (innermost frame first) to ``rank<R>.stacks.<n>.json``."""
    names = {t.ident: t.name for t in threading.enumerate()}
    me = threading.get_ident()
    ours = os.path.dirname(__file__) + os.sep  # the recorder's own frames, named as co_filename names them
    threads = []
    for tid, frame in sys._current_frames().items():
        if tid == me:
            continue
        frames = [
            {"file": fs.filename, "line": fs.lineno, "func": fs.name}
            for fs in reversed(traceback.extract_stack(frame))
            if not fs.filename.startswith(ours)
        ]
        threads.append({"tid": tid, "name": names.get(tid, "?"), "frames": frames})
    pending = [  # each pending call's `b` record: cid, t, op, gid, seq ...
        {"cid": record[1], "op": record[3], "gid": record[4], "seq": record[5], "since_ns": record[2]}
        for record in rec.in_flight()
    ]
    doc = {
        "format": "comm2perfetto-stacks", "version": 1, "rank": rec.rank, "t_ns": time.time_ns(),
        "reason": reason, "trigger_rank": trigger_rank, "pending": pending, "threads": threads,
    }
    name = layout.stacks(rec.rank, n)
    layout.write_whole(os.path.join(out_dir, name), orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    return name
