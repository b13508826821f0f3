"""The live verdict's rank side: at a stall, every rank says where it is; one rank gathers the job.

When a stall is detected (by any rank: the watchdog's stall generation in the job's c10d store), each rank's
watchdog publishes a small summary of itself under ``comm2perfetto/live/<gen>/<rank>``: per process group, how
many collectives it has issued, the one it is waiting in, the sends and receives it is inside (a batch: one per
peer) and its last few collectives with their times (read back from the tail of its own event log), plus its
main thread's Python stack. A rank publishes under every generation it has not published under yet, so a
stall that several ranks detected at once is gathered complete under each of its generations.

Rank 0 gathers every rank's summary (waiting at most ``GATHER_WAIT_S`` for ranks that do not answer) into one
snapshot, writes it into its output folder (``.live/stall.<gen>.json``) and publishes it under
``comm2perfetto/live/<gen>/all``. No single rank is required: when no snapshot is published ``TAKEOVER_S``
after rank 0's deadline (rank 0 is itself the stuck rank), the first other rank to claim the generation
(``comm2perfetto/live/<gen>/claim``) gathers instead. The lowest rank of every (host, folder) that answered
copies the snapshot into its folder. ``comm2perfetto record``, watching the folder, turns a snapshot into the
verdict (diagnose/live.py) while the job still hangs.

A stall is resolved when the call of every rank that detected it completed: ``comm2perfetto/live/<gen>/open``
counts those calls, and the rank whose call ends it publishes ``comm2perfetto/live/<gen>/resolved``; the ranks
that wrote the snapshot write ``.live/stall.<gen>.resolved.json``.

Everything runs on the watchdog thread, only after a stall was detected: nothing while the job is healthy.
Store traffic is bounded: one key per rank per generation (at most ``MAX_LIVE_STALLS``), one check per rank
and tick while a gathering is open (``GATHER_WAIT_S`` to ``3 * GATHER_WAIT_S``), a world-size read by the
gatherer. A summary is a few KB at most (``MAX_FRAMES`` frames, ``MAX_GROUPS`` groups, ``MAX_RECENT`` recent
collectives and ``MAX_P2P`` sends/receives per group), so a snapshot stays proportional to the world size.

A rank summary::

    {"rank": 1, "host": "node07", "folder": "/home/me/run1", "pid": 4242, "t_ns": 1795313447406614332, "step": 3,
     "groups": {"0": {"desc": "default_pg", "ranks": [0, 1], "issued": 3, "pending": null, "p2p": [],
                      "recent": [[2, 1795313441406614332, "all_reduce", 16], [3, 1795313442406614332]],
                      "p2p_issued": []}},
     "stack": ["hang_missing_rank.py:36 load_next_shard", "hang_missing_rank.py:55 run", ...]}

``pending`` is ``{"op": "all_reduce", "seq": 4, "since_ns": ..., "source": "patch", "numel": 16, "dtypes":
["Float"]}`` for a rank waiting in a collective (``source`` ``fr`` for one only Flight Recorder sees, such as
DDP's, without sizes; ``"root": 0``, its src or dst, for a rooted one; ``numel``/``dtypes``: its input
tensors'); ``p2p`` lists ``{"op": "recv", "peer": 2, "n": 3, "since_ns": ...}`` for each send or receive it is
inside or whose work is pending (``n``: its index among the rank's recvs from rank 2), and
``p2p_issued`` ``[["send", 1, 3], ...]`` how many of each it issued per peer.
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
from comm2perfetto.record.ops import p2p_keys

if TYPE_CHECKING:
    from comm2perfetto.record.view import RecorderView

RANK_KEY = "comm2perfetto/live/{}/{}"
COUNT_KEY = "comm2perfetto/live/{}/count"
ALL_KEY = "comm2perfetto/live/{}/all"
RESOLVED_KEY = "comm2perfetto/live/{}/resolved"
CLAIM_KEY = "comm2perfetto/live/{}/claim"
OPEN_KEY = "comm2perfetto/live/{}/open"

GATHER_WAIT_S = 5.0  # how long rank 0 waits for ranks whose watchdog has not answered yet
TAKEOVER_S = 2.0  # after that, how long the other ranks give rank 0 to publish before one of them gathers
MAX_LIVE_STALLS = 5  # stalls a job reports live; later ones are in the dumps as usual
MAX_FRAMES = 16
MAX_GROUPS = 64
MAX_TEXT = 200
MAX_RECENT = 8  # per group: the last collectives issued, for the order of operations across groups
MAX_P2P = 32  # per group: sends and receives a rank is inside
TAIL_BYTES = 64 << 10  # of the event log read back for the recent collectives (a few hundred records)


def rank_summary(rec: RecorderView, fr_pending: dict[str, dict] | None = None, folder: str = "") -> dict[str, Any]:
    """What this rank is doing now, for the live verdict: bounded in size whatever the job does. Every group
    the process created is listed, used or not (``groups_complete``): a group missing from a rank's summary is
    one it does not have, and a listed group it never used shows ``issued`` 0."""
    rec.declare_all_groups()
    groups: dict[str, dict[str, Any]] = {}
    counters: dict[str, int | None] = {}
    for info in rec.groups()[:MAX_GROUPS]:
        issued = None
        if info.seq_counter is not None:
            try:
                issued = info.seq_counter() - info.p2p_consumed
            except Exception:  # a group destroyed meanwhile
                issued = None
        counters[info.name] = issued
        groups[info.name] = {"desc": info.desc[:MAX_TEXT], "ranks": info.ranks[:4096], "issued": issued,
                             "pending": None, "p2p": [], "recent": []}
    returned = rec.p2p_works_pending()  # p2p calls that returned, whose work is not done: counted already
    for record in rec.in_flight():  # the patch layer's pending calls: cid, t, op, gid, seq, peer ...
        cid, t_begin, op, gid, seq = record[1:6]
        entry = groups.get(rec.group_name(gid))
        if entry is None:
            continue
        if seq is None:  # a send, a recv, a batch of them: one per peer
            keys = p2p_keys(record)
            at = returned.get(cid) or [rec.p2p_counts.get(key, 0) + 1 for key in keys]  # not counted yet
            for (_, kind, peer), n in list(zip(keys, at))[:MAX_P2P]:
                if len(entry["p2p"]) < MAX_P2P:
                    entry["p2p"].append({"op": kind, "peer": peer, "n": n, "since_ns": t_begin})
            if cid not in returned and entry["issued"] is not None:
                entry["issued"] -= len(record[6]) if isinstance(record[6], list) else 1  # gloo counts p2p too
            continue
        if entry["pending"] is None or seq < entry["pending"]["seq"]:
            entry["pending"] = {"op": op, "seq": seq, "since_ns": t_begin, "source": "patch"}
            if isinstance(record[6], int):  # a broadcast's src, a reduce's dst...
                entry["pending"]["root"] = record[6]
            passed = rec.arg_numel.get(record[12]) if len(record) > 12 else None
            if passed is not None:  # what it passes: ranks waiting with other sizes or dtypes disagree
                entry["pending"]["numel"], entry["pending"]["dtypes"] = passed[0], list(passed[1][:8])
    for name, pending in (fr_pending or {}).items():
        entry = groups.setdefault(name, {"desc": pending.get("desc", ""), "ranks": [], "issued": None,
                                         "pending": None, "p2p": [], "recent": []})
        if entry["pending"] is None:
            entry["pending"] = {k: pending[k] for k in ("op", "seq", "since_ns")} | {"source": "fr"}
    for name, issues in recent_issues(rec).items():
        if name in groups:
            groups[name]["recent"] = issues
    for (gid, kind, peer), n in list(rec.p2p_counts.items()):
        entry = groups.get(rec.group_name(gid))
        if entry is not None and len(entry.setdefault("p2p_issued", [])) < MAX_P2P:
            entry["p2p_issued"].append([kind, peer, n])
    return {
        "rank": rec.rank, "host": socket.gethostname()[:MAX_TEXT], "folder": folder[:1000], "pid": os.getpid(),
        "t_ns": time.time_ns(), "step": rec.steps.current, "groups": groups,
        "groups_complete": len(rec.groups()) <= MAX_GROUPS, "stack": main_stack(rec.internal_roots),
    }


def recent_issues(rec: RecorderView) -> dict[str, list[list[Any]]]:
    """Per group, the last ``MAX_RECENT`` collectives this rank issued from Python, ``[seq, t_ns]`` oldest
    first, ``[seq, t_ns, op, numel]`` where the elements it passed are known, from the `b` records at the end of
    its own event log (no bookkeeping on the hot path)."""
    out: dict[str, list[list[Any]]] = {}
    lines = rec.log.tail(TAIL_BYTES).split(b"\n")[1:]  # the first may be cut
    for line in lines:
        if not line.startswith(b'["b",'):
            continue
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        t, gid, seq = record[2], record[4], record[5]
        if isinstance(seq, int) and isinstance(t, int) and isinstance(gid, int):
            passed = rec.arg_numel.get(record[12]) if len(record) > 12 and isinstance(record[12], int) else None
            # with what it passed: a rank that went past a collective its peers hang in may have passed another size
            out.setdefault(rec.group_name(gid), []).append([seq, t] if passed is None else
                                                          [seq, t, str(record[3])[:MAX_TEXT], passed[0]])
    return {name: issues[-MAX_RECENT:] for name, issues in out.items()}


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
    """Publishes this rank's summary at each stall, gathers the job's snapshot when rank 0 does not (or is rank
    0), and copies it into this rank's folder when it is the lowest rank of that folder that answered.

    Driven by the watchdog: ``on_stall(gen)`` when a stall generation is first seen (``detected``: by this
    rank's own call, which then counts until ``resolved(gen)``), ``tick()`` at every wake-up (it returns at once
    while no stall is open), ``still_open(gen)`` before a rank that detects a stall starts a new generation.
    """

    def __init__(self, rec: RecorderView, store: Any, out_dir: str, world_size: int, local_rank: int | None = None,
                 clock: Any = time.monotonic) -> None:
        self._rec = rec
        self._store = store
        self._out_dir = out_dir
        self._world = world_size
        self._clock = clock
        self._open: dict[int, float] = {}  # gen -> when this rank published under it (its gathering window)
        self._written: set[int] = set()  # gens whose snapshot is in the folder
        self._resolved_seen: set[int] = set()
        self._published = 0
        self._published_upto = 0

    def still_open(self, gen: int) -> bool:
        """Stall generation ``gen`` exists and has not resolved: a stall detected now is part of it."""
        return gen > 0 and not self._store.check([RESOLVED_KEY.format(gen)])

    def on_stall(self, gen: int, fr_pending: dict[str, dict] | None = None, detected: bool = False) -> None:
        if detected:
            self._store.add(OPEN_KEY.format(gen), 1)
        summary = None
        # Generations created at once (ranks that detected one stall together) each get this rank's summary.
        for g in range(max(self._published_upto + 1, gen - 2), gen + 1):
            if self._published >= MAX_LIVE_STALLS:
                break
            summary = summary or orjson.dumps(rank_summary(self._rec, fr_pending, self._out_dir))
            self._store.set(RANK_KEY.format(g, self._rec.rank), summary)
            self._store.add(COUNT_KEY.format(g), 1)
            self._published += 1
            self._open[g] = self._clock()
        self._published_upto = max(self._published_upto, gen)

    def resolved(self, gen: int) -> None:
        """This rank's call that detected stall ``gen`` completed; the last such call ends the stall."""
        if self._store.add(OPEN_KEY.format(gen), -1) <= 0:
            self._store.set(RESOLVED_KEY.format(gen), str(time.time_ns()))

    def tick(self) -> None:
        if not self._open and not self._written:
            return
        now = self._clock()
        for gen, since in list(self._open.items()):
            if self._store.check([ALL_KEY.format(gen)]):
                snapshot = orjson.loads(self._store.get(ALL_KEY.format(gen)))
                if self._copies(snapshot):
                    self._write_snapshot(gen, snapshot)
                del self._open[gen]
                continue
            first = self._rec.rank == 0  # the usual gatherer; any other rank when it does not answer
            due = since + GATHER_WAIT_S + (0 if first else TAKEOVER_S)
            if (first and self._store.add(COUNT_KEY.format(gen), 0) >= self._world) or now >= due:
                if self._store.add(CLAIM_KEY.format(gen), 1) == 1:
                    self._write_snapshot(gen, self._gather(gen))
                    del self._open[gen]
                    continue
            if now >= since + 3 * GATHER_WAIT_S:  # nobody published one: `record` says nothing for this gen
                del self._open[gen]
        self.write_resolved()

    def write_resolved(self) -> None:
        """Write ``.live/stall.<gen>.resolved.json`` for each stall whose snapshot this rank wrote and that some
        rank's completed call ended (``resolved``). Also called once as the recorder stops: a job that ends a
        moment after its stall resolved is told it resolved."""
        for gen in sorted(self._written - self._resolved_seen):
            key = RESOLVED_KEY.format(gen)
            if self._store.check([key]):
                self._resolved_seen.add(gen)
                t_ns = int(self._store.get(key))
                _write_json(self._out_dir, layout.live_resolved(gen), {
                    "format": "comm2perfetto-live", "version": 1, "gen": gen, "resolved_ns": t_ns})

    def _copies(self, snapshot: dict[str, Any]) -> bool:
        """Whether this rank is the lowest that answered of its host and folder: the one that copies."""
        ranks = [s for s in snapshot.get("ranks") or () if isinstance(s, dict)]
        me = next((s for s in ranks if s.get("rank") == self._rec.rank), None)
        if me is None:
            return False
        place = (me.get("host"), me.get("folder"))
        same = [s["rank"] for s in ranks
                if isinstance(s.get("rank"), int) and (s.get("host"), s.get("folder")) == place]
        return min(same) == self._rec.rank

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
