"""One rank's Flight Recorder snapshots as one list of entries: the recorder dumps a ring buffer again and again,
so consecutive dumps overlap; their union, by record, later snapshots winning, and what two snapshots that
disagree about one record say (two jobs or runs in one folder). Never imports torch.
"""

from __future__ import annotations

from typing import Any

from comm2perfetto.sources.fr.dump import FrDump
from comm2perfetto.sources.fr.fields import Damage, name_ok, record_key, snapshot_age
from comm2perfetto.sources.limits import count_ok

__all__ = ["merge_snapshots"]


def merge_snapshots(dumps: list[FrDump], damage: Damage) -> tuple[list[dict[str, Any]], str | None]:
    """Union of the entries of several ring-buffer snapshots of one rank, later snapshots winning.

    Returns the entries in record order and a conflict message when two snapshots disagree about the
    same record (they come from different jobs or runs). An entry whose name or record id is unreadable is
    placed by its neighbours in its dump (a ring lists consecutive record ids), its name read from an older
    copy of the record where one is there (``_mend_key``); one that cannot be placed is skipped.
    """
    if len(dumps) == 1:
        return dumps[0].entries, None
    merged: dict[tuple[str, int], dict[str, Any]] = {}
    conflict = None
    # Snapshots of one rank describe one default group; two sizes mean two jobs' dumps of the same rank.
    worlds = sorted((len(d.pg_config["0"].ranks), str(d.path)) for d in dumps
                    if "0" in d.pg_config and d.pg_config["0"].ranks is not None)
    if worlds and worlds[0][0] != worlds[-1][0]:
        (na, a), (nb, b) = worlds[0], worlds[-1]
        conflict = f"{a} and {b} are dumps of the same rank from jobs of {na} and {nb} ranks"
    for d in sorted(dumps, key=snapshot_age):
        for i, e in enumerate(d.entries):
            key = record_key(e, i)
            if key is None:
                key = _placed(d.entries, i)
                if key is None:
                    damage.lost(e)
                    continue
                e = _mend_key(e, key, merged.get(key), d, damage)
            old = merged.get(key)
            if old is not None:
                if conflict is None and _disagree(old, e):
                    conflict = (f"{d.path.name} and another dump of the same rank disagree about record {key[1]} "
                                "(different jobs or runs in one folder)")
                if "frames" in old and not e.get("frames"):
                    # a periodic dump leaves stacks out (record/flight.py): keep those an earlier dump had
                    e = dict(e, frames=old["frames"])
            merged[key] = e
    order = sorted(merged, key=lambda k: (k[1], _created(merged[k]) or 0))
    return [merged[k] for k in order], conflict


def _mend_key(e: dict[str, Any], key: tuple[str, int], older: dict[str, Any] | None, d: FrDump,
              damage: Damage) -> dict[str, Any]:
    """``e``, placed at ``key`` by its neighbours, with its unreadable record id read from there and its
    unreadable name from ``older`` (the record's copy in an older dump) where there is one (else it stays
    unreadable, for the checks to skip the entry); each named in ``damage``."""
    mended = {}
    rid, name = e.get("record_id"), e.get("profiling_name")
    if not count_ok(rid):
        mended["record_id"] = key[1]
        damage.mended(e, "record_id", rid, f"read as {key[1]}, between its neighbours in {d.path.name}")
    if not name_ok(name) and older is not None:
        mended["profiling_name"] = older["profiling_name"]
        damage.mended(e, "profiling_name", name, f"read from the same record in {damage.origin(older)}")
    return dict(e, **mended) if mended else e


def _disagree(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Two copies of one record that cannot be one record: another creation time or name (where both are
    readable: a damaged field is no evidence of another run)."""
    ta, tb = _created(a), _created(b)
    na, nb = a.get("profiling_name"), b.get("profiling_name")
    return (ta is not None and tb is not None and ta != tb) or (name_ok(na) and name_ok(nb) and na != nb)


def _placed(entries: list[dict[str, Any]], i: int) -> tuple[str, int] | None:
    """The key of ``entries[i]`` (whose own is unreadable) from its neighbours, where they agree with each
    other and with what of its own is readable."""
    keys = set()
    for j, step in ((i - 1, 1), (i + 1, -1)):
        if 0 <= j < len(entries) and (k := record_key(entries[j], j)) is not None:
            keys.add((k[0], k[1] + step))
    if len(keys) != 1:
        return None
    key = keys.pop()
    name, rid = entries[i].get("profiling_name"), entries[i].get("record_id")
    if (name_ok(name) and name.partition(":")[0] != key[0]) or (count_ok(rid) and rid != key[1]):
        return None
    return key


def _created(e: dict[str, Any]) -> int | None:
    t = e.get("time_created_ns")
    return t if count_ok(t) else None  # NaN, which equals nothing, is no time either
