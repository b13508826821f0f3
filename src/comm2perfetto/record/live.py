"""The live verdict's rank side: at a stall, every rank says where it is; one rank per node gathers the job.

When a stall is detected (by any rank: the watchdog's stall generation in the job's c10d store), each rank's
watchdog publishes a small summary of itself under ``comm2perfetto/live/<gen>/<rank>``: per process group, how
many collectives it has issued and the one it is waiting in, plus its main thread's Python stack. Rank 0
gathers every rank's summary (waiting at most ``GATHER_WAIT_S`` for ranks that do not answer) into one
snapshot, writes it into its output folder (``.live/stall.<gen>.json``) and publishes it under
``comm2perfetto/live/<gen>/all``; the first rank of every other node (``LOCAL_RANK`` 0) copies that snapshot into
its own folder. ``comm2perfetto record``, watching the folder, turns a snapshot into the verdict
(diagnose/live.py) while the job still hangs.

When the call that triggered a stall completes, the rank that detected it publishes
``comm2perfetto/live/<gen>/resolved``; the gatherers write ``.live/stall.<gen>.resolved.json``.

Everything runs on the watchdog thread, only after a stall was detected: nothing while the job is healthy.
Store traffic is bounded: one key per rank per stall (at most ``MAX_LIVE_STALLS`` stalls), a world-size read
by rank 0, one read per other node. A summary is a few KB at most (``MAX_FRAMES`` frames, ``MAX_GROUPS``
groups), so a snapshot stays proportional to the world size.

A rank summary::

    {"rank": 1, "host": "node07", "pid": 4242, "t_ns": 1795313447406614332, "step": 3,
     "groups": {"0": {"desc": "default_pg", "ranks": [0, 1], "issued": 3,
                      "pending": null, "last_op": "all_reduce"}},
     "stack": ["hang_missing_rank.py:36 load_next_shard", "hang_missing_rank.py:55 run", ...]}

``pending`` is ``{"op": "all_reduce", "seq": 4, "since_ns": ..., "source": "patch"}`` for a rank waiting in
a collective (``source`` ``fr`` for one only Flight Recorder sees, such as DDP's).
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

import orjson

from comm2perfetto import layout

if TYPE_CHECKING:
    from comm2perfetto.record.view import RecorderView

RANK_KEY = "comm2perfetto/live/{}/{}"
COUNT_KEY = "comm2perfetto/live/{}/count"
ALL_KEY = "comm2perfetto/live/{}/all"
RESOLVED_KEY = "comm2perfetto/live/{}/resolved"

GATHER_WAIT_S = 5.0  # how long rank 0 waits for ranks whose watchdog has not answered yet
MAX_LIVE_STALLS = 5  # stalls a job reports live; later ones are in the dumps as usual
MAX_FRAMES = 16
MAX_GROUPS = 64
MAX_TEXT = 200


def rank_summary(rec: RecorderView, fr_pending: dict[str, dict] | None = None) -> dict[str, Any]:
    """What this rank is doing now, for the live verdict: bounded in size whatever the job does."""
    groups: dict[str, dict[str, Any]] = {}
    for info in rec.groups()[:MAX_GROUPS]:
        issued = None
        if info.seq_counter is not None:
            try:
                issued = info.seq_counter() - info.p2p_consumed
            except Exception:  # a group destroyed meanwhile
                issued = None
        groups[info.name] = {"desc": info.desc[:MAX_TEXT], "ranks": info.ranks[:4096], "issued": issued,
                             "pending": None}
    for record in rec.in_flight():  # the patch layer's pending calls: cid, t, op, gid, seq ...
        _, _, t_begin, op, gid, seq = record[:6]
        if seq is None:
            continue
        name = rec.group_name(gid)
        entry = groups.get(name)
        if entry is not None and (entry["pending"] is None or seq < entry["pending"]["seq"]):
            entry["pending"] = {"op": op, "seq": seq, "since_ns": t_begin, "source": "patch"}
    for name, pending in (fr_pending or {}).items():
        entry = groups.setdefault(name, {"desc": pending.get("desc", ""), "ranks": [], "issued": None,
                                         "pending": None})
        if entry["pending"] is None:
            entry["pending"] = {k: pending[k] for k in ("op", "seq", "since_ns")} | {"source": "fr"}
    return {
        "rank": rec.rank, "host": socket.gethostname()[:MAX_TEXT], "pid": os.getpid(), "t_ns": time.time_ns(),
        "step": rec.steps.current, "groups": groups, "stack": main_stack(rec.internal_roots),
    }


def main_stack(internal: tuple[str, ...], limit: int = MAX_FRAMES) -> list[str]:
    """The main thread's Python stack, innermost first, as ``file:line func``, frames of torch and of the
    recorder left out (``internal``: their path prefixes), so the first line is where user code is."""
    frame = sys._current_frames().get(threading.main_thread().ident or -1)  # running, so it has an ident
    out: list[str] = []
    while frame is not None and len(out) < limit:
        code = frame.f_code
        if not code.co_filename.startswith(internal):
            out.append(f"{os.path.basename(code.co_filename)}:{frame.f_lineno} {code.co_name}"[:MAX_TEXT])
        frame = frame.f_back
    return out


class LiveVerdict:
    """Publishes this rank's summary at each stall and, on gatherer ranks, writes the job's snapshot.

    Driven by the watchdog: ``on_stall(gen)`` when a stall generation is first seen, ``tick()`` at every wake-up
    (it returns at once while no stall is open), ``resolved(gen)`` when the call that triggered it completed.
    """

    def __init__(self, rec: RecorderView, store: Any, out_dir: str, world_size: int, local_rank: int | None,
                 clock: Any = time.monotonic) -> None:
        self._rec = rec
        self._store = store
        self._out_dir = out_dir
        self._world = world_size
        self._clock = clock
        self._gather_all = rec.rank == 0
        self._copy_all = not self._gather_all and local_rank == 0
        self._open: dict[int, float] = {}  # gen -> deadline of its gathering (gatherer ranks)
        self._written: set[int] = set()  # gens whose snapshot is in the folder
        self._resolved_seen: set[int] = set()
        self._published = 0

    @property
    def gatherer(self) -> bool:
        return self._gather_all or self._copy_all

    def on_stall(self, gen: int, fr_pending: dict[str, dict] | None = None) -> None:
        if self._published >= MAX_LIVE_STALLS:
            return
        self._published += 1
        summary = orjson.dumps(rank_summary(self._rec, fr_pending))
        self._store.set(RANK_KEY.format(gen, self._rec.rank), summary)
        self._store.add(COUNT_KEY.format(gen), 1)
        if self.gatherer:
            self._open[gen] = self._clock() + GATHER_WAIT_S

    def resolved(self, gen: int) -> None:
        self._store.set(RESOLVED_KEY.format(gen), str(time.time_ns()))

    def tick(self) -> None:
        if not self._open and not self._written:
            return
        now = self._clock()
        for gen, deadline in list(self._open.items()):
            if self._gather_all:
                answered = self._store.add(COUNT_KEY.format(gen), 0)
                if answered >= self._world or now >= deadline:
                    self._write_snapshot(gen, self._gather(gen))
                    del self._open[gen]
            elif self._store.check([ALL_KEY.format(gen)]):
                self._write_snapshot(gen, orjson.loads(self._store.get(ALL_KEY.format(gen))))
                del self._open[gen]
            elif now >= deadline + GATHER_WAIT_S:  # rank 0 never published: its node's record says it
                del self._open[gen]
        for gen in sorted(self._written - self._resolved_seen):
            key = RESOLVED_KEY.format(gen)
            if self._store.check([key]):
                self._resolved_seen.add(gen)
                t_ns = int(self._store.get(key))
                _write_json(self._out_dir, layout.live_resolved(gen), {
                    "format": "comm2perfetto-live", "version": 1, "gen": gen, "resolved_ns": t_ns})

    def _gather(self, gen: int) -> dict[str, Any]:
        ranks = []
        for rank in range(self._world):
            key = RANK_KEY.format(gen, rank)
            if self._store.check([key]):
                ranks.append(orjson.loads(self._store.get(key)))
        snapshot = {"format": "comm2perfetto-live", "version": 1, "gen": gen, "world_size": self._world,
                    "gathered_ns": time.time_ns(), "gathered_by": self._rec.rank, "ranks": ranks}
        self._store.set(ALL_KEY.format(gen), orjson.dumps(snapshot))
        return snapshot

    def _write_snapshot(self, gen: int, snapshot: dict[str, Any]) -> None:
        _write_json(self._out_dir, layout.live_snapshot(gen), snapshot)
        self._written.add(gen)


def _write_json(out_dir: str, name: str, doc: dict[str, Any]) -> None:
    path = os.path.join(out_dir, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    layout.write_whole(path, orjson.dumps(doc))
