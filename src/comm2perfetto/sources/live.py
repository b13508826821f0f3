"""Read a live stall snapshot (``.live/stall.<gen>.json``, written by record/live.py) into checked plain data.

Every field the live verdict uses is checked here, once: a rank summary with a wrong type is dropped, a group
or a pending entry with one is left out, stacks are cut to ``MAX_FRAMES`` strings. The raw format::

    {"format": "comm2perfetto-live", "version": 1, "gen": 1, "world_size": 2, "gathered_ns": ..., "ranks": [
      {"rank": 0, "host": "node0", "t_ns": ..., "step": 3, "stack": ["job.py:57 main"],
       "groups": {"0": {"desc": "default_pg", "ranks": [0, 1], "issued": 4,
                        "pending": {"op": "all_reduce", "seq": 4, "since_ns": ..., "source": "patch"}}}}]}

Never imports torch.
"""

from __future__ import annotations

import os
from typing import Any

import orjson

FORMAT = "comm2perfetto-live"
MAX_BYTES = 256 << 20  # a snapshot of 100,000 ranks is a few tens of MB
MAX_FRAMES = 16
MAX_GROUPS = 64
MAX_MEMBERS = 1 << 20


class LiveSnapshotError(ValueError):
    """The file is not a usable live snapshot."""


def read_snapshot(path: str) -> dict[str, Any]:
    """The snapshot with every rank summary checked; raises LiveSnapshotError when unusable."""
    try:
        if not os.path.isfile(path) or os.path.getsize(path) > MAX_BYTES:
            raise LiveSnapshotError(f"{path}: not a regular file of at most {MAX_BYTES >> 20} MB")
        with open(path, "rb") as f:
            doc = orjson.loads(f.read())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise LiveSnapshotError(f"{path}: unreadable ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise LiveSnapshotError(f"{path}: not a comm2perfetto live snapshot")
    world = doc.get("world_size")
    if not _is_int(world) or not 0 < world <= MAX_MEMBERS:
        raise LiveSnapshotError(f"{path}: bad world_size {world!r}")
    ranks = []
    seen: set[int] = set()
    for raw in doc.get("ranks") if isinstance(doc.get("ranks"), list) else ():
        summary = _rank_summary(raw, world)
        if summary is not None and summary["rank"] not in seen:
            seen.add(summary["rank"])
            ranks.append(summary)
    gen = doc.get("gen")
    return {"format": FORMAT, "gen": gen if _is_int(gen) else None, "world_size": world,
            "gathered_ns": doc.get("gathered_ns") if _is_int(doc.get("gathered_ns")) else None, "ranks": ranks}


def _rank_summary(raw: Any, world: int) -> dict[str, Any] | None:
    if not isinstance(raw, dict):
        return None
    rank = raw.get("rank")
    if not _is_int(rank) or not 0 <= rank < world:
        return None
    groups = {}
    raw_groups = raw.get("groups") if isinstance(raw.get("groups"), dict) else {}
    for name, g in list(raw_groups.items())[:MAX_GROUPS]:
        if not isinstance(g, dict):
            continue
        members = g.get("ranks") if isinstance(g.get("ranks"), list) else []
        issued = g.get("issued")
        groups[str(name)] = {
            "desc": str(g.get("desc") or "")[:200],
            "ranks": [r for r in members[:MAX_MEMBERS] if _is_int(r) and 0 <= r < world],
            "issued": issued if _is_int(issued) and issued >= 0 else None,
            "pending": _pending(g.get("pending")),
        }
    stack = raw.get("stack") if isinstance(raw.get("stack"), list) else []
    return {"rank": rank, "host": str(raw.get("host") or "")[:200], "groups": groups,
            "stack": [str(line)[:200] for line in stack[:MAX_FRAMES]],
            "step": raw.get("step") if _is_int(raw.get("step")) else None}


def _pending(raw: Any) -> dict[str, Any] | None:
    if not isinstance(raw, dict):
        return None
    op, seq, since = raw.get("op"), raw.get("seq"), raw.get("since_ns")
    if not isinstance(op, str) or not _is_int(seq) or seq < 0 or not _is_int(since) or since < 0:
        return None
    return {"op": op[:100], "seq": seq, "since_ns": since, "source": str(raw.get("source") or "")[:10]}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
