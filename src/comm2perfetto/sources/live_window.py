"""Read the last gathered window (``live/window.json``, written by record/gather.py) into checked plain data, for
``comm2perfetto record`` (metrics.prom, straggler events) and ``comm2perfetto top``. Never imports torch.

Every field is checked here, once: a rank, group or event with a wrong type is dropped, a figure with one is
unknown (None). The raw format (docs/live.md)::

    {"format": "comm2perfetto-window", "version": 1, "attempt": 0, "window": 359181722, "every_s": 5.0,
     "end_ns": 1795908615000000000, "gathered_ns": 1795908615949854660, "gathered_by": 0, "world_size": 4,
     "missing": [], "ranks": [{"rank": 2, "host": "node1", "folder": "/runs/r1", "pid": 4242, "window_s": 5.0,
       "steps": 9, "step_s": 0.52, "comm_s": 0.31, "exposed_s": 0.31, "clock": "measured"}, ...],
     "groups": [{"group": "0", "desc": "default_pg", "size": 4, "compared": 4, "matched": 43,
       "spread_s": 0.00069, "ranks": [{"rank": 2, "mean_s": 0.0329, "excess_s": 0.0305, "last_share": 1.0,
                                      "threshold_s": 0.00207, "late": true}, ...]}],
     "stragglers": [{"rank": 2, "group": "0", "since": 359181721}],
     "events": [{"event": "start", "rank": 2, "group": "0", ...}],
     "detail": [{"rank": 2, "groups": {"0": {"desc": "default_pg", "issued": 86,
                  "ops": {"all_reduce": {"n": 87, "bytes": 348000, "time_ns": 566131676, "timed": 87}}}}}, ...]}
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from comm2perfetto.errors import Comm2PerfettoError
from comm2perfetto.sources.json_document import read_json_document
from comm2perfetto.sources.limits import (
    count_ok,
    rank_ok,
    shown,
    time_ok,
    world_ok,
)

__all__ = ["GroupRow", "LiveWindowError", "Member", "OpRow", "RankRow", "Window", "read_window"]

FORMAT = "comm2perfetto-window"
MAX_BYTES = 256 << 20
MAX_GROUPS = 64
MAX_OPS = 32
MAX_EVENTS = 4096
MAX_TEXT = 200


class LiveWindowError(Comm2PerfettoError, ValueError):
    """The file is not a usable gathered window."""


class RankRow(NamedTuple):
    rank: int
    host: str
    window_s: float | None
    steps: int | None
    step_s: float | None
    comm_s: float | None
    exposed_s: float | None
    clock: str  # "measured", "untrusted" (a round trip over 100 ms) or "none"


class Member(NamedTuple):
    """A rank's lateness in one group (lateness.py): None where not known."""

    rank: int
    mean_s: float | None
    excess_s: float | None
    last_share: float | None
    threshold_s: float | None
    late: bool | None


class GroupRow(NamedTuple):
    group: str
    desc: str
    size: int
    matched: int
    spread_s: float | None
    members: tuple[Member, ...]


class OpRow(NamedTuple):
    """One op of one group on one rank of the writing folder, in the window: completed calls, their input
    bytes (None: some unknown) and, where every call's completion was seen, their time."""

    rank: int
    group: str
    desc: str
    op: str
    calls: int
    bytes: int | None
    time_s: float | None


class Window(NamedTuple):
    attempt: int
    window: int
    every_s: float
    end_ns: int | None
    gathered_by: int | None
    world_size: int
    missing: tuple[int, ...]
    ranks: tuple[RankRow, ...]
    groups: tuple[GroupRow, ...]
    stragglers: tuple[tuple[int, str, int], ...]  # (rank, group, first late window)
    events: tuple[dict[str, Any], ...]
    detail: tuple[OpRow, ...]  # the writing folder's ranks

    def group_sizes(self) -> dict[str, int]:
        return {g.group: g.size for g in self.groups}


def read_window(path: str | Path) -> Window:
    """The window with every part checked; raises LiveWindowError when unusable."""
    path = Path(path)
    doc = read_json_document(path, FORMAT, "comm2perfetto window", LiveWindowError, MAX_BYTES)
    if doc.get("version") != 1:
        raise LiveWindowError(f"{path}: window format version {shown(doc.get('version'))} is not 1")
    world, window, every = doc.get("world_size"), doc.get("window"), doc.get("every_s")
    if not world_ok(world) or not count_ok(window) or not _seconds_ok(every) or not every:
        raise LiveWindowError(f"{path}: bad world_size, window or every_s ({shown(world)}, {shown(window)}, "
                              f"{shown(every)})")
    ranks: dict[int, RankRow] = {}
    for raw in _dicts(doc.get("ranks")):
        row = _rank_row(raw, world)
        if row is not None:
            ranks.setdefault(row.rank, row)
    groups = [row for row in (_group_row(raw, world) for raw in _dicts(doc.get("groups"))[:MAX_GROUPS]) if row]
    stragglers = tuple((s["rank"], s["group"][:MAX_TEXT], s["since"]) for s in _dicts(doc.get("stragglers"))
                       if rank_ok(s.get("rank"), world) and isinstance(s.get("group"), str)
                       and count_ok(s.get("since")))
    events = tuple(e for e in _dicts(doc.get("events"))[:MAX_EVENTS] if _event_ok(e, world))
    detail = tuple(row for raw in _dicts(doc.get("detail")) for row in _op_rows(raw, world))
    missing = doc.get("missing")
    return Window(
        attempt=doc["attempt"] if count_ok(doc.get("attempt")) else 0, window=doc["window"],
        every_s=float(doc["every_s"]),
        end_ns=doc["end_ns"] if time_ok(doc.get("end_ns")) else None,
        gathered_by=doc["gathered_by"] if rank_ok(doc.get("gathered_by"), world) else None, world_size=world,
        missing=tuple(r for r in missing if rank_ok(r, world)) if isinstance(missing, list) else (),
        ranks=tuple(sorted(ranks.values())), groups=tuple(groups), stragglers=stragglers, events=events,
        detail=detail)


def _dicts(raw: Any) -> list[dict[str, Any]]:
    return [x for x in raw if isinstance(x, dict)] if isinstance(raw, list) else []


def _seconds_ok(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < 1e9


def _seconds(v: Any) -> float | None:
    return float(v) if _seconds_ok(v) else None


def _share(v: Any) -> float | None:
    return float(v) if _seconds_ok(v) and v <= 1 else None


def _signed_seconds(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v) < 1e9 else None


def _rank_row(raw: dict[str, Any], world: int) -> RankRow | None:
    if not rank_ok(raw.get("rank"), world):
        return None
    clock = raw.get("clock")
    return RankRow(rank=raw["rank"], host=str(raw.get("host") or "")[:MAX_TEXT], window_s=_seconds(raw.get("window_s")),
                   steps=raw["steps"] if count_ok(raw.get("steps")) else None, step_s=_seconds(raw.get("step_s")),
                   comm_s=_seconds(raw.get("comm_s")), exposed_s=_seconds(raw.get("exposed_s")),
                   clock=clock if clock in ("measured", "untrusted", "none") else "none")


def _group_row(raw: dict[str, Any], world: int) -> GroupRow | None:
    if not isinstance(raw.get("group"), str) or not count_ok(raw.get("size")) or raw["size"] > world:
        return None
    members = []
    for m in _dicts(raw.get("ranks"))[:world]:
        if not rank_ok(m.get("rank"), world):
            continue
        share, late = m.get("last_share"), m.get("late")
        members.append(Member(rank=m["rank"], mean_s=_seconds(m.get("mean_s")),
                              excess_s=_signed_seconds(m.get("excess_s")),
                              last_share=_share(share),
                              threshold_s=_seconds(m.get("threshold_s")),
                              late=late if isinstance(late, bool) else None))
    return GroupRow(group=raw["group"][:MAX_TEXT], desc=str(raw.get("desc") or "")[:MAX_TEXT], size=raw["size"],
                    matched=raw["matched"] if count_ok(raw.get("matched")) else 0,
                    spread_s=_seconds(raw.get("spread_s")), members=tuple(members))


def _event_ok(e: dict[str, Any], world: int) -> bool:
    """A straggler event (lateness.py, record/gather.py), kept as written once its fields check."""
    windows = e.get("windows")
    return (e.get("event") in ("start", "end") and rank_ok(e.get("rank"), world) and isinstance(e.get("group"), str)
            and _seconds_ok(e.get("mean_lateness_s")) and _seconds_ok(e.get("last_share"))
            and isinstance(windows, list) and all(count_ok(w) for w in windows) and count_ok(e.get("window")))


def _op_rows(raw: dict[str, Any], world: int) -> list[OpRow]:
    """The op rows of one rank's summary in ``detail``."""
    if not rank_ok(raw.get("rank"), world) or not isinstance(raw.get("groups"), dict):
        return []
    rank, groups = raw["rank"], raw["groups"]
    rows = []
    for name, g in list(groups.items())[:MAX_GROUPS]:
        if not isinstance(g, dict) or not isinstance(g.get("ops"), dict):
            continue
        for op, sums in list(g["ops"].items())[:MAX_OPS]:
            if not isinstance(sums, dict) or not count_ok(sums.get("n")):
                continue
            time_ns, timed, nbytes = sums.get("time_ns"), sums.get("timed"), sums.get("bytes")
            rows.append(OpRow(rank=rank, group=str(name)[:MAX_TEXT], desc=str(g.get("desc") or "")[:MAX_TEXT],
                              op=str(op)[:MAX_TEXT], calls=sums["n"], bytes=nbytes if count_ok(nbytes) else None,
                              time_s=sums["time_ns"] / 1e9 if count_ok(time_ns) and timed == sums["n"] else None))
    return rows
