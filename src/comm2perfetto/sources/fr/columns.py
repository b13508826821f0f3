"""One rank's collectives on one process group as compact typed columns (``GroupTrack``). Never imports torch.

A Flight Recorder entry costs about 1.5 KB as the unpickled dict and about 440 bytes as Python lists of ints,
strings and objects. Held as ``array.array`` columns it costs 49 bytes (the seq, three times and the GPU
duration in 8 bytes each, a signature id and a stack id in 4, the state in 1), whatever its frames, and a
rank's track crosses the process boundary as a few byte strings: the worker that parsed the dumps pickles
the arrays as their raw buffers. Strings, shapes and stacks are interned: a track holds ids into its small
tables (``sig_table``: the signatures, ``stack_table``: stacks by id in the job's ``StackTable``), not objects.

``array.array`` rather than numpy or Arrow: the columns are only stored, sliced and read back (the matching
reads one collective's values across ranks, or one rank's values across collectives, both C-level slices and
``tolist``), which ``array`` does as fast, with nothing to import: numpy costs about 100 ms of start-up here
(more than a 4-rank diagnose takes in all); pyarrow (not installed here) was not measured.

Missing values are ``NO_VALUE`` (-1): every time and id a reader accepts is >= 0 (``limits.count_ok``).

>>> t = GroupTrack.from_columns("0", "default_pg", {0}, [1], [_SIG], ["completed"], [10**18], [None],
...                             [10**18 + 5], [None], [0], [0.0025])
>>> t.seqs, t.states, t.started_ns, t.durations_ns
([1], ['completed'], [None], [2500])
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from comm2perfetto.model import COMPLETED, FAILED, PENDING, SCHEDULED, STARTED, UNKNOWN, Signature

NO_VALUE = -1
# The first bytes of a rank's columns written to disk (``compact.py``), which tell the file apart.
COLUMNS_MAGIC = b"C2P-FR-COLUMNS 1\n"
# State codes: COMPLETED is 0, so the first unfinished row of a track is found in C (see ``first_not_done``).
STATES: tuple[str, ...] = (COMPLETED, STARTED, SCHEDULED, PENDING, FAILED, UNKNOWN)
STATE_CODE = {s: i for i, s in enumerate(STATES)}
# Decoding tables with a trailing None, so that NO_VALUE (-1) decodes to None in one C-level lookup.
STATE_LOOKUP: tuple[str | None, ...] = (*STATES, None)

_SIG = Signature("all_reduce", ((4,),), ("Float",), ((4,),), ("Float",))  # for the doctest


def times(values: Sequence[int | None]) -> array:
    """A column of optional non-negative ints (times, ids) as int64, None as ``NO_VALUE``."""
    if None not in values:
        return array("q", values)
    return array("q", [NO_VALUE if v is None else v for v in values])


def ms_to_ns(col: Sequence[float]) -> list[int | None]:
    """Durations in ms (-1: unknown) as ns."""
    return [None if v < 0 else round(v * 1_000_000) for v in col]


def optional(col: array) -> list[int | None]:
    """The inverse of :func:`times`."""
    return [None if v < 0 else v for v in col]


@dataclass(slots=True)
class GroupTrack:
    """One rank's collectives on one process group, one row per collective in seq order.

    Columns (all of one length): ``seq_col`` (int64), ``sig_col`` (int32, into ``sig_table``), ``state_col``
    (int8, into ``STATES``), ``created_col``/``started_col``/``completed_col`` (int64 ns, ``NO_VALUE`` where
    unknown), ``stack_col`` (int32 into ``stack_table``; None when loaded without stacks), ``duration_col``
    (float64 ms of GPU time, as Flight Recorder writes it, -1 where unknown; None when no row has one).
    ``p2p``: the group's point-to-point ops, as tuples ``(kind, peer group rank, p2p_seq, sig, state,
    created, completed, stack id, record id)`` (few per rank).
    """

    name: str
    desc: str
    pg_ids: set[int] = field(default_factory=set)
    seq_col: array = field(default_factory=lambda: array("q"))
    sig_col: array = field(default_factory=lambda: array("i"))
    sig_table: list[Signature] = field(default_factory=list)
    state_col: array = field(default_factory=lambda: array("b"))
    created_col: array = field(default_factory=lambda: array("q"))
    started_col: array = field(default_factory=lambda: array("q"))
    completed_col: array = field(default_factory=lambda: array("q"))
    stack_col: array | None = None
    stack_table: list[int] = field(default_factory=list)
    duration_col: array | None = None
    first_record_id: int = NO_VALUE  # the oldest record of this group's collectives (a ring that wrapped: > 0)
    p2p: list[tuple] = field(default_factory=list)

    @classmethod
    def from_columns(cls, name: str, desc: str, pg_ids: set[int], seqs: Sequence[int], sigs: Sequence[Signature],
                     states: Sequence[str], created: Sequence[int | None], started: Sequence[int | None],
                     completed: Sequence[int | None], stack_ids: Sequence[int | None],
                     record_ids: Sequence[int | None], durations_ms: Sequence[float | None],
                     p2p: list[tuple] | None = None) -> GroupTrack:
        """Pack columns of one length, in seq order (what ``ingest`` assembles), into a track."""
        track = cls(name, desc, set(pg_ids), p2p=p2p or [])
        if not seqs:
            return track
        track.seq_col = array("q", seqs)
        by_id = dict(zip(map(id, sigs), sigs))  # a handful of distinct signature objects among thousands of rows
        table = list(by_id.values())
        ids = {k: i for i, k in enumerate(by_id)}
        track.sig_col = array("i", map(ids.__getitem__, map(id, sigs)))
        track.sig_table = table
        track.state_col = array("b", map(STATE_CODE.__getitem__, states))
        track.created_col, track.started_col, track.completed_col = times(created), times(started), times(completed)
        if stack_ids.count(None) != len(stack_ids):
            track.stack_table = sorted({s for s in stack_ids if s is not None})
            local = {s: i for i, s in enumerate(track.stack_table)}
            track.stack_col = array("i", [NO_VALUE if s is None else local[s] for s in stack_ids])
        if durations_ms.count(None) != len(durations_ms):
            track.duration_col = array("d", [-1.0 if d is None else d for d in durations_ms])
        known = [r for r in record_ids if r is not None]
        track.first_record_id = min(known) if known else NO_VALUE
        return track

    def __len__(self) -> int:
        return len(self.seq_col)

    # --- decoded views (tests and cold paths; the matching reads the columns) ---------------------------

    @property
    def seqs(self) -> list[int]:
        return self.seq_col.tolist()

    @property
    def sigs(self) -> list[Signature]:
        return list(map(self.sig_table.__getitem__, self.sig_col))

    @property
    def states(self) -> list[str]:
        return list(map(STATES.__getitem__, self.state_col))

    @property
    def created_ns(self) -> list[int | None]:
        return optional(self.created_col)

    @property
    def started_ns(self) -> list[int | None]:
        return optional(self.started_col)

    @property
    def completed_ns(self) -> list[int | None]:
        return optional(self.completed_col)

    @property
    def stack_ids(self) -> list[int | None]:
        if self.stack_col is None:
            return [None] * len(self.seq_col)
        return [None if i < 0 else self.stack_table[i] for i in self.stack_col]

    @property
    def durations_ns(self) -> list[int | None]:
        if self.duration_col is None:
            return [None] * len(self.seq_col)
        return ms_to_ns(self.duration_col)

    def first_not_done(self) -> int:
        """Index of the first row not known completed (``len(self)`` when every row is)."""
        raw = self.state_col.tobytes()
        return len(raw) - len(raw.lstrip(b"\0"))

    def held_bytes(self) -> int:
        """Bytes of the columns (what the track costs, its few table entries aside)."""
        cols: list[Any] = [self.seq_col, self.sig_col, self.state_col, self.created_col, self.started_col,
                           self.completed_col, self.stack_col, self.duration_col]
        return sum(c.itemsize * len(c) for c in cols if c is not None)
