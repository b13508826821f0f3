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

>>> q = lambda *values: array("q", values)
>>> t = GroupTrack.from_arrays("0", "default_pg", {0}, q(1), array("i", [0]), [_SIG], bytes([STATE_CODE["completed"]]),
...                            q(10**18), q(NO_VALUE), q(10**18 + 5), None, q(0), array("d", [0.0025]))
>>> t.seqs, t.states == [CallState.COMPLETED], t.started_ns, t.durations_ns
([1], True, [None], [2500])
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import repeat
from operator import mul
from typing import Any

from comm2perfetto.model import CallState, Signature

NO_VALUE = -1
# The first bytes of a rank's columns written to disk (``compact.py``), which tell the file apart.
COLUMNS_MAGIC = b"C2P-FR-COLUMNS 1\n"
# State codes: COMPLETED is 0, so the first unfinished row of a track is found in C (see ``first_not_done``).
STATES: tuple[CallState, ...] = (CallState.COMPLETED, CallState.STARTED, CallState.SCHEDULED, CallState.PENDING,
                                 CallState.FAILED, CallState.UNKNOWN)
STATE_CODE = {s: i for i, s in enumerate(STATES)}
# Decoding tables with a trailing None, so that NO_VALUE (-1) decodes to None in one C-level lookup.
STATE_LOOKUP: tuple[CallState | None, ...] = (*STATES, None)

_SIG = Signature("all_reduce", ((4,),), ("Float",), ((4,),), ("Float",))  # for the doctest


def ms_to_ns_col(col: array) -> array:
    """A column of durations in ms (-1: unknown) as int64 ns (``NO_VALUE``: unknown).

    >>> ms_to_ns_col(array("d", [0.25, -1.0]))
    array('q', [250000, -1])
    """
    ns = list(map(round, map(mul, col, repeat(1_000_000.0))))
    return array("q", ns if not ns or min(ns) >= 0 else [NO_VALUE if v < 0 else v for v in ns])


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
    def from_arrays(cls, name: str, desc: str, pg_ids: set[int], seqs: array, sig_ids: array,
                    sig_table: list[Signature], states: bytes, created: array, started: array, completed: array,
                    stack_ids: Sequence[int | None] | None, record_ids: array, durations_ms: array | None,
                    p2p: list[tuple] | None = None) -> GroupTrack:
        """A track from columns of one length in seq order, as ``ingest`` assembles them: ``seqs``, the
        times (``NO_VALUE`` where unknown) and ``record_ids`` int64, ``sig_ids`` int32 into ``sig_table``,
        ``states`` codes into ``STATES`` one byte a row, ``stack_ids`` ids in the job's ``StackTable`` (None:
        not read), ``durations_ms`` float64 (-1 where unknown; None: no row has one)."""
        track = cls(name, desc, set(pg_ids), p2p=p2p or [])
        if not seqs:
            return track
        track.seq_col, track.sig_col, track.sig_table = seqs, sig_ids, sig_table
        track.state_col = array("b", states)
        track.created_col, track.started_col, track.completed_col = created, started, completed
        if stack_ids is not None and stack_ids.count(None) != len(stack_ids):
            track.stack_table = sorted({s for s in stack_ids if s is not None})
            local = {s: i for i, s in enumerate(track.stack_table)}
            track.stack_col = array("i", [NO_VALUE if s is None else local[s] for s in stack_ids])
        track.duration_col = durations_ms
        first = min(record_ids)
        # NO_VALUE: a record id that failed its check; the oldest readable one counts
        track.first_record_id = first if first != NO_VALUE else min((r for r in record_ids if r >= 0), default=NO_VALUE)
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
    def states(self) -> list[CallState]:
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
        return optional(ms_to_ns_col(self.duration_col))

    def first_not_done(self) -> int:
        """Index of the first row not known completed (``len(self)`` when every row is)."""
        raw = self.state_col.tobytes()
        return len(raw) - len(raw.lstrip(b"\0"))

    def held_bytes(self) -> int:
        """Bytes of the columns (what the track costs, its few table entries aside)."""
        cols: list[Any] = [self.seq_col, self.sig_col, self.state_col, self.created_col, self.started_col,
                           self.completed_col, self.stack_col, self.duration_col]
        return sum(c.itemsize * len(c) for c in cols if c is not None)
