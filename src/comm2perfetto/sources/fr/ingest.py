"""Normalising one rank's Flight Recorder entries into columns (the hot path of loading). Never imports torch.

Raw entries (see ``dump.py`` for the format) become, per process group, one row per collective in compact
columns (``columns.GroupTrack``: int64 arrays of seqs and times, a byte of state, ids into small tables of
signatures and stacks), plus the group's point-to-point ops; the entry dicts are dropped right after. The work
is done on whole columns (``map`` over the entries, array conversions, slices compared in C) and falls back to
per-entry Python only where the data needs it: several groups, p2p ops, coalesced groups, signatures that
differ from the first rank's, old formats. The conversions are the checks (array's int64 conversion refuses
anything but an int in range; a byte pass finds negatives), and only a rank whose columns fail is checked
entry by entry (``fields.repair_rows``): a field that fails its check is skipped and named, the rest of its
entry kept; an entry whose identity fails is skipped, and the seqs it may have held read as unknown.
"""

from __future__ import annotations

import sys
from array import array
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from operator import itemgetter
from typing import Any

from comm2perfetto.model import COMPLETED, SCHEDULED, UNKNOWN, Frame, Signature
from comm2perfetto.sources.fr.columns import NO_VALUE, STATE_CODE, STATES, GroupTrack
from comm2perfetto.sources.fr.dump import P2P_OPS, FrDump, PgConfig, split_profiling_name
from comm2perfetto.sources.fr.fields import (
    FR_STATES,
    MAX_DURATION_MS,
    ROW_KEYS,
    Damage,
    duration_ok,
    frames_ok,
    name_ok,
    pg_ok,
    repair_rows,
    snapshot_age,
)
from comm2perfetto.sources.fr.snapshots import merge_snapshots
from comm2perfetto.sources.fr.tables import SIGNATURE_FIELDS, SignatureTable, StackTable, encode, stack_id
from comm2perfetto.sources.limits import MIN_TIME_NS, count_ok
from comm2perfetto.words import ranks_text


@dataclass(slots=True)
class _Rows:
    """One rank's collectives on one process group while they are assembled: columns of one length sorted by
    seq (one row per collective), then packed into a ``GroupTrack`` as they are."""

    name: str
    desc: str
    pg_ids: set[int] = field(default_factory=set)
    seqs: array = field(default_factory=lambda: array("q"))
    sig_ids: array = field(default_factory=lambda: array("i"))  # into sig_table
    sig_table: list[Signature] = field(default_factory=list)
    states: bytes = b""  # codes into columns.STATES, one a row
    created_ns: array = field(default_factory=lambda: array("q"))  # NO_VALUE where unknown, as the next two
    started_ns: array = field(default_factory=lambda: array("q"))
    completed_ns: array = field(default_factory=lambda: array("q"))
    stack_ids: list[int | None] | None = None  # None: stacks not read
    op_ids: array | None = None  # FR op_id: read for gloo dumps only
    record_ids: array = field(default_factory=lambda: array("q"))
    # The GPU time of each collective in ms (FR's duration_ms, from CUDA events: NCCL with TORCH_NCCL_ENABLE_TIMING),
    # -1 where unknown; None where no entry has one
    durations_ms: array | None = None
    # p2p rows: (kind, peer group rank, p2p_seq, sig, state, created, completed, stack id, record id)
    p2p: list[tuple] = field(default_factory=list)

    def row_tuples(self) -> list[tuple]:
        """The rows as tuples in ``_TRACK_FIELDS`` order (signatures as objects), for the rare paths that
        rearrange rows: coalesced groups, one group under two spellings."""
        n = len(self.seqs)
        none = [None] * n
        return list(zip(self.seqs, map(self.sig_table.__getitem__, self.sig_ids), self.states, self.created_ns,
                        self.started_ns, self.completed_ns, self.stack_ids or none, self.op_ids or none,
                        self.record_ids, self.durations_ms or none))

    def set_rows(self, rows: list[tuple], stacks: bool, op_ids: bool, durations: bool) -> None:
        """The inverse of ``row_tuples``."""
        cols = list(zip(*rows)) or [()] * len(_TRACK_FIELDS)
        self.seqs = array("q", cols[0])
        self.sig_ids, self.sig_table = encode(cols[1])
        self.states = bytes(cols[2])
        self.created_ns, self.started_ns, self.completed_ns = (array("q", c) for c in cols[3:6])
        self.stack_ids = list(cols[6]) if stacks else None
        self.op_ids = array("q", cols[7]) if op_ids else None
        self.record_ids = array("q", cols[8])
        self.durations_ms = array("d", cols[9]) if durations else None


@dataclass(slots=True)
class FrRankTrace:
    """Everything one rank's Flight Recorder dumps say, deduplicated over snapshots."""

    rank: int
    files: list[str]
    version: str
    backend: str
    pg_config: dict[str, PgConfig]
    groups: dict[tuple[str, str], GroupTrack]  # by (pg name, desc): compact columns
    completed_upto: dict[tuple[str, str], int]
    notes: list[str] = field(default_factory=list)  # what was skipped while reading, one line per kind
    # seqs (closed intervals) of each group name (``fields.ANY_GROUP``: of every group) whose record on this rank
    # is unknown: an entry there was skipped, its identity unreadable
    unread: dict[str | None, tuple[tuple[int, int], ...]] = field(default_factory=dict)
    unread_p2p: frozenset[str | None] = frozenset()  # group names (or ANY_GROUP) where a send/recv was skipped
    # entries retired while scheduled: their backend records no completion (read as unknown, ``_retired_at_issue``)
    retired_at_issue: int = 0
    comm_state: dict[str, dict[str, str]] = field(default_factory=dict)  # ``FrDump.comm_state``, latest snapshot's


def build_rank_trace(
    rank: int, dumps: list[FrDump], stacks: StackTable, signatures: SignatureTable, with_stacks: bool = True,
) -> tuple[FrRankTrace, str | None]:
    """Normalise one rank's dumps into an ``FrRankTrace``; also returns a snapshot-conflict message."""
    notes = [p for d in dumps for p in d.problems]
    damage = Damage(dumps)
    entries, conflict = merge_snapshots(dumps, damage)
    version = max((d.version for d in dumps), key=_version_key, default="")
    pg_config: dict[str, PgConfig] = {}
    status: dict[int, tuple[int, int, int]] = {}
    comm_state: dict[str, dict[str, str]] = {}
    for d in sorted(dumps, key=snapshot_age):  # later snapshots win
        pg_config.update(d.pg_config)
        status.update(d.pg_status)
        comm_state.update(d.comm_state)
    groups: dict[tuple[str, str], _Rows] = {}
    entries, cols = _checked(entries, damage)
    backend, retired_at_issue = _ingest(entries, cols, groups, stacks, signatures, with_stacks, damage)
    completed_upto = _apply_pg_status(groups, status, backend)
    if damage:
        notes.extend(damage.notes(rank))
    trace = FrRankTrace(
        rank=rank, files=[str(d.path) for d in dumps], version=version, backend=backend, pg_config=pg_config,
        groups={key: _compact(rows) for key, rows in groups.items()}, completed_upto=completed_upto, notes=notes,
        unread=damage.unread_spans(), unread_p2p=frozenset(damage.unread_p2p), retired_at_issue=retired_at_issue,
        comm_state=comm_state,
    )
    return trace, conflict


def fr_job_notes(traces: dict[int, FrRankTrace]) -> list[str]:
    """The job's notes from its dumps as a whole: the entries whose backend records no completion
    (``_retired_at_issue``), and NCCL's communicator state (``nccl_comm_state``) of the first few ranks.

    >>> t = FrRankTrace(0, [], "2.11", "nccl2", {}, {}, {}, retired_at_issue=30,
    ...                 comm_state={"0x5a3f": {"nRanks": "2", "CT_pendingColls": "[]"}})
    >>> for note in fr_job_notes({0: t, 1: t}):
    ...     print(note[:96])
    Flight Recorder retired 60 entries of nccl2 on ranks 0, 1 as they were issued: that backend reco
    NCCL's communicator state (nccl_comm_state), rank 0, communicator 0x5a3f: nRanks=2, CT_pendingCo
    NCCL's communicator state (nccl_comm_state), rank 1, communicator 0x5a3f: nRanks=2, CT_pendingCo
    """
    notes = []
    ranks = [r for r, t in traces.items() if t.retired_at_issue]
    if ranks:
        n = sum(traces[r].retired_at_issue for r in ranks)
        backends = ", ".join(sorted({traces[r].backend for r in ranks}))
        notes.append(f"Flight Recorder retired {n} entries of {backends} on {ranks_text(ranks)} as they were "
                     "issued: that backend records no completion, so whether they completed is unknown (not "
                     "stuck: the ranks went on issuing); their times are their issue only")
    stated = sorted(r for r, t in traces.items() if t.comm_state)
    for r in stated[:_COMM_STATE_RANKS]:
        for comm, state in sorted(traces[r].comm_state.items()):
            notes.append(f"NCCL's communicator state (nccl_comm_state), rank {r}, communicator {comm}: "
                         + ", ".join(f"{k}={v}" for k, v in state.items()))
    if len(stated) > _COMM_STATE_RANKS:
        notes.append(f"NCCL's communicator state (nccl_comm_state) of {len(stated) - _COMM_STATE_RANKS} more "
                     "ranks is in their dumps")
    return notes


_COMM_STATE_RANKS = 4  # the ranks whose communicator state the notes show


def _compact(rows: _Rows) -> GroupTrack:
    return GroupTrack.from_arrays(rows.name, rows.desc, rows.pg_ids, rows.seqs, rows.sig_ids, rows.sig_table,
                                  rows.states, rows.created_ns, rows.started_ns, rows.completed_ns, rows.stack_ids,
                                  rows.record_ids, rows.durations_ms, rows.p2p)


def _version_key(v: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in v.split("."))
    except ValueError:
        return (0,)


def _slow_row(e: dict[str, Any], index: int) -> tuple:
    """The same tuple as ``_modern_row`` for entries of older formats (missing keys get defaults)."""
    get = e.get
    name = get("profiling_name") or ""
    pg = get("process_group")
    seq = get("collective_seq_id")
    if seq is None:
        seq = get("seq_id")
    is_p2p = get("is_p2p")
    if is_p2p is None:
        op = split_profiling_name(name)[1] if isinstance(name, str) else ""
        # Before is_p2p existed, "coalesced" entries only closed batched p2p (FR format < 2.7).
        is_p2p = op in P2P_OPS or op == "coalesced"
    return (
        name, pg if pg is not None else (str(get("pg_id", 0)), ""), seq, is_p2p, get("state"),
        get("time_discovered_started_ns"), get("time_discovered_completed_ns"), get("time_created_ns"),
        get("input_sizes"), get("input_dtypes"), get("output_sizes"), get("output_dtypes"), get("record_id", index),
    )


def _columns(entries: list[dict[str, Any]]) -> list[tuple]:
    """One tuple per key of ``fields.ROW_KEYS`` (the keys every entry has since format 2.4): each entry's
    values read in one C call (``itemgetter``), while the entry is in cache (a pass per key over thousands of
    cold dicts costs half as much again), then turned into columns. pg_id, op_id and p2p_seq_id are only
    needed for gloo dumps, debug-mode dumps and p2p entries: read separately, if at all."""
    if entries and all(k in entries[0] for k in ROW_KEYS):
        try:
            return list(zip(*map(itemgetter(*_own_keys(entries[0], ROW_KEYS)), entries)))
        except (KeyError, TypeError):
            pass  # a mixed dump: take the careful path
    return list(zip(*[_slow_row(e, i) for i, e in enumerate(entries)]))


def _own_keys(entry: dict[str, Any], names: Sequence[str]) -> list[str]:
    """``names`` as the dump's own key objects, where the entry has them. A dict lookup by the very object
    stored as the key hits on identity; an equal string from elsewhere is compared character by character
    (the unpickler shares one key object among a dump's entries: a fifth of the time of reading columns)."""
    own = {k: k for k in entry if type(k) is str}
    return [own.get(name, name) for name in names]


def _values(entries: list[dict[str, Any]], key: str) -> list:
    """One field of every entry (None where absent)."""
    return list(map(dict.get, entries, repeat(_own_keys(entries[0], (key,))[0], len(entries))))


def _column(entries: list[dict[str, Any]], key: str, absent: Any, damage: Damage, unknown: Any = None) -> list:
    """One field of every entry (a count: an id, a seq), ``absent`` where the entry has none; where it fails
    its check, what ``damage`` reads instead (named there), else ``unknown``."""
    values = _values(entries, key)
    if all(map(count_ok, values)):
        return values
    out = []
    for e, v in zip(entries, values):
        if v is not None and not count_ok(v):
            v = damage.failed(e, key, v)
            out.append(unknown if v is None else v)
        else:
            out.append(absent if v is None else v)
    return out


@dataclass(slots=True)
class _Columns:
    """One rank's entries as checked columns, one row per entry: what ``_ingest`` works on. The counts and
    times are int64 arrays (``NO_VALUE`` where a time is unknown); the rest is as read."""

    names: tuple
    pgs: tuple
    seqs: array
    p2ps: tuple
    states: tuple
    started: array
    completed: array
    created: array
    in_s: tuple
    in_d: tuple
    out_s: tuple
    out_d: tuple
    record_ids: array


def _checked(entries: list[dict[str, Any]], damage: Damage) -> tuple[list[dict[str, Any]], _Columns | None]:
    """The entries whose identity is sound and their checked columns (None when no entry is left): whole
    columns are checked in C; only a rank whose columns fail is checked entry by entry, field by field
    (``fields.repair_rows``, which tells ``damage`` what failed)."""
    if not entries:
        return entries, None
    raw = _columns(entries)
    cols = _checked_columns(raw)
    if cols is not None:
        return entries, cols
    kept, rows = repair_rows(entries, zip(*raw), _values(entries, "pg_id"), damage)
    cols = _checked_columns(list(zip(*rows))) if kept else None
    if kept and cols is None:  # a bug if ever seen: the two checks differ (the loader skips the rank's dumps)
        raise ValueError("Flight Recorder entries that pass their checks one by one but not as columns")
    return kept, cols


def _checked_columns(raw: list[tuple]) -> _Columns | None:
    """The columns, converted, if every entry's fields have the type and range ``fields.CHECKS`` asks for;
    checked a column at a time in C (about 0.2 ms for a 2000-entry ring, against 2 ms to unpickle it)."""
    names, pgs, seqs, p2ps, states, t_st, t_co, created, in_s, in_d, out_s, out_d, rids = raw
    if 0 in t_st:  # JSON writes 0 for "not discovered yet"
        t_st = tuple(x or None for x in t_st)
    if 0 in t_co:
        t_co = tuple(x or None for x in t_co)
    seq_a, st_a, co_a = _int64(seqs, False), _int64(t_st, True), _int64(t_co, True)
    cr_a, rid_a = _int64(created, True), _int64(rids, True)
    if seq_a is None or st_a is None or co_a is None or cr_a is None or rid_a is None:
        return None
    earliest = min(cr_a)
    if earliest == NO_VALUE:  # some unknown: the earliest known (the conversion refused other negatives)
        earliest = min((t for t in cr_a if t >= 0), default=MIN_TIME_NS)
    if earliest < MIN_TIME_NS:
        return None
    try:  # few distinct values: checking them is free next to building the sets
        try:
            distinct_pgs = set(pgs)
        except TypeError:  # JSON's lists: as tuples (an unhashable value inside still fails)
            pgs = tuple(tuple(pg) if isinstance(pg, list) else pg for pg in pgs)
            distinct_pgs = set(pgs)
        if not (all(map(name_ok, set(names))) and set(states) <= _STATE_VALUES and all(map(pg_ok, distinct_pgs))
                and all(type(p) is bool for p in set(p2ps))):
            return None
    except TypeError:  # an unhashable value
        return None
    return _Columns(names, pgs, seq_a, p2ps, states, st_a, co_a, cr_a, in_s, in_d, out_s, out_d, rid_a)


# The most significant byte of each int64 in an array's bytes: its sign bit is that byte's top bit.
_TOP_BYTES = slice(7, None, 8) if sys.byteorder == "little" else slice(0, None, 8)
_NON_NEGATIVE_TOP = bytes(range(128))


def _int64(col: tuple, optional: bool) -> array | None:
    """A column of counts (ints in [0, 2**63)) as int64, None as ``NO_VALUE`` where ``optional``; None when
    a value is anything else. Two C passes: array's int64 conversion refuses other types (bools aside:
    they are ints) and larger values, and the top bytes of the result show any negative one.

    >>> _int64((3, None, 5), True), _int64((3, None), False), _int64((3, -1), True), _int64((2**63,), True)
    (array('q', [3, -1, 5]), None, None, None)
    """
    try:
        values, nones = array("q", col), 0
    except TypeError:  # a None, or not an int
        nones = col.count(None)
        if not nones or not optional:
            return None
        try:
            values = array("q", _filled(col, nones, NO_VALUE))
        except (TypeError, OverflowError):
            return None
    except OverflowError:
        return None
    negative = len(values.tobytes()[_TOP_BYTES].translate(None, _NON_NEGATIVE_TOP))
    return values if negative == nones else None  # each None is one NO_VALUE; any other negative is bad


def _filled(col: Sequence, nones: int, fill: Any) -> list:
    """``col`` with its ``nones`` Nones replaced by ``fill``: found in C where they are few (the unfinished
    tail of a ring), a pass in Python otherwise."""
    if nones > 16:
        return [fill if v is None else v for v in col]
    out = list(col)
    at = -1
    for _ in range(nones):
        at = col.index(None, at + 1)
        out[at] = fill
    return out


_STATE_VALUES = FR_STATES | {None}  # None: absent (unknown)
# FR's state names to ``columns.STATES`` codes (the columns hold these values only: see ``_checked_columns``)
_STATE_CODES: dict[str | None, int] = {**{s: STATE_CODE[s] for s in FR_STATES}, None: STATE_CODE[UNKNOWN]}
_SCHEDULED, _UNKNOWN, _COMPLETED = STATE_CODE[SCHEDULED], STATE_CODE[UNKNOWN], STATE_CODE[COMPLETED]


def _ingest(
    entries: list[dict[str, Any]], cols: _Columns | None, groups: dict[tuple[str, str], _Rows],
    stacks: StackTable, signatures: SignatureTable, with_stacks: bool, damage: Damage,
) -> tuple[str, int]:
    """Turn checked columns into each group's rows. Returns the backend prefix seen most (``nccl``, ``gloo``,
    ``nccl2``) and how many entries its backend retired at issue (``_retired_at_issue``).

    This runs over every entry of every rank (two million for 1024 ranks), so it works on whole columns
    (``map``, slices, array conversions: loops in C) and only falls back to per-entry Python where the data
    needs it (several groups, p2p ops, coalesced groups, signatures that differ from the first rank's).
    """
    if cols is None:
        return "", 0
    names, pgs, p2ps, seqs = cols.names, cols.pgs, cols.p2ps, cols.seqs
    parts = {name: split_profiling_name(name) for name in set(names)}
    counts: dict[str, int] = {}
    for name, (backend, _, _, _) in parts.items():
        counts[backend] = counts.get(backend, 0) + names.count(name)
    backend = max(counts, key=counts.__getitem__)
    gloo = backend == "gloo"
    # an absent op_id is the seq (as before gloo had p2p ops); a damaged one is unknown
    op_ids = array("q", [q if o is None else o for o, q in zip(_column(entries, "op_id", None, damage, NO_VALUE),
                                                                seqs)]) if gloo else None
    states = bytes(map(_STATE_CODES.__getitem__, cols.states))
    retired_at_issue = 0
    if not gloo:  # gloo's scheduled entries are read with its pg_status (``_apply_pg_status``)
        states, retired_at_issue = _retired_at_issue(entries, states)
    # GPU durations exist only where NCCL timed its work (TORCH_NCCL_ENABLE_TIMING; torch writes the key for
    # retired entries only): a sample of the entries says whether to read the column at all.
    timed = not gloo and any("duration_ms" in e for e in entries[::max(1, len(entries) // 64)])
    durations = _durations_ms(entries, _values(entries, "duration_ms"), damage) if timed else None
    sids = _stack_ids(entries, _values(entries, "frames"), stacks, damage) if with_stacks and "frames" in entries[0] \
        else None  # without frames (JSON), or resolved later on demand (see match.LazyStacks)

    distinct_pgs = set(pgs)
    unnamed = any(not pg[0] for pg in distinct_pgs)
    # pg_id per entry only where it matters: gloo's pg_status is keyed by it, debug-mode dumps name groups by it.
    pg_ids = _column(entries, "pg_id", None, damage) if gloo or unnamed else None
    any_p2p = any(p2ps)
    p2p_seqs = _column(entries, "p2p_seq_id", 0, damage) if any_p2p else None
    helpers: set[Any] = set()
    if unnamed:
        assert pg_ids is not None
        pgs, helpers = _unwrap_debug_groups(pgs, pg_ids, names, cols.in_s)
        distinct_pgs = set(pgs)
    if p2p_seqs is not None:
        p2ps = _batch_closers_as_p2p(names, pgs, p2ps, p2p_seqs, parts)
    partition: dict[tuple[Any, bool], list[int] | None]
    if len(distinct_pgs) == 1 and not any_p2p:
        partition = {(pgs[0], False): None}  # the common case: one group, collectives only
    else:
        rows: defaultdict[tuple[Any, bool], list[int]] = defaultdict(list)
        for i, (pg, p2p) in enumerate(zip(pgs, p2ps)):
            rows[(pg, bool(p2p))].append(i)
        partition = dict(rows)
    for (pg, p2p), idx in partition.items():
        if pg in helpers:
            continue
        key = (str(pg[0]), str(pg[1]))
        track = groups.get(key)
        if track is None:
            track = groups[key] = _Rows(key[0], key[1])
        take = _everything if idx is None else _picker(idx)
        if pg_ids is not None:
            track.pg_ids.update(x for x in set(take(pg_ids)) if x is not None)
        elif (pid := entries[0 if idx is None else idx[0]].get("pg_id")) is not None:
            track.pg_ids.add(pid)
        if p2p:
            _add_p2p(track, take, parts, p2p_seqs, cols, states, sids, signatures, take(entries), damage)
            continue
        new = _Rows(key[0], key[1])
        new.seqs = take(seqs)
        new.sig_ids, new.sig_table, bad = signatures.column(key[0], new.seqs, take(names), parts, take(cols.in_s),
                                                            take(cols.in_d), take(cols.out_s), take(cols.out_d))
        if bad:
            _mend_signatures(new, bad, take(entries), parts, signatures, damage)
        new.states, new.created_ns, new.started_ns = take(states), take(cols.created), take(cols.started)
        new.completed_ns, new.stack_ids, new.op_ids = take(cols.completed), take(sids), take(op_ids)
        new.record_ids, new.durations_ms = take(cols.record_ids), take(durations)
        coalesced = len(set(new.seqs)) != len(new.seqs)  # several rows share a seq
        if coalesced or track.seqs:  # ... or one group under two spellings (rare): merge, keeping seq order
            rows_now = track.row_tuples() + (_fold_coalesced(new.row_tuples(), signatures) if coalesced
                                             else new.row_tuples())
            rows_now.sort(key=lambda r: r[0])
            track.set_rows(rows_now, sids is not None, op_ids is not None, durations is not None)
            continue
        new.pg_ids, new.p2p = track.pg_ids, track.p2p
        groups[key] = new
    _fix_p2p_batches(groups)
    return backend, retired_at_issue


def _retired_at_issue(entries: list[dict[str, Any]], states: bytes) -> tuple[bytes, int]:
    """``states`` with the entries retired while still ``scheduled`` read as unknown: torch's backend-agnostic
    Flight Recorder (``FlightRecorderHook``, torch 2.11+) retires an entry at issue where its backend has no
    completion hook, so it never reads started or completed, whether the op finished or not::

        {"profiling_name": "nccl2:all_reduce", "collective_seq_id": 3, "state": "scheduled", "retired": true,
         "time_discovered_started_ns": null, "time_discovered_completed_ns": null}

    NCCL's own recorder retires an entry when its work completes (its state then says so), and leaves the ops of
    a batch ``scheduled`` and not retired (``_fix_p2p_batches``). Only the scheduled entries are looked at: the
    last few of a live NCCL dump, every one of a backend without completion. Returns the states and how many
    entries were retired at issue."""
    at = states.find(_SCHEDULED)
    if at < 0:
        return states, 0
    out, n = bytearray(states), 0
    while at >= 0:
        if entries[at].get("retired") is True:
            out[at] = _UNKNOWN
            n += 1
        at = states.find(_SCHEDULED, at + 1)
    return bytes(out), n


def _everything(col: Any) -> Any:
    return col


def _picker(idx: list[int]) -> Callable[[Any], Any]:
    """``take(column)``: the rows at ``idx`` of a column, of the column's own type (None stays None)."""
    def take(col: Any) -> Any:
        if col is None:
            return None
        if isinstance(col, array):
            return array(col.typecode, map(col.__getitem__, idx))
        if isinstance(col, bytes):
            return bytes(map(col.__getitem__, idx))
        return tuple(map(col.__getitem__, idx))
    return take


def _batch_closers_as_p2p(names: Sequence, pgs: Sequence, p2ps: tuple, p2p_seqs: Sequence, parts: dict) -> tuple:
    """The ``is_p2p`` column with the closing entry of each batched send/recv counted as p2p.

    NCCL records each op of a ``batch_isend_irecv`` (``is_p2p``, never completed nor retired: it has no CUDA
    events) and then a closing ``nccl:coalesced`` entry that carries the batch's state and duration but says
    ``is_p2p: false`` and repeats the group's last collective ``collective_seq_id`` (seen on torch 2.11, NCCL
    2.28, format 2.10); it closes the ops right before it, which share its ``p2p_seq_id``::

        {"record_id": 3, "profiling_name": "nccl:send 0->0", "is_p2p": true, "collective_seq_id": 3,
         "p2p_seq_id": 1, "state": "scheduled", "retired": false}
        {"record_id": 4, "profiling_name": "nccl:recv 0<-0", "is_p2p": true, ... "p2p_seq_id": 1, ...}
        {"record_id": 5, "profiling_name": "nccl:coalesced", "is_p2p": false, "collective_seq_id": 3,
         "p2p_seq_id": 1, "state": "completed", "retired": true, "duration_ms": 3.9}

    Read as a collective, it would fold into collective 3 (an all_reduce) and the batch would stay scheduled
    forever. The closing entry of a coalesced collective follows collective ops instead, and keeps its place.
    """
    out = None
    last_of_group: dict[Any, int] = {}  # pg -> index of its latest entry so far
    for i, (name, pg) in enumerate(zip(names, pgs)):
        before = last_of_group.get(pg)
        last_of_group[pg] = i
        if before is None or p2ps[i] or not parts[name][1].endswith("coalesced"):
            continue
        if p2ps[before] and p2p_seqs[before] == p2p_seqs[i]:
            if out is None:
                out = list(p2ps)
            out[i] = True
    return p2ps if out is None else tuple(out)


def _unwrap_debug_groups(pgs: Sequence, pg_ids: Sequence, names: Sequence, in_s: Sequence) -> tuple[tuple, set]:
    """Entries written under ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` have an empty group name (seen on torch 2.13,
    gloo): name them by ``pg_id`` (the default group's is 0, matching its name "0"), and find the wrapper's
    helper groups, whose entries are only its fingerprint checks: all-gathers of a one-element length, then of
    the fingerprint, in pairs. Returns the new group column and the helper groups to leave out."""
    pgs = tuple(pg if pg[0] else (str(pid), pg[1]) for pg, pid in zip(pgs, pg_ids))
    rows: dict[Any, list[int]] = defaultdict(list)
    for i, (pg, pid) in enumerate(zip(pgs, pg_ids)):
        if str(pid) == pg[0]:
            rows[pg].append(i)
    helpers = set()
    for pg, idx in rows.items():
        if pg[0] != "0" and len(idx) % 2 == 0 and all(names[i].endswith(":all_gather") for i in idx) \
                and all(in_s[i] == [[1]] for i in idx[::2]):
            helpers.add(pg)
    return pgs, helpers


_TRACK_FIELDS = ("seqs", "sigs", "states", "created_ns", "started_ns", "completed_ns", "stack_ids", "op_ids",
                 "record_ids", "durations_ms")


def _optional(t: int) -> int | None:
    return None if t == NO_VALUE else t


def _add_p2p(track: _Rows, take: Callable[[Any], Any], parts: dict, p2p_seqs: Sequence | None, cols: _Columns,
             states: bytes, sids: list[int | None] | None, signatures: SignatureTable, entries: Sequence[dict],
             damage: Damage) -> None:
    assert p2p_seqs is not None
    n = len(take(cols.seqs))
    for e, name, p2p_seq, i_s, i_d, o_s, o_d, code, t0, t1, sid, rid in zip(
            entries, take(cols.names), take(p2p_seqs), take(cols.in_s), take(cols.in_d), take(cols.out_s),
            take(cols.out_d), take(states), take(cols.created), take(cols.completed), take(sids) or repeat(None, n),
            take(cols.record_ids)):
        _, op, src, dst = parts[name]
        raw = (op, i_s, i_d, o_s, o_d)
        sig, bad = signatures.checked(track.name, -1 - (p2p_seq or 0), raw)
        if bad:
            sig = _mended_signature(track.name, -1 - (p2p_seq or 0), raw, bad, e, signatures, damage)
        peer = (dst if op == "send" else src) if op in P2P_OPS else None
        track.p2p.append((op, peer, p2p_seq, sig, STATES[code], _optional(t0), _optional(t1), sid, rid))


def _mend_signatures(rows: _Rows, bad: list[tuple[int, tuple[str, ...]]], entries: Sequence[dict], parts: dict,
                     signatures: SignatureTable, damage: Damage) -> None:
    """Give the rows whose signature fields failed their check (``bad``: row, fields) the signature
    ``_mended_signature`` makes of them."""
    sigs = list(map(rows.sig_table.__getitem__, rows.sig_ids))
    for row, fields in bad:
        e = entries[row]
        raw = (parts[e["profiling_name"]][1], *(e.get(k) for k in SIGNATURE_FIELDS))
        sigs[row] = _mended_signature(rows.name, rows.seqs[row], raw, fields, e, signatures, damage)
    rows.sig_ids, rows.sig_table = encode(sigs)


def _mended_signature(pg_name: str, seq: int, raw: tuple, fields: tuple[str, ...], e: dict[str, Any],
                      signatures: SignatureTable, damage: Damage) -> Signature:
    """The signature of an entry whose ``fields`` failed their check: each read from the same record in
    another dump where it is sound there, else unknown (None); each named in ``damage``."""
    mended = list(raw)
    for name in fields:
        i = 1 + SIGNATURE_FIELDS.index(name)
        mended[i] = damage.failed(e, name, raw[i])
    return signatures.checked(pg_name, seq, tuple(mended))[0]


def _stack_ids(entries: list[dict[str, Any]], frames_col: list, stacks: StackTable,
               damage: Damage) -> list[int | None]:
    """Stack id of every entry. torch's pickler shares frame dicts between entries, so the tuple of their
    ids names a call path while the dump is alive; each distinct one is converted once. A value that is not
    a list of frame records is damaged (a copy in another dump gives it, else no stack)."""
    if not set(map(type, frames_col)) <= {list, type(None)}:
        frames_col = [f if f is None or type(f) is list else damage.failed(e, "frames", f)
                      for e, f in zip(entries, frames_col)]
    keys = [tuple(map(id, f)) if f and isinstance(f, list) else None for f in frames_col]
    first = dict(zip(keys, frames_col))
    bad = {key for key, frames in first.items() if key is not None and not frames_ok(frames)}
    if bad:  # a list holding something other than frames: that entry's stack is damaged
        frames_col = [damage.failed(e, "frames", f) if key in bad else f
                      for e, f, key in zip(entries, frames_col, keys)]
        keys = [tuple(map(id, f)) if f and isinstance(f, list) else None for f in frames_col]
        first = dict(zip(keys, frames_col))
    frame_cache: dict[int, Frame] = {}
    sid_of: dict[Any, int | None] = {None: None}
    for key, frames in first.items():
        if key is not None:  # stack_id skips frames that are not {filename, line, name} records
            sid_of[key] = stack_id(frames, frame_cache, stacks)
    return list(map(sid_of.__getitem__, keys))


def _durations_ms(entries: list[dict[str, Any]], raw: list[Any], damage: Damage) -> array:
    """FR's ``duration_ms`` of every entry as float64, -1 where absent or not a plausible duration (see
    ``fields.duration_ok``; such a value is damaged, named in ``damage``, which may read it from another dump):
    checked a column at a time in C where every value is a number in range (the top bytes show negatives,
    NaN and infinities)."""
    nones = raw.count(None)
    if set(map(type, raw)) <= {float, int, type(None)}:
        values = array("d", _filled(raw, nones, -1.0) if nones else raw)
        top = values.tobytes()[_TOP_BYTES]
        # Top bytes below 0x7f: positive and finite (NaN and infinities have every exponent bit set); the
        # fills are the only others.
        if len(top.translate(None, _FINITE_POSITIVE_TOP)) == nones and max(values) < MAX_DURATION_MS:
            return values
    out = array("d")
    for e, x in zip(entries, raw):
        if x is not None and not duration_ok(x):
            x = damage.failed(e, "duration_ms", x)
        out.append(-1.0 if x is None else x)
    return out


_FINITE_POSITIVE_TOP = bytes(range(0x7f))


def _fold_coalesced(rows: list[tuple], signatures: SignatureTable) -> list[tuple]:
    """Fold the rows of each coalesced collective (consecutive rows with one seq) into one row.

    FR writes one entry per op and, since format 2.7, a closing ``*_coalesced`` entry carrying the real
    state; the folded row keeps the first op's creation time and the closing entry's state and completion.
    """
    out: list[tuple] = []
    i = 0
    while i < len(rows):
        j = i
        while j + 1 < len(rows) and rows[j + 1][0] == rows[i][0]:
            j += 1
        if j == i:
            out.append(rows[i])
        else:
            group = rows[i:j + 1]
            last = group[-1]
            closing = last[1].op.endswith("coalesced")
            members = tuple(r[1] for r in (group[:-1] if closing else group))
            sig = signatures.intern(Signature(
                op=last[1].op if closing else "coalesced", input_sizes=None, input_dtypes=None,
                output_sizes=None, output_dtypes=None, source="fr", parts=members,
            ))
            first = group[0]
            started = last[4] if last[4] != NO_VALUE else first[4]
            out.append((first[0], sig, last[2], first[3], started, last[5], first[6], last[7], last[8], last[9]))
        i = j + 1
    return out


def _fix_p2p_batches(groups: dict[tuple[str, str], _Rows]) -> None:
    """Ops of a batched p2p stay ``scheduled``; the closing ``coalesced`` entry with the same p2p seq has
    the real state: give it to them, and drop the closing entry (it is not a transfer)."""
    for track in groups.values():
        if not any(row[0] == "coalesced" for row in track.p2p):
            continue
        out: list[tuple] = []
        for row in track.p2p:
            if row[0] != "coalesced":
                out.append(row)
                continue
            for j in range(len(out) - 1, -1, -1):
                if out[j][2] != row[2]:
                    break
                out[j] = out[j][:4] + (row[4], out[j][5], row[6]) + out[j][7:]
        track.p2p = out


def _apply_pg_status(
    groups: dict[tuple[str, str], _Rows], status: dict[int, tuple[int, int, int]], backend: str
) -> dict[tuple[str, str], int]:
    """Gloo's entries never leave ``scheduled``: their state means "unknown", except where
    ``pg_status.last_completed_collective`` says they completed. Gloo counts that number in its own
    sequence, which also advances for p2p ops: FR's ``op_id`` (seen on torch 2.13). Other backends' states
    are kept as written. Returns, per group, the last seq known completed through pg_status (-1: none).
    """
    out: dict[tuple[str, str], int] = {}
    for key, track in groups.items():
        last = max((status[p][2] for p in track.pg_ids if p in status), default=-1)
        out[key] = -1
        if backend != "gloo":
            continue
        states = bytearray(track.states)
        for i, ident in enumerate(track.op_ids or ()):
            if 0 <= ident <= last:  # NO_VALUE: its op_id was damaged, its state stays unknown
                states[i] = _COMPLETED
                out[key] = track.seqs[i]
            elif states[i] == _SCHEDULED:
                states[i] = _UNKNOWN
        track.states = bytes(states)
        track.p2p = [row if row[4] != SCHEDULED else row[:4] + (UNKNOWN,) + row[5:] for row in track.p2p]
    return out
