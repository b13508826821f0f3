"""What each field of a Flight Recorder entry must be, and what a field that fails reads as. Never imports torch.

A damaged field is not evidence. One entry whose ``time_discovered_completed_ns`` is a string must not make its
collective look "never issued" by that rank, nor one NaN ``time_created_ns`` make a job look like two. So the
check is per field, and a field that fails it is skipped (read as unknown) and named in one note per file,
while the rest of its entry is read::

    {'record_id': 6, 'process_group': ('0', 'default_pg'), 'collective_seq_id': 7,
     'profiling_name': 'gloo:all_reduce', 'time_discovered_completed_ns': 'zero', ...}
    -> all_reduce #7 on default_pg, completion time unknown;
       "rank0.fr.2.pkl: ... time_discovered_completed_ns of record 6 (all_reduce #7 on default_pg) is 'zero',
        not a time"

Where a rank has several dumps (periodic dumps overlap), the same record's copy in another dump gives the field
instead, when it is sound there and cannot have changed since (a state only when ``completed``). Only where the
entry's identity fails (its name, its group, its sequence number; its ``is_p2p`` where the name cannot tell) is
the entry skipped, and then the seqs it may have held are ``unread``: that rank's record of them is unknown, never
"missing" (a rank without a record of a collective Flight Recorder would have recorded reads as never having
issued it). ``None`` is an absent field (as older formats leave fields out), not damage: unknown where the
format allows the field to be absent, else (a name, a group, a seq) an identity that cannot be read.

``ingest.py`` checks whole columns in C and calls ``repair_rows`` only for a rank whose columns fail.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from comm2perfetto.model import COMPLETED, SCHEDULED, STARTED
from comm2perfetto.sources.fr.dump import P2P_OPS, FrDump, split_profiling_name
from comm2perfetto.sources.fr.tables import dtypes_ok, sizes_ok
from comm2perfetto.sources.limits import MAX_TIME_NS, MIN_TIME_NS, count_ok, shown

# The keys every entry has since format 2.4, in the order of a row (``ingest._columns``).
ROW_KEYS = (
    "profiling_name", "process_group", "collective_seq_id", "is_p2p", "state", "time_discovered_started_ns",
    "time_discovered_completed_ns", "time_created_ns", "input_sizes", "input_dtypes", "output_sizes",
    "output_dtypes", "record_id",
)
NAME, PG, SEQ, P2P, STATE, T_STARTED, T_COMPLETED, T_CREATED, RECORD = 0, 1, 2, 3, 4, 5, 6, 7, 12
FR_STATES = frozenset({SCHEDULED, STARTED, COMPLETED})  # what Flight Recorder writes
ANY_GROUP = None  # the key of ``unread`` seqs whose group is unknown too: they hold in every group
MAX_SEQ = MAX_TIME_NS


def name_ok(name: Any) -> TypeGuard[str]:
    """A profiling name: ``backend:op`` (``gloo:all_reduce``, ``nccl:send 0->1``)."""
    if type(name) is not str:
        return False
    backend, colon, op = name.partition(":")
    return bool(backend and colon and op.strip())


def pg_ok(pg: Any) -> TypeGuard[tuple[str, str] | list[str]]:
    """A process group as entries name it: (name, description), a list in JSON."""
    return isinstance(pg, (tuple, list)) and len(pg) == 2 and all(isinstance(x, str) for x in pg)


def time_ok(t: Any) -> bool:
    """A discovered start or completion: integer ns in an int64, non-negative."""
    return type(t) is int and 0 <= t <= MAX_TIME_NS


def created_ok(t: Any) -> bool:
    """A creation time: integer ns of a job's event (after ``MIN_TIME_NS``), in an int64."""
    return type(t) is int and MIN_TIME_NS <= t <= MAX_TIME_NS


def duration_ok(ms: Any) -> bool:
    """FR's ``duration_ms``: a number of ms from 0 to a day (NaN fails both comparisons)."""
    return type(ms) in (float, int) and 0 <= ms < MAX_DURATION_MS


def frames_ok(frames: Any) -> bool:
    """A call stack: a list of frame records (``{'name': ..., 'filename': ..., 'line': ...}``)."""
    return isinstance(frames, list) and all(isinstance(f, dict) for f in frames)


# A day: longer than any collective completes (NCCL's timeout defaults to 10 minutes).
MAX_DURATION_MS = 86_400_000

# Per field: its check, and what a value that fails it is not. ``None`` (absent) never fails.
CHECKS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "profiling_name": (name_ok, "a collective's name (backend:op)"),
    "process_group": (pg_ok, "a group's (name, description)"),
    "collective_seq_id": (count_ok, "a sequence number"),
    "is_p2p": (lambda v: type(v) is bool, "true or false"),
    "state": (lambda v: type(v) is str and v in FR_STATES, "a state Flight Recorder writes"),
    "time_discovered_started_ns": (time_ok, "a time"),
    "time_discovered_completed_ns": (time_ok, "a time"),
    "time_created_ns": (created_ok, "a time of a job's event"),
    "input_sizes": (sizes_ok, "a list of sizes"),  # checked where signatures are made (tables.py)
    "input_dtypes": (dtypes_ok, "a list of dtypes"),
    "output_sizes": (sizes_ok, "a list of sizes"),
    "output_dtypes": (dtypes_ok, "a list of dtypes"),
    "record_id": (count_ok, "a record id"),
    "pg_id": (count_ok, "a group id"),
    "op_id": (count_ok, "an op id"),
    "p2p_seq_id": (count_ok, "a sequence number"),
    "duration_ms": (duration_ok, "a duration in ms"),
    "frames": (frames_ok, "a list of frames"),
}
# Fields that change between two dumps of one record, and the values that are final (a copy in an older dump
# gives such a field only then); every other field is written once, when the record is made.
_FINAL: dict[str, Callable[[Any], bool]] = {
    "state": lambda v: v == COMPLETED,
    "time_discovered_started_ns": lambda v: v is not None,
    "time_discovered_completed_ns": lambda v: v is not None,
    "duration_ms": lambda v: v is not None,
}


def record_key(e: dict[str, Any], index: int) -> tuple[str, int] | None:
    """The same record in several dumps of a rank: (backend, record id). Record ids count every entry of
    one Flight Recorder, the backend tells two recorders (the generic one and NCCL's) apart. None when
    either is unreadable."""
    name, rid = e.get("profiling_name"), e.get("record_id", index)
    if not name_ok(name) or not count_ok(rid):
        return None
    return name.partition(":")[0], rid


@dataclass(slots=True)
class Damage:
    """What failed its check in one rank's dumps: each damaged field and each entry skipped, for the notes;
    the seqs whose record is unknown (``unread``: group name, or ``ANY_GROUP`` -> closed intervals)."""

    dumps: list[FrDump]
    fields: list[tuple[dict[str, Any], str, Any, str | None]] = field(default_factory=list)  # ..., read instead
    skipped: list[tuple[dict[str, Any], str, Any]] = field(default_factory=list)
    unread: dict[str | None, list[tuple[int, int]]] = field(default_factory=dict)
    unread_p2p: set[str | None] = field(default_factory=set)  # groups (or ANY_GROUP) where a send/recv was lost
    _copies: dict[tuple[str, int], list[tuple[dict[str, Any], FrDump]]] | None = None
    _origins: dict[Any, str] | None = None  # id of an entry, or its record key -> the file it was read from

    def __bool__(self) -> bool:
        return bool(self.fields or self.skipped)

    def failed(self, e: dict[str, Any], key: str, value: Any) -> Any:
        """Record ``e``'s ``key`` (``value``) as damaged; return what to read instead: the value of the
        same record's copy in another dump where it is sound and final there, else None (unknown)."""
        check, final = CHECKS[key][0], _FINAL.get(key)
        for other, dump in self._copies_of(e):
            v = other.get(key)
            if v is not None and check(v) and (final is None or final(v)):
                self.fields.append((e, key, value, f"read from the same record in {dump.path.name}"))
                return v
        self.fields.append((e, key, value, None))
        return None

    def mended(self, e: dict[str, Any], key: str, value: Any, how: str) -> None:
        """Record ``e``'s ``key`` as damaged, and read from the entry's other fields (``how``)."""
        self.fields.append((e, key, value, how))

    def skip(self, e: dict[str, Any], key: str, value: Any) -> None:
        """Record ``e`` as skipped: its ``key`` (a part of its identity) failed its check."""
        self.skipped.append((e, key, value))

    def unread_seqs(self, group: str | None, lo: int, hi: int) -> None:
        self.unread.setdefault(group, []).append((lo, hi))

    def lost(self, e: dict[str, Any]) -> None:
        """Skip ``e``, which cannot be placed among the rank's records (its name or record id unreadable, and
        its neighbours no help): the seq it holds, where readable, reads as unknown (in its group where
        readable, else in every group), else every seq of its group does."""
        name, rid = e.get("profiling_name"), e.get("record_id")
        self.skip(e, *(("profiling_name", name) if not name_ok(name) else ("record_id", rid)))
        pg, seq = e.get("process_group"), e.get("collective_seq_id")
        group = pg[0] if pg_ok(pg) else ANY_GROUP
        p2p = maybe_p2p(name, e.get("is_p2p"))
        if p2p is not False:
            self.unread_p2p.add(group)
        if p2p is not True:
            self.unread_seqs(group, *((seq, seq) if count_ok(seq) else (0, MAX_SEQ)))

    def _copies_of(self, e: dict[str, Any]) -> list[tuple[dict[str, Any], FrDump]]:
        """The other copies of ``e``'s record in this rank's dumps, newest first (found when first asked:
        nothing is indexed while no field is damaged)."""
        if len(self.dumps) < 2:
            return []
        if self._copies is None:
            self._copies = {}
            for d in sorted(self.dumps, key=snapshot_age, reverse=True):
                for i, other in enumerate(d.entries):
                    k = record_key(other, i)
                    if k is not None:
                        self._copies.setdefault(k, []).append((other, d))
        key = record_key(e, -1)
        return [(o, d) for o, d in self._copies.get(key, ()) if o is not e] if key is not None else []

    def notes(self, rank: int) -> list[str]:
        """One line per file: its damaged fields, then its entries skipped (the first few of each told)."""
        by_file: dict[str, tuple[list[str], list[str]]] = {}
        for e, key, value, instead in self.fields:
            text = f"{key} of {describe(e)} is {shown(value)}, not {CHECKS[key][1]}"
            if instead is not None:
                text += f" ({instead})"
            by_file.setdefault(self.origin(e), ([], []))[0].append(text)
        for e, key, value in self.skipped:
            text = f"{describe(e)}: {key} is {shown(value)}, not {CHECKS[key][1]}"
            by_file.setdefault(self.origin(e), ([], []))[1].append(text)
        out = []
        for name, (fields, skipped) in sorted(by_file.items()):
            parts = []
            if fields:
                one = len(fields) == 1
                parts.append(f"{_count(len(fields), 'Flight Recorder field')} failed {'its' if one else 'their'} "
                             f"check, skipped (read as unknown unless said) while the rest of "
                             f"{'its entry' if one else 'each entry'} is read: {_first(fields)}")
            if skipped:
                one = len(skipped) == 1
                parts.append(f"{_count(len(skipped), 'Flight Recorder entry', 'Flight Recorder entries')} skipped, "
                             f"{'its' if one else 'their'} identity unreadable: {_first(skipped)}; what rank {rank} "
                             f"issued there reads as unknown, not as never issued")
            out.append(f"{name}: " + "; ".join(parts))
        return out

    def origin(self, e: dict[str, Any]) -> str:
        """The file an entry was read from: the newest dump that holds it (or, when the reader copied it,
        its record). Indexed when first asked."""
        if self._origins is None:
            self._origins = {}
            for d in sorted(self.dumps, key=snapshot_age):  # the newest last: it wins
                for i, x in enumerate(d.entries):
                    self._origins[id(x)] = d.path.name
                    if (k := record_key(x, i)) is not None:
                        self._origins[k] = d.path.name
        key = record_key(e, -1)
        return self._origins.get(id(e)) or (self._origins.get(key) if key is not None else None) \
            or self.dumps[-1].path.name

    def unread_spans(self) -> dict[str | None, tuple[tuple[int, int], ...]]:
        """``unread``, each group's intervals sorted and merged."""
        out = {}
        for group, spans in self.unread.items():
            merged: list[tuple[int, int]] = []
            for lo, hi in sorted(spans):
                if merged and lo <= merged[-1][1] + 1:
                    merged[-1] = (merged[-1][0], max(hi, merged[-1][1]))
                else:
                    merged.append((lo, hi))
            out[group] = tuple(merged)
        return out


def _count(n: int, one: str, many: str | None = None) -> str:
    return f"1 {one}" if n == 1 else f"{n:,} {many or one + 's'}"


def _first(items: list[str], shown_at_most: int = 3) -> str:
    more = len(items) - shown_at_most
    return "; ".join(items[:shown_at_most]) + (f"; and {more:,} more" if more > 0 else "")


def describe(e: dict[str, Any]) -> str:
    """An entry as a note names it, from its readable fields: ``record 6 (all_reduce #7 on default_pg)``."""
    rid, name, pg, seq = e.get("record_id"), e.get("profiling_name"), e.get("process_group"), \
        e.get("collective_seq_id")
    head = f"record {rid}" if count_ok(rid) else "a record"
    what = []
    if name_ok(name):
        op = split_profiling_name(name)[1]
        what.append(op + (f" #{seq}" if count_ok(seq) and op not in P2P_OPS else ""))
    if pg_ok(pg):
        what.append(f"on {pg[1] if pg[1] and pg[1] != 'undefined' else pg[0]}")
    return f"{head} ({' '.join(what)})" if what else head


def snapshot_age(d: FrDump) -> tuple[int, int, int]:
    """Sort key, oldest snapshot first: the one holding the newest records is the latest; between equal
    ones, the recorder's dump counter (file names do not sort by age: ``rank0.fr.10.pkl`` comes before
    ``rank0.fr.2.pkl``). The newest record id is read from the dump's last entries that have one."""
    last = next((r for e in reversed(d.entries[-4:]) if count_ok(r := e.get("record_id"))), -1)
    counter = _DUMP_COUNTER.search(d.path.name)
    return last, len(d.entries), int(counter.group(1)) if counter else 0


_DUMP_COUNTER = re.compile(r"\.(\d+)\.pkl$")  # rank3.fr.12.pkl -> 12


def is_p2p_by_name(name: str) -> bool | None:
    """Whether an entry is a send/recv, from its profiling name: None where the name cannot tell (a
    ``coalesced`` entry closes a batch of p2p ops or a coalesced collective alike)."""
    op = split_profiling_name(name)[1]
    if op in P2P_OPS:
        return True
    return None if op.endswith("coalesced") else False


def repair_rows(entries: list[dict[str, Any]], rows: Iterable[tuple], pg_ids: Sequence[Any],
                damage: Damage) -> tuple[list[dict[str, Any]], list[tuple]]:
    """The entries whose identity is sound, with their rows in ``ROW_KEYS`` order, each damaged field
    replaced by what ``Damage.failed`` reads instead; the others are skipped, and the seqs they may have held
    marked unread (``mark_unread``). ``pg_ids``: each entry's ``pg_id`` (a group whose name fails its check
    is the one the rank's other entries with that ``pg_id`` name)."""
    rows = list(rows)
    groups_by_id = _groups_by_pg_id(rows, pg_ids)
    kept: list[dict[str, Any]] = []
    kept_rows: list[tuple] = []
    lost: list[tuple[int, tuple]] = []  # (index in kept_rows where it would be, its row)
    for e, raw, pg_id in zip(entries, rows, pg_ids):
        row = list(raw)
        for i in (T_STARTED, T_COMPLETED):
            if row[i] == 0:  # JSON writes 0 for "not discovered yet"
                row[i] = None
        bad = _identity_problem(e, row, pg_id, groups_by_id, damage)
        if bad is not None:
            damage.skip(e, *bad)
            lost.append((len(kept_rows), tuple(row)))
            continue
        for i in (STATE, T_STARTED, T_COMPLETED, T_CREATED, RECORD):
            key = ROW_KEYS[i]
            if row[i] is not None and not CHECKS[key][0](row[i]):
                row[i] = damage.failed(e, key, row[i])
        kept.append(e)
        kept_rows.append(tuple(row))
    if lost:
        kept, kept_rows = mark_unread(kept, kept_rows, lost, damage)
    return kept, kept_rows


def _groups_by_pg_id(rows: list[tuple], pg_ids: Sequence[Any]) -> dict[int, Any]:
    """pg_id -> the group the rank's entries with that id name, where they all name one."""
    seen: dict[int, set] = {}
    for row, pg_id in zip(rows, pg_ids):
        pg = row[PG]
        if count_ok(pg_id) and pg_ok(pg):
            seen.setdefault(pg_id, set()).add(tuple(pg))
    return {pg_id: next(iter(pgs)) for pg_id, pgs in seen.items() if len(pgs) == 1}


def _identity_problem(e: dict[str, Any], row: list, pg_id: Any, groups_by_id: dict[int, Any],
                      damage: Damage) -> tuple[str, Any] | None:
    """Check (and where the entry itself tells, mend) the fields that say which collective ``row`` is: its
    name, group, seq and whether it is a send/recv. Returns (field, value) of the first that cannot be
    read, else None."""
    name = row[NAME]
    if not name_ok(name):
        return "profiling_name", name
    if not pg_ok(row[PG]):
        known = groups_by_id.get(pg_id) if count_ok(pg_id) else None
        if known is None:
            return "process_group", row[PG]
        if row[PG] is not None:
            damage.mended(e, "process_group", row[PG], f"read from its pg_id {pg_id}, as the rank's other entries "
                                                       "name that group")
        row[PG] = known
    if type(row[P2P]) is not bool:
        by_name = is_p2p_by_name(name)
        if by_name is None:
            return "is_p2p", row[P2P]
        if row[P2P] is not None:
            damage.mended(e, "is_p2p", row[P2P], f"read from its name: {'a send/recv' if by_name else 'a collective'}")
        row[P2P] = by_name
    if not count_ok(row[SEQ]):
        if not row[P2P]:
            return "collective_seq_id", row[SEQ]
        if row[SEQ] is not None:
            damage.mended(e, "collective_seq_id", row[SEQ], "not read for a send/recv")
        row[SEQ] = 0  # a send/recv's collective seq is its group's last collective's: nothing reads it
    return None


def mark_unread(kept: list[dict[str, Any]], rows: list[tuple], lost: list[tuple[int, tuple]],
                damage: Damage) -> tuple[list[dict[str, Any]], list[tuple]]:
    """Mark the seqs each lost entry may have held as unread, and leave out the kept rows of those seqs (a
    coalesced collective missing one of its ops would read as another collective).

    A lost entry whose group and seq are readable held that seq. One whose seq is not lies, in record order,
    between its group's neighbouring collectives: the seqs between theirs, and theirs too where they are
    coalesced (several rows, or a ``*coalesced`` closing entry, share the seq). One whose group is unreadable
    may be in any group. A lost send/recv (or an entry that may be one) leaves its group's pairing of sends
    and recvs on this rank unknown (``unread_p2p``). ``lost``: (how many kept rows come before it, its row).
    """
    groups = _collectives_by_group(rows)
    drop: dict[tuple, list[tuple[int, int]]] = {}
    for at, row in lost:
        pg, seq = (tuple(row[PG]) if pg_ok(row[PG]) else None), row[SEQ]
        p2p = maybe_p2p(row[NAME], row[P2P])
        if p2p is not False:  # a send/recv, or perhaps one
            damage.unread_p2p.add(pg[0] if pg is not None else ANY_GROUP)
        if p2p is True:
            continue  # its collective seq is the group's last collective's, not its own
        if pg is None:
            damage.unread_seqs(ANY_GROUP, *((seq, seq) if count_ok(seq) else (0, MAX_SEQ)))
            continue
        lo, hi = (seq, seq) if count_ok(seq) else _between(groups.get(pg), at)
        if lo > hi:
            continue  # no seq is missing there: its neighbours hold consecutive ones
        drop.setdefault(pg, []).append((lo, hi))
        damage.unread_seqs(pg[0], lo, hi)
    if not drop:
        return kept, rows
    starts = {pg: sorted(spans) for pg, spans in drop.items()}
    keep = [i for i, row in enumerate(rows) if row[P2P] or not _within(starts.get(tuple(row[PG])), row[SEQ])]
    return [kept[i] for i in keep], [rows[i] for i in keep]


def maybe_p2p(name: Any, is_p2p: Any) -> bool | None:
    """Whether an entry is a send/recv: its ``is_p2p`` where readable, else what its name says (None: cannot
    tell)."""
    if type(is_p2p) is bool:
        return is_p2p
    return is_p2p_by_name(name) if name_ok(name) else None


# A group's collective rows on one rank: their positions among the kept rows, their seqs (both in record
# order) and the seqs that are coalesced (several rows, or a ``*coalesced`` closing entry).
_GroupRows = tuple[list[int], list[int], set[int]]


def _collectives_by_group(rows: list[tuple]) -> dict[tuple, _GroupRows]:
    out: dict[tuple, _GroupRows] = {}
    for i, row in enumerate(rows):
        if row[P2P]:
            continue
        positions, seqs, coalesced = out.setdefault(tuple(row[PG]), ([], [], set()))
        if (seqs and seqs[-1] == row[SEQ]) or split_profiling_name(row[NAME])[1].endswith("coalesced"):
            coalesced.add(row[SEQ])
        positions.append(i)
        seqs.append(row[SEQ])
    return out


def _between(group: _GroupRows | None, at: int) -> tuple[int, int]:
    """The seqs a collective of a group that sat ``at`` (kept rows before it) may have held."""
    if group is None:
        return 0, MAX_SEQ
    positions, seqs, coalesced = group
    k = bisect.bisect_left(positions, at)
    lo = (seqs[k - 1] if seqs[k - 1] in coalesced else seqs[k - 1] + 1) if k > 0 else 0
    hi = (seqs[k] if seqs[k] in coalesced else seqs[k] - 1) if k < len(seqs) else MAX_SEQ
    return lo, hi


def _within(spans: list[tuple[int, int]] | None, seq: int) -> bool:
    """Whether ``seq`` is in one of ``spans`` (closed intervals sorted by their start)."""
    if not spans:
        return False
    k = bisect.bisect_right(spans, (seq, MAX_SEQ))
    return any(lo <= seq <= hi for lo, hi in spans[:k])
