"""One process group's collectives across its ranks, read from each rank's columns (``GroupCollectives``).

The matching leaves, per (rank, group), a track: Flight Recorder's compact columns (``sources.fr.columns
.GroupTrack``) or, for a rank whose recorder log or profiler traces were merged in, plain lists (``Rows``).
Nothing is transposed into per-collective objects: ``GroupCollectives`` is a ``Sequence[Collective]`` whose
items are views (``model.Collective``) that gather one field across the ranks when read, and
``member_column`` gives one rank's values across every collective of the group (what a trace writer walks).

Gathering is C-level where it can be: the members are cut into runs of consecutive ranks whose tracks
have the same shape (compact, contiguous, same first seq and length, same tables), and a run's values at
one seq are ``map(itemgetter(j), columns)``. A 16,384-rank group whose ranks all recorded the same
collectives is one run (two when one rank is missing the last collective).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, overload

from comm2perfetto.model import CallState, Collective, ProcessGroup, Signature, Stack, gpu_backend
from comm2perfetto.sources.fr.columns import STATE_LOOKUP, STATES, GroupTrack, ms_to_ns_col
from comm2perfetto.sources.fr.tables import contiguous

# Up to this many (rank, collective) cells, a group's per-collective tuples of a field are built all at once when
# the field is read by a pass (one zip over the ranks' columns) and kept, and so are its views: cheaper than
# gathering each, and small. A field read for a few collectives only (diagnose's culprit) is gathered for those.
SMALL_GROUP_CELLS = 1 << 18
TRANSPOSE_AFTER = 16  # reads of a field of a small group before all its tuples are built at once
FIELDS = ("signatures", "states", "arrive_ns", "start_ns", "end_ns", "stack_ids", "sources", "duration_ns",
          "gpu_begin_ns")
# Fields that are () in every view of a group where no member has a value (see ``Collective``).
_OPTIONAL = ("duration_ns", "gpu_begin_ns")
_TIME = object()  # decoding of a time column: NO_VALUE (-1) -> None
_MS = object()  # Flight Recorder's durations: ms (-1: unknown), read as ns (see _Member.field)


@dataclass(slots=True)
class Rows:
    """One rank's collectives on one group as plain lists aligned by row (a rank whose recorder log or
    profiler traces were merged with its Flight Recorder columns). None where a value is not known."""

    seqs: list[int]
    sigs: list[Signature]
    states: list[CallState]
    arrive: list[int | None]
    start: list[int | None]
    end: list[int | None]
    stack_ids: list[int | None]
    sources: list[str] | None  # None: every row is "fr"
    log_sigs: list[Signature | None] | None = None
    log_ends: dict[int, int] = field(default_factory=dict)  # seq -> precise end (recorder return)
    durations: list[int | None] | None = None  # GPU time (FR's duration_ms) by row; None: no row has one
    gpu_begins: list[int | None] | None = None  # the kernels' begin (profiler traces) by row; None: no row has one

    def __len__(self) -> int:
        return len(self.seqs)


Track = GroupTrack | Rows


def rows_of(track: Track) -> Rows:
    """A track as plain lists (copies a compact track's columns; a ``Rows`` is returned as it is)."""
    if isinstance(track, Rows):
        return track
    durations = track.durations_ns if track.duration_col is not None else None
    return Rows(track.seqs, track.sigs, track.states, track.created_ns, track.started_ns, track.completed_ns,
                track.stack_ids, None, durations=durations)


def first_last(track: Track) -> tuple[int, int]:
    """The lowest and highest seq of a non-empty track."""
    seqs = track.seq_col if isinstance(track, GroupTrack) else track.seqs
    return min(seqs[0], seqs[-1]), max(seqs[0], seqs[-1])


def completed_upto(track: Track) -> int:
    """Every seq up to the returned one is known completed on this rank (-1: none known)."""
    if isinstance(track, GroupTrack):
        bad = track.first_not_done()
        seqs: Sequence[int] = track.seq_col
    else:
        states = track.states
        bad = min((states.index(st) for st in set(states) if st != CallState.COMPLETED), default=len(states))
        seqs = track.seqs
    if bad == len(seqs):
        return seqs[-1] if len(seqs) else -1
    return seqs[bad - 1] if bad > 0 else -1


def shift_track(track: Track, offset: int) -> None:
    """Move a track's times onto the job's clock, once, in place."""
    if not offset:
        return
    if isinstance(track, GroupTrack):
        for name in ("created_col", "started_col", "completed_col"):
            col = getattr(track, name)
            setattr(track, name, type(col)(col.typecode, [t + offset if t >= 0 else t for t in col]))
        return
    for name in ("arrive", "start", "end"):
        setattr(track, name, [t + offset if t is not None else None for t in getattr(track, name)])
    if track.gpu_begins is not None:
        track.gpu_begins = [t + offset if t is not None else None for t in track.gpu_begins]
    track.log_ends = {k: t + offset for k, t in track.log_ends.items()}


class _Member:
    """How to read one rank's values of one field: its column and how to decode it."""

    __slots__ = ("columns", "contiguous", "first", "n", "pos", "seqs", "shape")

    def __init__(self, track: Track, lookups: dict[tuple, list]) -> None:
        seqs: Sequence[int] = track.seq_col if isinstance(track, GroupTrack) else track.seqs
        self.seqs = seqs
        self.first = seqs[0]
        self.n = len(seqs)
        self.contiguous = contiguous(seqs)
        self.pos: dict[int, int] | None = None
        # name -> (column or None, decoding: None (as is), _TIME, a lookup list, or ("const", value))
        self.columns: dict[str, tuple[Any, Any]] = {}
        if isinstance(track, GroupTrack):
            sig_lookup = _canonical(lookups, [*track.sig_table, None])
            stack_lookup = _canonical(lookups, [*track.stack_table, None])
            self.columns = {
                "signatures": (track.sig_col, sig_lookup), "states": (track.state_col, STATE_LOOKUP),
                "arrive_ns": (track.created_col, _TIME), "start_ns": (track.started_col, _TIME),
                "end_ns": (track.completed_col, _TIME),
                "stack_ids": (track.stack_col, stack_lookup) if track.stack_col is not None else (None, None),
                "sources": (None, "fr"),
                "duration_ns": (track.duration_col, _MS) if track.duration_col is not None else (None, None),
                "gpu_begin_ns": (None, None),
            }
            self.shape: tuple = ("compact", self.first, self.n, self.contiguous, id(sig_lookup), id(stack_lookup),
                                 track.stack_col is None, track.duration_col is None)
            if not self.contiguous:
                self.shape = ("alone", id(self))
        else:
            self.columns = {
                "signatures": (track.sigs, None), "states": (track.states, None), "arrive_ns": (track.arrive, None),
                "start_ns": (track.start, None), "end_ns": (track.end, None), "stack_ids": (track.stack_ids, None),
                "sources": (track.sources, None) if track.sources is not None else (None, "fr"),
                "duration_ns": (track.durations, None) if track.durations is not None else (None, None),
                "gpu_begin_ns": (track.gpu_begins, None) if track.gpu_begins is not None else (None, None),
            }
            self.shape = ("plain", self.first, self.n, track.sources is None, track.durations is None,
                          track.gpu_begins is None) \
                if self.contiguous else ("alone", id(self))

    def row(self, seq: int) -> int | None:
        if self.contiguous:
            j = seq - self.first
            return j if 0 <= j < self.n else None
        if self.pos is None:
            self.pos = {s: j for j, s in enumerate(self.seqs)}
        return self.pos.get(seq)

    def field(self, name: str) -> tuple[Any, Any]:
        """(column or None, decoding) of one field. Flight Recorder's durations (ms, float) become int64 ns the
        first time they are read (a report reads them, diagnose does not), then decode as times."""
        col, how = self.columns[name]
        if how is _MS:
            col, how = self.columns[name] = (ms_to_ns_col(col), _TIME)
        return col, how

    def column(self, name: str) -> list:
        """This member's decoded values of one field, one per row."""
        col, how = self.field(name)
        if col is None:
            return [how if isinstance(how, str) else None] * self.n
        return _decode(list(col), how)


def _canonical(lookups: dict[tuple, list], table: list) -> list:
    """One list object per distinct table content, so that members sharing tables share a run."""
    return lookups.setdefault(tuple(map(id, table)), table)


def _decode(values: list, how: Any) -> list:
    if how is None:
        return values
    if how is _TIME:
        return values if not values or min(values) >= 0 else [None if v < 0 else v for v in values]
    return list(map(how.__getitem__, values))


class _Run:
    """Consecutive members (by position in the group) read the same way; ``members`` None: ranks without data."""

    __slots__ = ("_columns", "members", "size")

    def __init__(self, members: list[_Member] | None, size: int) -> None:
        self.members = members
        self.size = size
        self._columns: dict[str, list] = {}  # per field, the members' columns (read by one itemgetter)

    def gather(self, name: str, seq: int) -> list:
        members = self.members
        if members is None:
            return [None] * self.size
        head = members[0]
        if head.shape[0] != "alone":  # one shape: one column index for every member of the run
            j = seq - head.first
            if not 0 <= j < head.n:
                return [None] * self.size
            col, how = head.field(name)
            if col is None:
                return [how if isinstance(how, str) else None] * self.size
            cols = self._columns.get(name)
            if cols is None:
                cols = self._columns[name] = [m.field(name)[0] for m in members]
            return _decode(list(map(itemgetter(j), cols)), how)
        row = head.row(seq)
        if row is None:
            return [None]
        col, how = head.field(name)
        if col is None:
            return [how if isinstance(how, str) else None]
        return _decode([col[row]], how)


class GroupCollectives(Sequence[Collective]):
    """A group's collectives in seq order (those some member recorded), as views over its members' tracks.

    ``tracks`` is aligned with ``group.ranks`` (None: no data of that rank on this group); their times are on
    the job's clock already. A view stays the same object while something holds it.
    """

    def __init__(self, group: ProcessGroup, tracks: Sequence[Track | None], stacks: tuple[Stack, ...]) -> None:
        self.group = group
        self.ranks = group.ranks
        self.stacks = stacks
        lookups: dict[tuple, list] = {}
        members = [_Member(t, lookups) if t is not None and len(t) else None for t in tracks]
        self._members = members
        self._runs: list[_Run] = []
        for m in members:
            last = self._runs[-1] if self._runs else None
            if m is None:
                if last is not None and last.members is None:
                    last.size += 1
                else:
                    self._runs.append(_Run(None, 1))
            elif last is not None and last.members and last.members[0].shape == m.shape and m.shape[0] != "alone":
                last.members.append(m)
                last.size += 1
            else:
                self._runs.append(_Run([m], 1))
        self.seqs = _union_seqs([m for m in members if m is not None])
        self._index: dict[int, int] | None = None
        self._positions: dict[int, int] | None = None
        self._views: weakref.WeakValueDictionary[int, Collective] = weakref.WeakValueDictionary()
        # The optional fields some member has: the others are () in every view.
        self._present = {name for name in _OPTIONAL
                         if any(m is not None and m.columns[name][0] is not None for m in members)}
        self.gpu_timed = "duration_ns" in self._present  # some member has a GPU time of some collective
        self.on_gpu = self.gpu_timed or gpu_backend(group.backend)
        self._transposed: dict[str, list[tuple]] = {}
        self._reads: dict[str, int] = {}  # of a small group's fields not transposed yet
        self._small = len(self.ranks) * len(self.seqs) <= SMALL_GROUP_CELLS
        self._held: list[Collective] = []

    # --- Sequence -------------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.seqs)

    @overload
    def __getitem__(self, i: int) -> Collective: ...

    @overload
    def __getitem__(self, i: slice) -> list[Collective]: ...

    def __getitem__(self, i: int | slice) -> Collective | list[Collective]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self.seqs)))]
        if i < 0:
            i += len(self.seqs)
        if not 0 <= i < len(self.seqs):
            raise IndexError(i)
        view = self._views.get(i)
        if view is None:
            view = Collective(self.group, self.seqs[i], self.ranks, self, i, self.stacks)
            self._views[i] = view
            if self._small:  # a small group's views are kept: every pass over it reuses them
                self._held.append(view)
        return view

    def __iter__(self) -> Iterator[Collective]:
        for i in range(len(self.seqs)):
            yield self[i]

    def find(self, seq: int) -> Collective | None:
        """The collective with this seq, or None."""
        if isinstance(self.seqs, range):
            i = seq - self.seqs.start
            return self[i] if 0 <= i < len(self.seqs) else None
        if self._index is None:
            self._index = {s: k for k, s in enumerate(self.seqs)}
        k = self._index.get(seq)
        return None if k is None else self[k]

    # --- CollectiveColumns (what the views read) --------------------------------------------------------------

    def values(self, name: str, index: int) -> tuple:
        if name in _OPTIONAL and name not in self._present:
            return ()
        if self._small:  # a small group read by a pass: every tuple at once, in C
            table = self._transposed.get(name)
            if table is not None:
                return table[index]
            reads = self._reads[name] = self._reads.get(name, 0) + 1
            if reads > TRANSPOSE_AFTER:
                table = self._transposed[name] = list(zip(*(self.member_column(name, r) for r in self.ranks)))
                return table[index]
        seq = self.seqs[index]
        out: list = []
        for run in self._runs:
            out += run.gather(name, seq)
        return tuple(out)

    def position(self, rank: int) -> int:
        if self._positions is None:
            self._positions = {r: i for i, r in enumerate(self.ranks)}
        try:
            return self._positions[rank]
        except KeyError:
            raise ValueError(f"rank {rank} is not a member of group {self.group.uid}") from None

    def settled_prefix(self) -> int:
        """How many leading collectives every member recorded, with one signature, and none left unfinished
        (every state completed or unknown): what a search for the first problem may skip. Found a column at a
        time in C; 0 when the members' tracks do not allow it (a rank without data, merged or scattered rows)."""
        if not isinstance(self.seqs, range) or not self.seqs:
            return 0
        lo, limit = self.seqs.start, len(self.seqs)
        ref: tuple[list, Any] | None = None  # the first member's signature ids and how they decode
        for m in self._members:
            if m is None or m.shape[0] != "compact" or m.first != lo:
                return 0
            limit = min(limit, m.n, _first_unfinished(m.columns["states"][0]))
            sig_col, lookup = m.columns["signatures"]
            if ref is None:
                ref = (sig_col, lookup)
            elif lookup is ref[1]:
                limit = min(limit, _common_prefix(sig_col, ref[0], limit))
            else:
                limit = min(limit, _common_prefix(_decode(list(sig_col[:limit]), lookup),
                                                  _decode(list(ref[0][:limit]), ref[1]), limit))
            if limit == 0:
                return 0
        return limit

    def member_column(self, name: str, rank: int) -> list:
        """``rank``'s value of field ``name`` in every collective of the group, in order (None where it has
        no record): the column a trace writer walks, decoded at C speed."""
        m = self._members[self.position(rank)]
        n = len(self.seqs)
        if name in _OPTIONAL and name not in self._present:
            return [None] * n
        if m is None:
            return [None] * n
        values = m.column(name)
        if isinstance(self.seqs, range) and m.contiguous:
            lo = self.seqs.start
            return [None] * (m.first - lo) + values + [None] * (n - (m.first - lo) - m.n)
        out: list = [None] * n
        find = self.find_index
        for s, v in zip(m.seqs, values):
            out[find(s)] = v
        return out

    def value(self, name: str, rank: int, index: int) -> Any:
        """``rank``'s value of field ``name`` in the ``index``-th collective (None where it has no record),
        without gathering the other ranks'."""
        m = self._members[self.position(rank)]
        row = m.row(self.seqs[index]) if m is not None else None
        if m is None or row is None:
            return None
        col, how = m.field(name)
        if col is None:
            return how if isinstance(how, str) else None
        return _decode([col[row]], how)[0]

    def find_index(self, seq: int) -> int:
        if isinstance(self.seqs, range):
            return seq - self.seqs.start
        if self._index is None:
            self._index = {s: k for k, s in enumerate(self.seqs)}
        return self._index[seq]


# State codes (see sources.fr.columns.STATES) of a finished collective, or one whose end cannot be known: 0.
_SETTLED = bytes.maketrans(bytes([STATES.index(CallState.UNKNOWN)]), b"\0")


def _first_unfinished(states: Sequence[int]) -> int:
    raw = bytes(states).translate(_SETTLED) if not isinstance(states, list) else b""
    return len(raw) - len(raw.lstrip(b"\0")) if raw else 0


def _common_prefix(a: Sequence, b: Sequence, limit: int) -> int:
    """Length of the common prefix of two columns, at most ``limit``: C-level slice comparisons."""
    if a[:limit] == b[:limit]:
        return limit
    lo, hi = 0, limit  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def _union_seqs(members: list[_Member]) -> Sequence[int]:
    """Every seq some member recorded, ascending: a ``range`` when they form one interval."""
    if not members:
        return range(0)
    if all(m.contiguous for m in members):
        spans = sorted({(m.first, m.first + m.n - 1) for m in members})
        lo, hi = spans[0]
        covered = True
        for a, b in spans[1:]:
            if a > hi + 1:
                covered = False
                break
            hi = max(hi, b)
        if covered:
            return range(lo, hi + 1)
    seen: set[int] = set()
    for m in members:
        seen.update(m.seqs)
    return sorted(seen)
