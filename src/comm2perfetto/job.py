"""The loaded job: ``Job``, everything one job left behind, read (``match.load_job``), aligned and matched across
its ranks, as every product reads it (``diagnose/``, ``report/``, ``trace/``, ``render/``, the ``cli/``
commands). Never imports torch.

A ``Job`` holds its ``ProcessGroup``s (in one order, ``Job.groups_in_order``), per group its collectives as one
view over the ranks' columns (``model.GroupView`` of ``model.Collective``) and its ``P2PTransfer``s, each rank's
``RankInfo`` and, per (rank, group), its ``Coverage`` (which collectives its data can speak about), the
``ClockAlignment``, what was skipped, and the readers' own views on the job's clock (logs, stall stacks,
profiler traces and their profiles). What a collective is, and the vocabulary of a call, are ``model``'s.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

from comm2perfetto.load_options import LoadOptions
from comm2perfetto.model import (
    ClockAlignment,
    Collective,
    GroupView,
    P2POp,
    P2PTransfer,
    ProcessGroup,
    Skipped,
    Stack,
    known_values,
)

if TYPE_CHECKING:  # for the annotations only: the readers import this module, not the reverse
    from comm2perfetto.group_names import GroupConflict
    from comm2perfetto.sources.event_log import RankLog
    from comm2perfetto.sources.kineto.collectives import TraceCollective
    from comm2perfetto.sources.kineto.events import KinetoTrace
    from comm2perfetto.sources.kineto.profile import RankProfile
    from comm2perfetto.sources.stacks import StallStacks

__all__ = ["Coverage", "Job", "RankExit", "RankInfo"]


def _empty() -> Mapping:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Coverage:
    """Which collectives of one group one rank's data can speak about.

    ``first_seq``/``last_seq`` bound the sequence numbers this rank recorded. Flight Recorder is a ring
    buffer: a seq below ``first_seq`` may have happened and been overwritten. ``complete_fr`` is true when
    a Flight Recorder dump of this rank was read (so a seq above ``last_seq`` was not issued before the
    dump); a rank known only from the recorder's log can have gaps (collectives issued from C++).
    ``unread``: seqs (closed intervals) where this rank's dump held an entry whose identity could not be
    read: its record of them is unknown, whatever ``has_fr`` says; ``unread_p2p``: a send or recv of it on
    this group was (which of its sends and recvs pairs with which of its peers' is unknown).
    """

    rank: int
    group_uid: str
    first_seq: int
    last_seq: int
    has_fr: bool
    has_log: bool
    completed_upto: int  # every seq <= this is known completed on this rank (-1: none known)
    unread: tuple[tuple[int, int], ...] = ()
    unread_p2p: bool = False

    def unread_at(self, seq: int) -> bool:
        """Whether this rank's record of ``seq`` was unreadable (see ``unread``)."""
        return any(lo <= seq <= hi for lo, hi in self.unread)


# Two hosts' clocks agree only as well as their alignment: exits seen by different `record`s are ordered only
# when they lie further apart than this.
CROSS_HOST_MARGIN_NS = 10 * 10**6


@dataclass(frozen=True, slots=True)
class RankExit:
    """When the `record` of the rank's host saw its process end (``exit_watch``): alive at ``alive_ns`` (None: not
    seen alive), ended by ``t_ns``, both on that host's clock, and ``t_ns`` on the job's clock (``aligned_ns``); how:
    the ``signal`` that ended it or its exit ``status`` (both None: the launcher reaped it before `record` looked).

    >>> a, b = RankExit("n0", 100, 200, 200, "SIGKILL", None), RankExit("n0", 250, 300, 300, "SIGTERM", None)
    >>> a.before(b), b.before(a), a.how
    (True, False, 'SIGKILL')
    """

    host: str | None
    alive_ns: int | None
    t_ns: int
    aligned_ns: int
    signal: str | None
    status: int | None

    def before(self, other: RankExit) -> bool:
        """Whether this process is known to have ended first: seen ended before the other was seen alive (on one
        host's clock), or, seen by two hosts, further apart than their clocks' agreement."""
        if other.alive_ns is None:
            return False
        if self.host is not None and self.host == other.host:
            return self.t_ns < other.alive_ns
        return self.aligned_ns + CROSS_HOST_MARGIN_NS < other.aligned_ns - (other.t_ns - other.alive_ns)

    @property
    def how(self) -> str | None:
        """``SIGKILL``, ``exit status 1``, or None where not seen."""
        if self.signal is not None:
            return self.signal
        return f"exit status {self.status}" if self.status is not None else None


@dataclass(frozen=True, slots=True)
class RankInfo:
    rank: int
    host: str | None
    pid: int | None
    fr_files: tuple[str, ...]
    log_file: str | None
    stacks_files: tuple[str, ...]
    kineto_files: tuple[str, ...]
    closed_cleanly: bool | None  # None: no recorder log
    backend: str | None
    # The rest come from the recorder's log (None or empty without one); times aligned to rank 0's clock.
    first_ns: int | None = None  # the rank's horizon: its first and last record (heartbeats included)
    last_ns: int | None = None
    closed_reason: str | None = None  # the log's `z` record: exit, signal, destroy...
    endings: tuple[tuple[int, str, str], ...] = ()  # (t_ns, "signal" | "exception", detail), the `u` records
    heartbeats: bool = False  # the log has `h` records: a stale last record means the process is gone
    alive: bool | None = None  # an unclosed log's process, probed on this host; None: not known
    stopped: bool = False  # its process, on the reader's host, is stopped (SIGSTOP, a debugger) now
    stall_after_ns: int | None = None  # the recorder's stall threshold on that rank (None: off or unknown)
    exit: RankExit | None = None  # when and how `record` saw its process end


@dataclass(frozen=True, slots=True)
class Job:
    """Everything one job left behind, loaded, aligned and matched."""

    world_size: int | None
    ranks: Mapping[int, RankInfo]
    groups: Mapping[str, ProcessGroup]
    collectives: Mapping[str, GroupView]  # by group uid, in seq order (views over columns)
    p2p: Mapping[str, tuple[P2PTransfer, ...]]  # by group uid
    coverage: Mapping[tuple[int, str], Coverage]  # by (rank, group uid)
    stacks: tuple[Stack, ...]
    clock: ClockAlignment
    skipped: tuple[Skipped, ...] = ()
    notes: tuple[str, ...] = ()
    # The per-rank views below are on the job's clock (``match.build_job`` moved them there, once).
    logs: Mapping[int, RankLog] = field(default_factory=_empty, repr=False, compare=False)  # the recorder's logs
    # rank -> what it wrote at its latest stall
    stall_stacks: Mapping[int, StallStacks] = field(default_factory=_empty, repr=False, compare=False)
    job_info: Mapping | None = None  # the job file written last (see ``jobs``)
    jobs: tuple[Mapping, ...] = ()  # every job file: one per `record` process (one per node)
    unusable_ranks: frozenset[int] = frozenset()  # ranks whose every dump was skipped (truncated, corrupt)
    # Per group uid: the seqs some rank's recorder saw issued from Python. A seq the recorder did not see on
    # any rank was issued from C++ (DDP...), so a rank known only from its log may have issued it unseen.
    log_seqs: Mapping[str, frozenset[int]] = field(default_factory=_empty, repr=False, compare=False)
    # rank -> that rank's profiler traces (every event for merge, the communication events for the others)
    traces: Mapping[int, tuple[KinetoTrace, ...]] = field(default_factory=_empty, repr=False, compare=False)
    # Reads stacks on demand when the job was loaded without them: (rank, group name, seq[, p2p]) -> Stack.
    resolver: Callable[..., Stack] | None = field(default=None, repr=False, compare=False)
    # rank -> the collectives of its profiler traces made by kernels of a library that names no process group
    # (``comm_kernels.family_op``: DeepEP's all-to-all), which no group's collectives hold
    kernel_collectives: Mapping[int, tuple[TraceCollective, ...]] = field(default_factory=_empty, repr=False,
                                                                          compare=False)
    # rank -> its profiler traces reduced to unions (loaded with ``LoadOptions.profiles``: what ``report`` measures)
    profiles: Mapping[int, RankProfile] = field(default_factory=_empty, repr=False, compare=False)
    # Of a job torchrun restarted (``attempt<k>`` folders): the attempt loaded, and every attempt found.
    attempt: int = 0
    attempts: tuple[int, ...] = (0,)
    # The ranks with data are a sample of a larger job (``world_size``): "traces" when only profiler traces
    # came (people profile a few ranks), "data" when the user said so (--sample); None when not: a rank
    # without data is then one that should have left some. A sample's other ranks are not suspects.
    sampled: str | None = None
    # Groups the ranks know by different c10d names (they created their groups in different orders).
    group_conflicts: tuple[GroupConflict, ...] = ()
    # Where it was read from and how (``match.load_job``): another attempt of the job is read the same way.
    paths: tuple[str, ...] = ()
    options: LoadOptions = field(default_factory=LoadOptions, repr=False, compare=False)

    @property
    def ranks_with_data(self) -> tuple[int, ...]:
        return tuple(sorted(self.ranks))

    def groups_in_order(self) -> list[ProcessGroup]:
        """The process groups in the order c10d created them, the one order diagnose and the trace use: c10d
        numbers the groups it names itself as it creates them (``"0"`` is the default group), so those come
        first, by number; groups named otherwise follow, by uid."""
        def key(g: ProcessGroup) -> tuple[int, int, str]:
            return (0, int(g.name), g.uid) if g.name.isdigit() else (1, 0, g.uid)

        return sorted(self.groups.values(), key=key)

    def iter_collectives(self) -> Iterator[Collective]:
        for cols in self.collectives.values():
            yield from cols

    def collectives_span(self) -> tuple[int | None, int | None]:
        """The first arrival at any collective and the last arrival or end (None where there is none), read a
        collective at a time: a list of every rank's times would hold 33 million ints at 16,384 ranks.

        The merge's time origin and the trace's last instant, the same two times for both."""
        first: int | None = None
        last: int | None = None
        for c in self.iter_collectives():
            arrivals, ends = known_values(c.arrive_ns), known_values(c.end_ns)
            if arrivals:
                lo, hi = min(arrivals), max(arrivals)
                first = lo if first is None or lo < first else first
                last = hi if last is None or hi > last else last
            if ends:
                hi = max(ends)
                last = hi if last is None or hi > last else last
        return first, last

    def stack_of(self, c: Collective, rank: int) -> Stack:
        """The call stack of ``rank``'s part in ``c`` (read from its dump now if it was loaded lazily)."""
        i = c.index_of(rank)
        sid = c.stack_ids[i]
        if sid is not None:
            return self.stack(sid)
        if self.resolver is not None and c.signatures[i] is not None and c.sources[i] != "log":
            return self.resolver(rank, c.group.name, c.seq)
        return ()

    def p2p_stack(self, op: P2POp) -> Stack:
        """The call stack of a send or recv (read from its rank's dump now if it was loaded lazily)."""
        if op.stack_id is not None:
            return self.stack(op.stack_id)
        group = self.groups.get(op.group_uid)
        if self.resolver is not None and op.source == "fr" and op.seq is not None and group is not None:
            return self.resolver(op.rank, group.name, op.seq, True)
        return ()

    def stack(self, stack_id: int | None) -> Stack:
        return self.stacks[stack_id] if stack_id is not None and 0 <= stack_id < len(self.stacks) else ()
