"""The Python stacks every rank writes at a stall (``rank<R>.stacks.<n>.json``), read and checked into typed
records. Never imports torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from comm2perfetto.model import RankClock
from comm2perfetto.sources.event_log import EventLogError
from comm2perfetto.sources.json_document import read_json_document
from comm2perfetto.sources.limits import count_ok, is_int, rank_ok, shown, time_ok

__all__ = ["PendingCall", "StallStacks", "ThreadStack", "read_stacks"]


# The stall stacks' types are NamedTuples: a dataclass costs every command's start-up ten times as much to define
# (0.3 against 0.05 ms each), and these are read only where a job stalled.
class ThreadStack(NamedTuple):
    tid: int | None
    name: str
    frames: tuple[tuple[str, int, str], ...]  # (file, line, function), innermost first


class PendingCall(NamedTuple):
    """A call the rank was inside when it wrote its stacks (the call's ``b`` record)."""

    cid: int | None
    op: str | None
    gid: int | None
    seq: int | None
    since_ns: int | None


class StallStacks(NamedTuple):
    """Every thread's Python stack, as one rank wrote them at a stall (``read_stacks``)."""

    path: str
    rank: int
    t_ns: int | None
    reason: str | None
    trigger_rank: int | None
    pending: tuple[PendingCall, ...]
    threads: tuple[ThreadStack, ...]

    def shifted(self, clock: RankClock) -> StallStacks:
        """The same stacks with their times moved through ``clock`` (onto the job's clock: ``match.build_job``)."""
        if not clock:
            return self
        pending = tuple(p._replace(since_ns=clock(p.since_ns) if p.since_ns is not None else None)
                        for p in self.pending)
        return self._replace(t_ns=clock(self.t_ns) if self.t_ns is not None else None, pending=pending)

    def main_thread(self) -> ThreadStack | None:
        """The thread the training ran on: the one named MainThread, else the first."""
        return next((t for t in self.threads if t.name == "MainThread"), self.threads[0] if self.threads else None)


def read_stacks(path: str | Path) -> StallStacks:
    """Read a ``rank<R>.stacks.<n>.json`` file written at a stall, keeping only well-formed parts::

        {"format": "comm2perfetto-stacks", "version": 1, "rank": 0, "t_ns": 1795616243676433540,
         "reason": "pending", "trigger_rank": 0,
         "pending": [{"cid": 8, "op": "all_reduce", "gid": 1, "seq": 4, "since_ns": 1795616241666952270}],
         "threads": [{"tid": 1399, "name": "MainThread",
                      "frames": [{"file": ".../distributed_c10d.py", "line": 3252, "func": "all_reduce"}]}]}

    Raises EventLogError when the file is not one or its rank is not a rank; malformed threads, frames and
    pending entries are dropped, a bad time or field becomes None.
    """
    path = Path(path)
    doc = read_json_document(path, "comm2perfetto-stacks", "comm2perfetto stacks file", EventLogError)
    rank = doc.get("rank")
    if not isinstance(rank, int) or not rank_ok(rank):
        raise EventLogError(f"{path}: stacks file's rank {shown(rank)} is not a rank")
    trigger = doc.get("trigger_rank")
    return StallStacks(
        path=str(path), rank=rank, t_ns=doc.get("t_ns") if time_ok(doc.get("t_ns")) else None,
        reason=doc.get("reason") if isinstance(doc.get("reason"), str) else None,
        trigger_rank=trigger if rank_ok(trigger) else None,
        pending=tuple(_pending(p) for p in _dicts(doc.get("pending"))),
        threads=tuple(_thread(t) for t in _dicts(doc.get("threads"))),
    )


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [x for x in value if isinstance(x, dict)] if isinstance(value, list) else []


def _pending(p: dict[str, Any]) -> PendingCall:
    def number(key: str) -> int | None:
        return p[key] if is_int(p.get(key)) else None

    return PendingCall(cid=number("cid"), op=p["op"] if isinstance(p.get("op"), str) else None, gid=number("gid"),
                       seq=number("seq"), since_ns=p["since_ns"] if time_ok(p.get("since_ns")) else None)


def _thread(t: dict[str, Any]) -> ThreadStack:
    frames = tuple((f["file"], f["line"], f["func"]) for f in _dicts(t.get("frames"))
                   if isinstance(f.get("file"), str) and count_ok(f.get("line")) and isinstance(f.get("func"), str))
    name = t.get("name")
    return ThreadStack(tid=t.get("tid") if is_int(t.get("tid")) else None, name=name if isinstance(name, str) else "",
                       frames=frames)
