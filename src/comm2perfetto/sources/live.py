"""Read a live stall snapshot (``.live/stall.<gen>.json``, written by record/live.py) into checked plain data.

Every field the live verdict uses is checked here, once: a rank summary with a wrong type is dropped, a group
or a pending entry with one is left out, stacks are cut to ``MAX_FRAMES`` strings. The raw format::

    {"format": "comm2perfetto-live", "version": 1, "gen": 1, "world_size": 2, "gathered_ns": ..., "ranks": [
      {"rank": 0, "host": "node0", "t_ns": ..., "step": 3, "stack": ["job.py:57 main"], "groups_complete": true,
       "groups": {"0": {"desc": "default_pg", "ranks": [0, 1], "issued": 4,
                        "pending": {"op": "all_reduce", "seq": 4, "since_ns": ..., "source": "patch",
                                    "numel": 16, "dtypes": ["Float"]},
                        "p2p": [{"op": "recv", "peer": 1, "n": 3, "since_ns": ...}],
                        "p2p_issued": [["send", 1, 3], ["recv", 1, 2]],
                        "recent": [[3, 1795313441406614332, "all_reduce", 16], [4, 1795313442406614332]]}}}]}

``recent`` holds each recent collective's seq and issue time, and what the rank passed to it (op, elements)
where known.

Never imports torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from comm2perfetto.errors import Comm2PerfettoError
from comm2perfetto.sources.json_document import read_json_document
from comm2perfetto.sources.limits import (
    count_ok,
    rank_ok,
    shown,
    time_ok,
    world_ok,
)

__all__ = ["LiveSnapshotError", "read_snapshot"]

FORMAT = "comm2perfetto-live"
MAX_BYTES = 256 << 20  # a snapshot of 100,000 ranks is a few tens of MB
MAX_FRAMES = 16
MAX_GROUPS = 64
MAX_RECENT = 16
MAX_P2P = 64


class LiveSnapshotError(Comm2PerfettoError, ValueError):
    """The file is not a usable live snapshot."""


def read_snapshot(path: str) -> dict[str, Any]:
    """The snapshot with every rank summary checked; raises LiveSnapshotError when unusable."""
    doc = read_json_document(Path(path), FORMAT, "comm2perfetto live snapshot", LiveSnapshotError, MAX_BYTES)
    world = doc.get("world_size")
    if not world_ok(world):
        raise LiveSnapshotError(f"{path}: bad world_size {shown(world)}")
    ranks = []
    seen: set[int] = set()
    raw_ranks = doc.get("ranks")
    for raw in raw_ranks if isinstance(raw_ranks, list) else ():
        summary = _rank_summary(raw, world)
        if summary is not None and summary["rank"] not in seen:
            seen.add(summary["rank"])
            ranks.append(summary)
    gen = doc.get("gen")
    return {"format": FORMAT, "gen": gen if count_ok(gen) else None, "world_size": world,
            "gathered_ns": doc.get("gathered_ns") if time_ok(doc.get("gathered_ns")) else None, "ranks": ranks}


def _rank_summary(raw: Any, world: int) -> dict[str, Any] | None:
    if not isinstance(raw, dict):
        return None
    rank = raw.get("rank")
    if not rank_ok(rank, world):
        return None
    groups = {}
    raw_groups = raw.get("groups")
    for name, g in list(raw_groups.items() if isinstance(raw_groups, dict) else ())[:MAX_GROUPS]:
        if not isinstance(g, dict):
            continue
        members = g.get("ranks")
        members = members if isinstance(members, list) else []
        issued = g.get("issued")
        recent = [x for x in _list(g.get("recent"))[-MAX_RECENT:]
                  if isinstance(x, list) and len(x) in (2, 4) and count_ok(x[0]) and time_ok(x[1])]
        groups[str(name)] = {
            "desc": str(g.get("desc") or "")[:200],
            "ranks": [r for r in members[:world] if rank_ok(r, world)],
            "issued": issued if count_ok(issued) else None,
            "pending": _pending(g.get("pending")),
            "p2p": [p for p in map(lambda q: _p2p(q, world), _list(g.get("p2p"))[:MAX_P2P]) if p is not None],
            "recent": [[x[0], x[1]] for x in recent],
            # what it passed to its recent collectives, where known: [seq, op, elements]
            "passed": [[x[0], x[2][:100], x[3]] for x in recent if len(x) == 4 and isinstance(x[2], str)
                       and count_ok(x[3])],
            "p2p_issued": [[x[0], x[1], x[2]] for x in _list(g.get("p2p_issued"))[:MAX_P2P]
                           if isinstance(x, list) and len(x) == 3 and x[0] in ("send", "recv")
                           and rank_ok(x[1], world) and count_ok(x[2])],
        }
    stack = raw.get("stack")
    stack = stack if isinstance(stack, list) else []
    return {"rank": rank, "host": str(raw.get("host") or "")[:200], "groups": groups,
            "groups_complete": raw.get("groups_complete") is True and len(groups) < MAX_GROUPS,
            "stack": [str(line)[:200] for line in stack[:MAX_FRAMES]],
            "step": raw.get("step") if count_ok(raw.get("step")) else None}


def _list(raw: Any) -> list:
    return raw if isinstance(raw, list) else []


def _p2p(raw: Any, world: int) -> dict[str, Any] | None:
    """A send or receive a rank is inside: ``{"op": "irecv", "peer": 1, "since_ns": ...}``."""
    if not isinstance(raw, dict):
        return None
    op, peer, since, n = raw.get("op"), raw.get("peer"), raw.get("since_ns"), raw.get("n")
    if not isinstance(op, str) or not rank_ok(peer, world) or not time_ok(since):
        return None
    return {"op": op[:100], "peer": peer, "n": n if count_ok(n) else None, "since_ns": since}


def _pending(raw: Any) -> dict[str, Any] | None:
    if not isinstance(raw, dict):
        return None
    op, seq, since = raw.get("op"), raw.get("seq"), raw.get("since_ns")
    if not isinstance(op, str) or not count_ok(seq) or not time_ok(since):
        return None
    out = {"op": op[:100], "seq": seq, "since_ns": since, "source": str(raw.get("source") or "")[:10]}
    if rank_ok(raw.get("root")):
        out["root"] = raw["root"]
    dtypes = raw.get("dtypes")
    if count_ok(raw.get("numel")) and isinstance(dtypes, list) and all(isinstance(d, str) for d in dtypes[:8]):
        out["numel"], out["dtypes"] = raw["numel"], [d[:40] for d in dtypes[:8]]
    return out
