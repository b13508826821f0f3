"""The window exchange: every rank puts its window summary (window.py) into the job's c10d store, one rank gathers
the job's window, matches collectives by (group, seq) across ranks and names the stragglers (lateness.py), and
the lowest rank of every host and folder copies the result into ``<folder>/live/window.json``, which
``comm2perfetto record`` turns into ``live/metrics.prom``, ``live/stragglers.jsonl`` and ``--on-straggler``
(window_watch.py), and ``comm2perfetto top`` shows.

No collective: a hung rank, a subgroup or a rank that died cannot block it. Every store call is one that
returns at once (``set``, ``add``, ``check``, ``delete_key``, and ``get``/``multi_get`` of keys known to exist):
a blocking ``get`` or ``wait`` on the training job's store could hold the watchdog's thread for the store's
timeout (record/clock.py says why that matters at exit). Everything runs on the watchdog's thread, a step per
tick: nobody waits.

Rank 0 gathers once every rank published the window, or ``wait_s`` after it published its own (a rank that has
not published by then is ``missing`` from the window). When rank 0 does not (it is frozen, or its ticks come
late), the first other rank to claim the window ``takeover_s`` later gathers; the straggler history it needs is
in the store (``STATE_KEY``), rewritten by every gathering. A rank deletes its own summary two windows later and
the gatherer its window's other keys, so the store holds a few windows at most.

Store keys, under the job's default store (attempt k >= 1 under the prefix ``attempt<k>``)::

    comm2perfetto/window/<w>/<rank>       that rank's summary of window w (window.py, with its host, folder and
                                          clock measurement, group members and descriptions)
    comm2perfetto/window/<w>/count        how many ranks published window w
    comm2perfetto/window/<w>/claim        incremented by a rank about to gather: the one that makes it 1 gathers
    comm2perfetto/window/<w>/all          the gathered window (docs/live.md)
    comm2perfetto/window/<w>/copy/<rank>  set for each rank that copies the window into its folder
    comm2perfetto/window/state            the straggler tracker's state after the last gathered window

Traffic per window and rank: a ``set`` of a few KB, three ``add``, a ``delete_key`` and a check per tick while
the window is open; the gatherer reads every summary at once (``multi_get``), and every copying rank the
gathered window (``all``, about 200 bytes a rank) and its own folder's summaries.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import orjson

from comm2perfetto import layout
from comm2perfetto.lateness import StragglerTracker, clock_trusted, group_lateness

if TYPE_CHECKING:
    from comm2perfetto.record.view import RankLog

KEY = "comm2perfetto/window/{}/{}"
COUNT_KEY = "comm2perfetto/window/{}/count"
CLAIM_KEY = "comm2perfetto/window/{}/claim"
ALL_KEY = "comm2perfetto/window/{}/all"
COPY_KEY = "comm2perfetto/window/{}/copy/{}"
STATE_KEY = "comm2perfetto/window/state"

FORMAT = "comm2perfetto-window"
EVENT_FORMAT = "comm2perfetto-straggler"
GATHER_WAIT_S = 5.0  # at most: how long rank 0 waits for ranks that have not published the window
TAKEOVER_S = 2.0  # at most: after that, how long the others give rank 0 before one of them gathers
MAX_CARRIED = 4096  # per group: collectives a rank's arrival at was still missing, kept for the next window


class WindowExchange:
    """Publish this rank's windows (``publish``), gather the job's (rank 0, or a rank taking over) and copy them
    into this rank's folder when it is the lowest rank of its host and folder (``tick``)."""

    def __init__(self, rec: RankLog, store: Any, world_size: int, every_s: float, out_dir: str, host: str,
                 attempt: int | None = None, clock: Any = time.monotonic) -> None:
        self._rec = rec
        self._store = store
        self._world = world_size
        self._every_s = every_s
        self._out_dir = out_dir
        self._host = host
        self._attempt = attempt or 0
        self._clock = clock
        self.wait_s = min(GATHER_WAIT_S, 0.4 * every_s)
        self.takeover_s = min(TAKEOVER_S, 0.3 * every_s)
        self._open: dict[int, tuple[float, bool]] = {}  # window -> (when this rank published it, claim tried)
        self._published: list[int] = []
        self._gathered: dict[int, list[str]] = {}  # windows this rank gathered -> their keys, deleted later
        self._tracker: StragglerTracker | None = None
        self._tracker_window = -1
        self._carry: dict[str, dict[int, dict[int, int]]] = {}  # group -> seq -> rank -> arrival, from the last

    def publish(self, window: int, summary: bytes) -> None:
        self._store.set(KEY.format(window, self._rec.rank), summary)
        self._store.add(COUNT_KEY.format(window), 1)
        while self._published and self._published[0] < window - 1:
            self._store.delete_key(KEY.format(self._published.pop(0), self._rec.rank))
        self._published.append(window)
        self._open[window] = (self._clock(), False)

    def tick(self) -> None:
        now = self._clock()
        for window, (since, claimed) in list(self._open.items()):
            if self._store.check([COPY_KEY.format(window, self._rec.rank)]):
                del self._open[window]
                self._copy(orjson.loads(self._store.get(ALL_KEY.format(window))))
                continue
            first = self._rec.rank == 0  # the usual gatherer; another rank when it does not gather
            due = since + self.wait_s + (0 if first else self.takeover_s)
            everyone = first and not claimed and self._store.add(COUNT_KEY.format(window), 0) >= self._world
            if not claimed and (now >= due or everyone):
                self._open[window] = (since, True)
                if self._store.add(CLAIM_KEY.format(window), 1) == 1:
                    del self._open[window]
                    self._gather(window)
                    continue
            if now >= since + 2 * self.wait_s + self.takeover_s:  # not a copying rank, or nobody gathered
                del self._open[window]

    def _gather(self, window: int) -> None:
        store = self._store
        if store.add(COUNT_KEY.format(window), 0) >= self._world:
            present = list(range(self._world))
        else:
            present = [rank for rank in range(self._world) if store.check([KEY.format(window, rank)])]
        raw = _get_all(store, [KEY.format(window, rank) for rank in present])
        summaries = []
        for data in raw:
            try:
                summary = orjson.loads(data)
            except orjson.JSONDecodeError:
                continue
            if isinstance(summary, dict) and isinstance(summary.get("rank"), int):
                summaries.append(summary)
        tracker = self._load_tracker()
        doc, self._carry = window_doc(window, self._every_s, self._world, summaries, tracker, self._carry,
                                      gathered_by=self._rec.rank, attempt=self._attempt)
        data = orjson.dumps(doc)
        store.set(ALL_KEY.format(window), data)
        copiers = copying_ranks(summaries)
        for rank in copiers:
            store.set(COPY_KEY.format(window, rank), b"1")
        store.set(STATE_KEY, orjson.dumps({"window": window, "tracker": tracker.state()}))
        self._tracker_window = window
        for old in [w for w in self._gathered if w < window - 1]:
            for key in self._gathered.pop(old):
                store.delete_key(key)
        self._gathered[window] = [COUNT_KEY.format(window), CLAIM_KEY.format(window), ALL_KEY.format(window),
                                  *(COPY_KEY.format(window, rank) for rank in copiers)]
        if self._rec.rank in copiers:
            self._store.delete_key(COPY_KEY.format(window, self._rec.rank))
            self._copy(doc, {s["rank"]: s for s in summaries})

    def _load_tracker(self) -> StragglerTracker:
        """The straggler history: this rank's own when it gathered last, else the store's (another rank gathered
        meanwhile, or this rank takes over)."""
        if self._store.check([STATE_KEY]):
            state = orjson.loads(self._store.get(STATE_KEY))
            if isinstance(state, dict) and isinstance(state.get("window"), int) \
                    and state["window"] > self._tracker_window:
                self._tracker = StragglerTracker(state.get("tracker"))
                self._tracker_window = state["window"]
                self._carry = {}
        if self._tracker is None:
            self._tracker = StragglerTracker()
        return self._tracker

    def _copy(self, doc: dict[str, Any], summaries: dict[int, dict[str, Any]] | None = None) -> None:
        """Write the gathered window into this rank's folder, with the summaries of the ranks of its host and
        folder (the detail ``metrics.prom`` gives of each)."""
        here = (self._host, self._out_dir)
        mine = [r["rank"] for r in doc.get("ranks", ()) if (r.get("host"), r.get("folder")) == here]
        if summaries is None:
            raw = _get_all(self._store, [KEY.format(doc["window"], rank) for rank in mine])
            detail = [orjson.loads(data) for data in raw]
        else:
            detail = [summaries[rank] for rank in mine if rank in summaries]
        path = os.path.join(self._out_dir, layout.LIVE_WINDOW_FILE)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        layout.write_whole(path, orjson.dumps(dict(doc, detail=detail)))


def _get_all(store: Any, keys: list[str]) -> list[bytes]:
    """The values of ``keys``, all known to exist: one round trip where the store has ``multi_get``."""
    if not keys:
        return []
    multi_get = getattr(store, "multi_get", None)
    if multi_get is not None:
        try:
            return list(multi_get(keys))
        except (RuntimeError, NotImplementedError):  # a store without it (torch before 2.5, some wrappers)
            pass
    return [store.get(key) for key in keys]


def copying_ranks(summaries: Iterable[dict[str, Any]]) -> list[int]:
    """The lowest rank of every (host, folder) among the summaries: the ranks that copy the window."""
    lowest: dict[tuple[Any, Any], int] = {}
    for s in summaries:
        place = (s.get("host"), s.get("folder"))
        lowest[place] = min(lowest.get(place, s["rank"]), s["rank"])
    return sorted(lowest.values())


def _members(group: dict[str, Any]) -> list[int]:
    span = group.get("ranks_span")
    if isinstance(span, list) and len(span) == 2 and all(isinstance(x, int) for x in span):
        return list(range(span[0], span[1]))
    return [r for r in group.get("ranks") or () if isinstance(r, int)]


def _seconds(ns: Any) -> float | None:
    return round(ns / 1e9, 6) if isinstance(ns, (int, float)) else None


def window_doc(window: int, every_s: float, world_size: int, summaries: list[dict[str, Any]],
               tracker: StragglerTracker, carry: dict[str, dict[int, dict[int, int]]], gathered_by: int = 0,
               attempt: int = 0) -> tuple[dict[str, Any], dict[str, dict[int, dict[int, int]]]]:
    """The gathered window (docs/live.md) from the ranks' summaries, and what to carry to the next: per group and
    rank, its arrivals at the collectives of this window that some compared rank had not arrived at (it arrives
    in the next window: a late rank issues a collective after the others' window closed)."""
    ranks = []
    uncertainty: dict[int, int] = {}
    hosts: dict[int, str] = {}
    groups: dict[str, dict[str, Any]] = {}
    for s in sorted(summaries, key=lambda s: s["rank"]):
        rank, rtt = s["rank"], s.get("clock_rtt_ns")
        if isinstance(rtt, int) and clock_trusted(rtt):
            uncertainty[rank] = rtt // 2
        hosts[rank] = str(s.get("host", ""))
        comm_ns, untimed = 0, False
        t0 = s.get("t0_ns")
        for name, g in (s.get("groups") or {}).items():
            for op in (g.get("ops") or {}).values():
                comm_ns += op.get("time_ns") or 0
                untimed = untimed or op.get("timed") != op.get("n")
            entry = groups.get(name)
            if entry is None:
                entry = groups[name] = {"desc": str(g.get("desc", "")), "members": _members(g), "arrivals": {}}
            if isinstance(t0, int) and g.get("seqs"):  # on the job's clock, in C
                at = map(t0.__add__, map((1000).__mul__, g.get("arrivals_us") or ()))
                entry["arrivals"][rank] = dict(zip(g["seqs"], at))
        ranks.append({"rank": rank, "host": hosts[rank], "folder": s.get("folder"), "pid": s.get("pid"),
                      "window_s": _seconds(s["t1_ns"] - t0) if isinstance(t0, int) else None,
                      "steps": s.get("steps"), "step_s": _seconds(s.get("step_ns")),
                      "comm_s": None if untimed else _seconds(comm_ns), "exposed_s": _seconds(s.get("exposed_ns")),
                      "clock": "measured" if rank in uncertainty else "untrusted" if rtt is not None else "none"})
    present = {r["rank"] for r in ranks}
    out_groups = []
    events = []
    next_carry: dict[str, dict[int, dict[int, int]]] = {}
    for name, entry in sorted(groups.items()):
        compared = {r: uncertainty[r] for r in entry["members"] if r in uncertainty}
        arrivals: dict[int, dict[int, int]] = entry["arrivals"]
        result = group_lateness({**arrivals, **{rank: {**earlier, **arrivals.get(rank, {})}
                                                for rank, earlier in carry.get(name, {}).items()}}, compared)
        complete = result.seqs if result is not None else frozenset()
        waiting: set[int] = set()
        for seqs in arrivals.values():  # this window's arrivals at collectives not every compared rank reached
            if len(seqs) != len(complete) or result is None:
                waiting.update(seqs.keys() - complete)
        waiting = set(sorted(waiting)[:MAX_CARRIED])
        if waiting:
            kept = {rank: {seq: t for seq, t in seqs.items() if seq in waiting} for rank, seqs in arrivals.items()}
            next_carry[name] = {rank: seqs for rank, seqs in kept.items() if seqs}
        row: dict[str, Any] = {"group": name, "desc": entry["desc"], "size": len(entry["members"]),
                               "compared": len(compared), "matched": result.matched if result else 0,
                               "spread_s": _seconds(result.spread_ns) if result else None, "ranks": []}
        if result is not None:
            row["ranks"] = [{"rank": rank, "mean_s": _seconds(v.mean_ns), "excess_s": _seconds(v.excess_ns),
                             "last_share": round(v.last_share, 4), "threshold_s": _seconds(v.threshold_ns),
                             "late": v.late} for rank, v in sorted(result.ranks.items())]
            events += tracker.update(window, name, entry["desc"], result.ranks)
        out_groups.append(row)
    now = time.time_ns()
    events = [{"format": EVENT_FORMAT, "version": 1, **event, "window": window, "attempt": attempt,
               "host": hosts.get(event["rank"]), "t_ns": now} for event in events]
    doc = {"format": FORMAT, "version": 1, "attempt": attempt, "window": window, "every_s": every_s,
           "end_ns": (window + 1) * round(every_s * 1e9), "gathered_ns": now, "gathered_by": gathered_by,
           "world_size": world_size, "missing": sorted(set(range(world_size)) - present), "ranks": ranks,
           "groups": out_groups,
           "stragglers": [{"rank": r, "group": g, "since": w} for r, g, w in tracker.active()],
           "events": events}
    return doc, next_carry
