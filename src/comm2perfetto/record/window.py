"""Window summaries: every ``--live-every`` seconds, what this rank's communication was, written into its own
event log (an ``l`` record) and handed to the store exchange (gather.py) for the live stragglers and metrics.

Nothing on the hot path: at every watchdog tick (once a second, on the watchdog's thread, no thread of its own)
the records the rank wrote since the last tick are read back from its event log (``EventLog.read_from``) and
added up. Only the records that matter are parsed (``a``, ``b``, ``e``, ``d``, ``x``, ``v``, ``p``, recognised
by their first bytes); a tick costs about a microsecond per recorded call.

Windows are aligned on the job's clock (rank 0's: this rank's start-up clock offset, clock.py), window ``w``
covering ``[w * every, (w + 1) * every)``, so every rank closes the same window within a tick of the others.
A record belongs to the window its own time falls in: a call's arrival (its ``b`` record) to the window it
was issued in, its count, bytes and time to the window it completed in. The first window starts when
recording started; a tick that came late (the GIL held for seconds) makes one longer window, its span
(``t0``, ``t1``) saying so.

The summary (the ``l`` record's last field; times of the rank's own clock, as every record's)::

    {"steps": 12, "step_ns": 412000000, "exposed_ns": 910000000,
     "groups": {"0": {"issued": 240, "stride": 4,
                      "ops": {"all_reduce": {"n": 240, "bytes": 983040, "time_ns": 910000000, "timed": 240}},
                      "seqs": [4, 8, ...], "arrivals_us": [10211, 52007, ...]}}}

- ``steps``: step boundaries (``p`` records) in the window; ``step_ns``: the median length of the steps that
  ended in it (null without one);
- per process group (by c10d's name): ``issued``, the collectives the group's sequence counter advanced by
  (C++-issued ones, which only Flight Recorder records, included; null where the group has no counter);
  per op the calls completed (``n``), their input bytes (null where one is unknown), the time of those whose
  completion is known (``timed`` of them: a synchronous call on a CPU backend, whose return is its completion,
  or a call with a ``d`` record) in ``time_ns``;
- ``exposed_ns``: the time the training thread waited in communication, known only where every call completed
  in the window was a synchronous call of the main thread on a CPU backend (nothing on that thread overlaps
  it); null otherwise (an async call, a GPU backend: its overlap with compute is not known live);
- ``seqs`` and ``arrivals_us``: the collectives issued in the window (their sequence numbers) and when (µs after
  ``t0``), those whose seq is a multiple of ``stride``, the smallest power of two that keeps at most
  ``MAX_ARRIVALS`` (every rank keeps the same seqs, so the gatherer matches them across ranks). Two flat lists,
  not a pair per collective: the gatherer of a large job parses a thousand summaries, and each small list
  costs it an object for the garbage collector to walk.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from statistics import median
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from comm2perfetto.record.gather import WindowExchange
    from comm2perfetto.record.view import RecorderView

MAX_ARRIVALS = 32  # per group and window: enough to tell a straggler; the gatherer matches world x this
MAX_GROUPS = 64
MAX_OPS = 32  # per group
MAX_TEXT = 200
MAX_PENDING = 100_000  # calls awaiting their completion record (a functional collective nobody waits on has none)

# The kinds a window adds up, by the bytes after '["' at the start of their line.
_KINDS = frozenset((b"a", b"b", b"e", b"d", b"x", b"v", b"p"))


class _Window:
    """One window's sums."""

    __slots__ = ("arrivals", "exposed_known", "exposed_ns", "ops", "step_times")

    def __init__(self) -> None:
        self.ops: dict[tuple[int, str], list[Any]] = {}  # (gid, op) -> [n, bytes or None, time_ns, timed]
        self.arrivals: dict[int, list[tuple[int, int]]] = {}  # gid -> [(seq, t_ns)] in issue order
        self.step_times: list[int] = []
        self.exposed_ns = 0
        self.exposed_known = True


class WindowSummaries:
    """The rank's windows, driven by the watchdog: ``tick()`` at every wake-up, ``close()`` as recording stops
    (the last, partial window goes into the log)."""

    def __init__(self, rec: RecorderView, every_s: float, exchange: WindowExchange | None = None,
                 folder: str = "", clock: Any = time.time_ns) -> None:
        self._rec = rec
        self._every_ns = round(every_s * 1e9)
        self._exchange = exchange
        self._folder = folder
        self._clock = clock
        self._main_tid = threading.main_thread().ident
        self._offset = 0  # read back from the recorder's clock measurement at every tick
        self._read_at = 0  # log bytes read so far
        self._bytes: dict[int, int | None] = {}  # `a` id -> input bytes
        self._calls: dict[int, tuple] = {}  # cid -> (t, op, gid, seq, async) of calls not completed yet
        self._captured: set[int] = set()
        self._cpu: list[bool] = []  # per gid: whether the group's backends all run on the CPU
        self._last_step: int | None = None
        self._issued_at: dict[int, int] = {}  # gid -> the group's counter at the last close
        now = clock()
        self._t0 = now  # local time the open window began
        self._window = (now + self._offset) // self._every_ns  # the open window's number (job clock)
        self._cur = _Window()
        self._next = _Window()  # records already read that belong after the open window's end
        self._count_issued()

    def tick(self) -> None:
        clock = self._rec.clock
        if clock is not None:
            self._offset = clock[0]
        self._read()
        now = self._clock()
        end_local = (self._window + 1) * self._every_ns - self._offset
        if now >= end_local:
            self._close(end_local, (now + self._offset) // self._every_ns)
        if self._exchange is not None:
            self._exchange.tick()

    def close(self) -> None:
        """The window open as recording stops, up to now, into the log (not to the store: the others have
        stopped gathering, or will miss one rank's partial window)."""
        self._read()
        cur, self._cur = self._cur, self._next
        self._next = _Window()
        self._rec.log.write(["l", self._window, self._t0, self._clock(), self._summary(cur, self._count_issued())])

    def _read(self) -> None:
        data = self._rec.log.read_from(self._read_at)
        end = data.rfind(b"\n") + 1
        self._read_at += end
        cut = (self._window + 1) * self._every_ns - self._offset
        for line in data[:end].split(b"\n"):
            if line[2:3] in _KINDS and line[3:4] == b'"' and line[:2] == b'["':
                self._apply(orjson.loads(line), cut)

    def _apply(self, r: list, cut: int) -> None:
        kind = r[0]
        if kind == "b":
            cid, t, op, gid, seq = r[1:6]
            if len(self._calls) < MAX_PENDING:
                self._calls[cid] = (t, op, gid, bool(r[7]), r[12], r[8] == self._main_tid)
            if seq is not None:  # a collective (a send or recv has none)
                window = self._cur if t < cut else self._next
                window.arrivals.setdefault(gid, []).append((seq, t))
        elif kind == "e":
            call = self._calls.get(r[1])
            if call is None:
                return
            if call[3] and self._group_cpu(call[2]):  # async work on the CPU: its `d` says when it completed
                return
            del self._calls[r[1]]
            # A synchronous call on a CPU backend completed as it returned; any other is counted untimed.
            timed = not call[3] and self._group_cpu(call[2])
            self._count(r[1], call, r[2], cut, timed, exposed=timed and call[5])
        elif kind in ("d", "x"):
            call = self._calls.pop(r[1], None)
            if call is not None:
                self._count(r[1], call, r[2], cut, kind == "d", exposed=False)
        elif kind == "a":
            self._bytes[r[1]] = r[4]
        elif kind == "v":
            self._captured.add(r[1])
        elif kind == "p":
            (self._cur if r[2] < cut else self._next).step_times.append(r[2])

    def _count(self, cid: int, call: tuple, t_end: int, cut: int, timed: bool, exposed: bool) -> None:
        """Add a completed call (``timed``: its completion is ``t_end``) to the window it completed in."""
        if cid in self._captured:  # issued at each replay of a CUDA graph, which nothing here sees
            self._captured.discard(cid)
            return
        t_begin, op, gid, _async, aid, _main = call
        window = self._cur if t_end < cut else self._next
        sums = window.ops.get((gid, op))
        if sums is None:
            if len(window.ops) >= MAX_GROUPS * MAX_OPS:
                return
            sums = window.ops[(gid, op)] = [0, 0, 0, 0]
        nbytes = self._bytes.get(aid)
        sums[0] += 1
        sums[1] = sums[1] + nbytes if sums[1] is not None and nbytes is not None else None
        if timed:
            sums[2] += t_end - t_begin
            sums[3] += 1
        if exposed:
            window.exposed_ns += t_end - t_begin
        else:
            window.exposed_known = False

    def _group_cpu(self, gid: int) -> bool:
        """Whether every backend of group ``gid`` runs on the CPU (a call's return is its completion)."""
        if gid >= len(self._cpu):
            self._cpu = [group.cpu for group in self._rec.groups()]
        return 0 <= gid < len(self._cpu) and self._cpu[gid]

    def _close(self, end_local: int, current: int) -> None:
        cur, self._cur = self._cur, self._next
        self._next = _Window()
        issued = self._count_issued()
        summary = self._summary(cur, issued)
        window = self._window
        self._rec.log.write(["l", window, self._t0, end_local, summary])
        if self._exchange is not None:
            clock = self._rec.clock
            doc = dict(summary, rank=self._rec.rank, host=socket.gethostname()[:MAX_TEXT], folder=self._folder[:1000],
                       window=window, t0_ns=self._t0 + self._offset, t1_ns=end_local + self._offset,
                       clock_rtt_ns=clock[1] if clock is not None else None, pid=os.getpid())
            for name, group in doc["groups"].items():
                group.update(self._describe(name))
            self._exchange.publish(window, orjson.dumps(doc))
        self._t0 = end_local
        self._window = max(current, window + 1)

    def _summary(self, window: _Window, issued: dict[int, int | None]) -> dict[str, Any]:
        name = self._rec.group_name
        groups: dict[str, dict[str, Any]] = {}
        for gid, n in issued.items():
            if n:
                groups[name(gid)] = {"issued": n, "ops": {}}
        for (gid, op), (n, nbytes, time_ns, timed) in window.ops.items():
            group = groups.setdefault(name(gid), {"issued": issued.get(gid), "ops": {}})
            if len(group["ops"]) < MAX_OPS:
                group["ops"][op] = {"n": n, "bytes": nbytes, "time_ns": time_ns, "timed": timed}
        for gid, arrivals in window.arrivals.items():
            stride = 1
            while len(arrivals) > MAX_ARRIVALS * stride:
                stride *= 2
            group = groups.setdefault(name(gid), {"issued": issued.get(gid), "ops": {}})
            group["stride"] = stride
            kept = [(seq, t) for seq, t in arrivals if seq % stride == 0]
            group["seqs"] = [seq for seq, _ in kept]
            group["arrivals_us"] = [(t - self._t0) // 1000 for _, t in kept]
        steps = window.step_times
        lengths = [b - a for a, b in zip([self._last_step, *steps], steps) if a is not None]
        if steps:
            self._last_step = steps[-1]
        return {"steps": len(steps), "step_ns": round(median(lengths)) if lengths else None,
                "exposed_ns": window.exposed_ns if window.exposed_known else None,
                "groups": dict(list(groups.items())[:MAX_GROUPS])}

    def _count_issued(self) -> dict[int, int | None]:
        """Per declared group, the collectives its sequence counter says were issued since the last call."""
        out: dict[int, int | None] = {}
        for gid, group in enumerate(self._rec.groups()[:MAX_GROUPS]):
            counter = group.seq_counter
            try:
                now = counter() - group.p2p_consumed if counter is not None else None
            except Exception:  # a group destroyed meanwhile
                now = None
            before = self._issued_at.get(gid)
            if now is not None:
                self._issued_at[gid] = now
            out[gid] = now - before if now is not None and before is not None else None
        return out

    def _describe(self, name: str) -> dict[str, Any]:
        """A group's description and members for the gatherer: consecutive members as ``ranks_span``."""
        for group in self._rec.groups():
            if group.name == name:
                ranks = group.ranks
                if ranks and ranks == list(range(ranks[0], ranks[0] + len(ranks))):
                    return {"desc": group.desc[:MAX_TEXT], "ranks_span": [ranks[0], ranks[0] + len(ranks)]}
                return {"desc": group.desc[:MAX_TEXT], "ranks": ranks[:4096]}
        return {"desc": "", "ranks": []}
