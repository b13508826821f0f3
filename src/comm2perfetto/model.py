"""What a job is made of, as plain frozen data that ``sources/`` and ``match.py`` build and every product reads:
one ``Collective`` per (process group, sequence number), read as a view over the ranks' columns (a group's are
a ``GroupView``), one ``P2PTransfer`` per send/recv pair, the ``ProcessGroup``s, the ``ClockAlignment``, the
files ``Skipped``; and the vocabulary of a call: its state (``CallState``), ``Signature`` (what a rank asked a
collective to do; ``Exchange``, an all-to-all's elements to and from each peer) with
``DTYPE_BYTES``/``tensor_bytes`` and ``op_family``, ``Frame``/``Stack`` with ``call_site``. ``job.Job`` holds
them. Never imports torch.

Times are ``int`` nanoseconds of ``CLOCK_REALTIME`` (the clock Flight Recorder and the recorder use); once a
``Job`` is built they are aligned to rank 0's clock (see ``align.py``). ``None`` means "not known".

The per-rank data of collectives is stored column-wise (per rank and group, compact typed columns) rather
than as one object per rank and collective: a 16,384-rank job with 2000 collectives would otherwise build
33 million objects. A ``Collective`` is a view that builds its per-rank tuples when read, and
``Collective.part(rank)`` one rank's share.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import compress
from types import MappingProxyType
from typing import Any, Generic, Protocol, TypeVar, cast, overload

from comm2perfetto.exchange import Exchange
from comm2perfetto.strenum import StrEnum


class CallState(StrEnum):
    """Per-rank state of a call: Flight Recorder's three, and what the recorder adds."""

    COMPLETED = "completed"
    STARTED = "started"
    SCHEDULED = "scheduled"
    PENDING = "pending"  # the recorder saw the call begin and never return
    FAILED = "failed"  # the call raised
    UNKNOWN = "unknown"  # the source cannot tell (gloo never updates Flight Recorder states)


NOT_DONE_STATES = frozenset({CallState.STARTED, CallState.SCHEDULED, CallState.PENDING, CallState.FAILED})
# The members by their short names, as sources.fr.ingest and diagnose/ import them.
COMPLETED, STARTED, SCHEDULED = CallState.COMPLETED, CallState.STARTED, CallState.SCHEDULED
PENDING, FAILED, UNKNOWN = CallState.PENDING, CallState.FAILED, CallState.UNKNOWN

# Bytes per element of the dtypes Flight Recorder and the recorder name ("Float", "BFloat16" ...).
DTYPE_BYTES = {
    "Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4, "Short": 2, "Char": 1, "Byte": 1,
    "Bool": 1, "ComplexFloat": 8, "ComplexDouble": 16, "ComplexHalf": 4, "Float8_e4m3fn": 1, "Float8_e5m2": 1,
    "Float8_e4m3fnuz": 1, "Float8_e5m2fnuz": 1, "UInt16": 2, "UInt32": 4, "UInt64": 8,
}


def tensor_bytes(sizes: tuple[tuple[int, ...], ...] | None, dtypes: tuple[str, ...] | None) -> int | None:
    """Total bytes of tensors given as shapes and dtype names; None when a shape or dtype is unknown.

    >>> tensor_bytes(((4, 8), (2,)), ("Float", "BFloat16"))
    132
    """
    if sizes is None or not dtypes or len(dtypes) < len(sizes):
        return None
    total = 0
    for shape, dtype in zip(sizes, dtypes):
        size = DTYPE_BYTES.get(dtype)
        if size is None:
            return None
        total += math.prod(shape) * size
    return total


_ALL_TO_ALL = ("all_to_all", "alltoall")
_FAMILY = {
    "allreduce": "all_reduce", "all_reduce": "all_reduce", "allreduce_coalesced": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "all_gather": "all_gather", "_all_gather_base": "all_gather", "all_gather_base": "all_gather",
    "_allgather_base": "all_gather", "allgather": "all_gather", "all_gather_into_tensor": "all_gather",
    "all_gather_object": "all_gather", "all_gather_into_tensor_coalesced": "all_gather",
    "ALLGATHER_coalesced": "all_gather", "allgather_coalesced": "all_gather", "all_gather_single": "all_gather",
    "allgather_into_tensor_coalesced": "all_gather",
    "reduce_scatter": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter", "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "REDUCE_SCATTER_coalesced": "reduce_scatter", "reduce_scatter_single": "reduce_scatter",
    "broadcast": "broadcast", "_broadcast_oop": "broadcast", "broadcast_object_list": "broadcast",
    "reduce": "reduce", "_reduce_oop": "reduce",
    "barrier": "barrier", "all_reduce_barrier": "barrier", "monitored_barrier": "barrier",
    "gather": "gather", "gather_object": "gather", "scatter": "scatter", "scatter_object_list": "scatter",
}


ROOTED_FAMILIES = frozenset({"broadcast", "reduce", "gather", "scatter"})  # ops that name a src or dst rank


# Communication libraries that run collectives as GPU kernels: what they do takes GPU time only.
_GPU_LIBRARIES = ("nccl", "rccl", "xccl", "hccl")


def gpu_backend(backend: str | None) -> bool:
    """Whether a group's backend runs every collective and send/recv on a GPU (``nccl``, ``cuda:nccl``), so that
    a CPU call's return or Flight Recorder's discovery times say nothing of its duration; not a mixed
    ``cpu:gloo,cuda:nccl``, whose CPU tensors go to gloo.

    >>> gpu_backend("nccl"), gpu_backend("cpu:gloo,cuda:nccl"), gpu_backend("gloo"), gpu_backend(None)
    (True, False, False, False)
    """
    return bool(backend) and all(any(lib in part for lib in _GPU_LIBRARIES)
                                 for part in backend.lower().split(","))  # type: ignore[union-attr]


def work_span(arrive: int | None, end: int | None, gpu_begin: int | None, gpu_ns: int | None,
              on_gpu: bool) -> tuple[int | None, int | None]:
    """(begin, end) of one rank's part of a collective: its GPU work where a trace shows it (``gpu_begin``
    and ``gpu_ns``); on a GPU with only Flight Recorder's ``duration_ms`` (``gpu_ns``), that long from its
    enqueue (where the GPU began it is not known, but not before); on a GPU without either, no end: Flight
    Recorder's end is when the watchdog noticed it, not when it ended; else (CPU backends) arrival to end.

    >>> work_span(100, 900, 300, 40, True), work_span(100, 900, None, 40, True), work_span(100, 900, None, None, True)
    ((300, 340), (100, 140), (100, None))
    >>> work_span(100, 900, None, None, False)
    (100, 900)
    """
    if gpu_ns is not None and gpu_begin is not None:
        return gpu_begin, gpu_begin + gpu_ns
    if not on_gpu:
        return arrive, end
    return arrive, arrive + gpu_ns if gpu_ns is not None and arrive is not None else None


def op_family(op: str) -> str:
    """The collective an op name stands for, whatever the source's spelling: ``_allgather_base`` -> ``all_gather``."""
    if any(op.startswith(p) for p in _ALL_TO_ALL):
        return "all_to_all"
    return _FAMILY.get(op, op)


def _empty() -> Mapping:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Frame:
    """One Python frame. ``file`` as recorded (often a full path)."""

    file: str
    line: int
    func: str

    @property
    def site(self) -> str:
        """``train.py:57``: the short form used in reports."""
        return f"{os.path.basename(self.file)}:{self.line}"

    def __str__(self) -> str:
        return f"{self.site} {self.func}" if self.func else self.site


Stack = tuple[Frame, ...]  # innermost first, as Flight Recorder and the stall stacks store them


@dataclass(frozen=True, slots=True)
class ProcessGroup:
    """A process group as the whole job knows it.

    ``uid`` is unique in the job: c10d's group ``name`` alone is not (``split_group`` reuses names for
    disjoint groups), so the global ranks are part of it, e.g. ``"1[0,2]"``. ``ranks_source`` says where the
    membership came from: ``pg_config`` (Flight Recorder), ``log`` (the recorder's ``g`` record),
    ``world`` (the default group is every rank), ``profiler`` (a trace's ``Process Group Ranks``) or
    ``inferred`` (the ranks whose dumps mention it).
    """

    uid: str
    name: str
    desc: str
    ranks: tuple[int, ...]
    backend: str | None = None
    ranks_source: str = "pg_config"
    # Where two groups of the job share a description (ranks that created their groups in different orders):
    # ``X (group 2)``, so that no text calls two groups by one name.
    shown: str = ""

    @property
    def label(self) -> str:
        """``default_pg`` or ``1`` for display: the description when the user gave one."""
        if self.shown:
            return self.shown
        return self.desc if self.desc and self.desc != "undefined" else self.name

    def global_rank(self, group_rank: int) -> int | None:
        """Global rank of a rank numbered inside the group (Flight Recorder's ``send 1->0`` uses those)."""
        ordered = sorted(self.ranks)
        return ordered[group_rank] if 0 <= group_rank < len(ordered) else None


@dataclass(frozen=True, slots=True)
class Signature:
    """What a rank asked a collective to do; equal signatures on every rank is what a collective needs.

    ``source`` is ``fr`` (a Flight Recorder entry: exact op name, input and output sizes and dtypes) or
    ``log`` (the recorder: public function name, input shapes and dtypes only; outputs are ``None``).
    A coalesced group has one signature whose ``parts`` are its member ops, in issue order. ``root``: the global
    rank a broadcast, reduce, gather or scatter names as its ``src``/``dst`` (from the recorder; None: unknown).

    From the recorder too, for calls whose sizes gloo checks only by aborting a rank: ``exchange``, an
    all-to-all's per-peer element counts; ``objects``, the length of an object collective's list
    (``broadcast_object_list``'s, ``all_gather_object``'s output list, ``gather_object``'s gather list and
    ``scatter_object_list``'s input list, None on the ranks that pass none; ``send_object_list``'s and
    ``recv_object_list``'s). ``fr_op``: set where the recorder's call was joined to the Flight Recorder entry of
    the same group and seq (``tracks.joined_signature``): Flight Recorder's name for it, which differs from ``op``
    (the user's) where the backend implements the call by another collective (gloo's ``all_reduce`` for
    ``reduce_scatter_tensor``, its ``broadcast`` of sizes for ``broadcast_object_list``). None: no such join.
    """

    op: str
    input_sizes: tuple[tuple[int, ...], ...] | None
    input_dtypes: tuple[str, ...] | None
    output_sizes: tuple[tuple[int, ...], ...] | None
    output_dtypes: tuple[str, ...] | None
    source: str = "fr"
    parts: tuple[Signature, ...] = ()
    root: int | None = None
    exchange: Exchange | None = None
    objects: int | None = None
    fr_op: str | None = None

    def describe(self) -> str:
        """``all_reduce [[4]] Float``, ``broadcast [[4]] Float root 2`` for messages; outputs where they differ
        in size from the inputs (``all_gather [[4]] Float -> [[8]]``)."""
        if self.parts:  # a coalesced group: its members, which is where sizes differ
            shown = ", ".join(p.describe() for p in self.parts[:4])
            return f"{self.op} of {len(self.parts)} ({shown}{', ...' if len(self.parts) > 4 else ''})"
        sizes = [list(s) for s in self.input_sizes] if self.input_sizes is not None else "?"
        dtypes = ",".join(self.input_dtypes) if self.input_dtypes else ""
        out = f"{self.op} {sizes} {dtypes}".rstrip()
        if self.output_sizes is not None and self.input_sizes is not None and self.output_sizes != self.input_sizes:
            out += f" -> {[list(s) for s in self.output_sizes]}"
        if self.root is not None:
            out += f" root {self.root}"
        if self.objects is not None:
            out += f" {self.objects} object{'s' if self.objects != 1 else ''}"
        if self.exchange is not None:
            out += f" sends {_counts(self.exchange.send)} expects {_counts(self.exchange.recv)}"
        return out


def _counts(counts: tuple[int, ...] | None) -> str:
    return "?" if counts is None else str(list(counts))


PeerBytes = tuple[int, ...] | None


def peer_elements(sig: Signature, n: int) -> Exchange | None:
    """What one rank's all-to-all on an ``n``-rank group sends to and expects from each member, in elements and
    group-rank order: the recorder's split sizes (``exchange``), else Flight Recorder's one tensor per member
    (``all_to_all``'s lists; a single tensor says nothing of how it is split, unless the group is one rank).
    None where neither says. The one reading of per-peer sizes: diagnose's pairs, the report's matrix and the
    trace's slices all take it from here.

    >>> peer_elements(Signature("all_to_all", ((2,), (3, 2)), ("Half", "Half"), ((2,), (1,)), ("Half", "Half")), 2)
    Exchange(send=(2, 6), recv=(2, 1), send_given=True, recv_given=True)
    >>> peer_elements(Signature("all_to_all", ((8,),), ("Float",), ((8,),), ("Float",)), 2) is None
    True
    """
    if sig.parts or op_family(sig.op) != "all_to_all":
        return None
    if sig.exchange is not None:
        return sig.exchange
    if sig.input_sizes is None or len(sig.input_sizes) != n:
        return None
    outputs = sig.output_sizes
    return Exchange(tuple(math.prod(s) for s in sig.input_sizes),
                    tuple(math.prod(s) for s in outputs) if outputs is not None and len(outputs) == n else None)


def peer_bytes(sig: Signature, n: int) -> tuple[PeerBytes, PeerBytes]:
    """(sent, expected): ``peer_elements`` in bytes; None where the sizes or dtypes are not known.

    >>> s = Signature("all_to_all_single", ((5,),), ("Float",), None, None, "log", exchange=Exchange((3, 2), (3, 4)))
    >>> peer_bytes(s, 2)
    ((12, 8), (12, 16))
    """
    x = peer_elements(sig, n)
    if x is None:
        return None, None
    return (_elements_to_bytes(x.send, sig.input_dtypes, n),
            _elements_to_bytes(x.recv, sig.output_dtypes or sig.input_dtypes, n))


def _elements_to_bytes(counts: tuple[int, ...] | None, dtypes: tuple[str, ...] | None, n: int) -> PeerBytes:
    """Element counts, one per member, in bytes: one dtype (a tensor split by rows) or one per member."""
    if counts is None or len(counts) != n or not dtypes or len(dtypes) not in (1, n):
        return None
    sizes = [DTYPE_BYTES.get(d) for d in (dtypes * n if len(dtypes) == 1 else dtypes)]
    return None if None in sizes else tuple(k * cast(int, b) for k, b in zip(counts, sizes))


@dataclass(frozen=True, slots=True)
class CollectivePart:
    """One rank's share of a collective (built on demand by ``Collective.part``)."""

    rank: int
    signature: Signature
    state: CallState
    t_arrive_ns: int | None
    t_start_ns: int | None
    t_end_ns: int | None
    call_site: Frame | None
    stack: Stack
    source: str  # "fr", "log" or "fr+log"


class CollectiveColumns(Protocol):
    """Where a ``Collective`` reads its per-rank values: one group's columns (``group_columns.GroupCollectives``)."""

    def values(self, name: str, index: int) -> tuple:
        """The per-rank tuple of field ``name`` (``signatures``, ``states``, ``arrive_ns``, ``start_ns``,
        ``end_ns``, ``stack_ids``, ``sources``, ``duration_ns``, ``gpu_begin_ns``) of the ``index``-th
        collective."""
        ...

    @property
    def on_gpu(self) -> bool:
        """The group runs on a GPU backend or some member's GPU time is known (see ``Collective.on_gpu``)."""
        ...

    def position(self, rank: int) -> int:
        """Where ``rank`` sits in the group's ranks (ValueError when it is no member)."""
        ...


_T = TypeVar("_T")


class _PerRank(Generic[_T]):
    """A ``Collective`` field read from the group's columns when first asked, then kept in the view's own
    ``__dict__``, which later reads find first (as ``functools.cached_property`` does): a plain attribute read."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, obj: Collective, owner: type | None = None) -> _T:
        value = obj.__dict__[self.name] = obj._columns.values(self.name, obj._index)
        return value  # type: ignore[return-value]


def known_values(values: tuple[int | None, ...]) -> Sequence[int]:
    """The values that are not None; the tuple itself where none is (tested at C speed: ranks x collectives).
    ``all()`` tests truth, faster than ``None in``: a value of 0 only sends it the slow way.

    >>> known_values((5, None, 0)), known_values((5, 9))
    ([5, 0], (5, 9))
    """
    return cast(tuple[int, ...], values) if all(values) else [v for v in values if v is not None]


def _spread(times: tuple[int | None, ...]) -> int | None:
    """The last known time minus the first; None with fewer than two.

    >>> _spread((5, None, 9, 7)), _spread((5, 9)), _spread((None, 3))
    (4, 4, None)
    """
    known = known_values(times)
    return max(known) - min(known) if len(known) > 1 else None


def _latest(times: tuple[int | None, ...], ranks: tuple[int, ...]) -> int | None:
    """The rank with the latest known time; None without times, or where several ranks share it (nothing
    singles one out).

    >>> _latest((5, None, 9, 7), (0, 1, 2, 3)), _latest((5, None, 9, 9), (0, 1, 2, 3)), _latest((None,), (0,))
    (2, None, None)
    """
    known = times if None not in times else tuple(t for t in times if t is not None)
    if not known:
        return None
    t = max(cast(tuple[int, ...], known))
    if times.count(t) != 1:
        return None
    return ranks[times.index(t)]


class Collective:
    """One logical collective: (process group, sequence number) across the group's ranks.

    Every per-rank tuple is aligned with ``ranks`` (the group's global ranks); ``None`` where that rank
    has no record of this collective. Times are aligned to rank 0's clock. ``stack_ids`` index ``stacks``;
    they are None for Flight Recorder records of a job loaded without stacks: ``Job.stack_of`` reads those.
    ``duration_ns``: each rank's GPU time of it, () when no rank has one: its communication kernels in a
    profiler trace (first begin to last end), else Flight Recorder's duration_ms (NCCL with
    TORCH_NCCL_ENABLE_TIMING). ``gpu_begin_ns``: each rank's GPU begin of it, where a profiler trace shows its
    kernels (its GPU work is then [gpu_begin, gpu_begin + duration]); () when no rank has one.

    A view: the values live in the group's columns (one per rank and field, see ``group_columns.GroupCollectives``)
    and each per-rank tuple is built when first read, then kept as long as the view is. A job of 16,384
    ranks and 2,000 collectives holds 33 million values, not 33 million objects.
    """


    def __init__(self, group: ProcessGroup, seq: int, ranks: tuple[int, ...], columns: CollectiveColumns,
                 index: int, stacks: tuple[Stack, ...] = ()) -> None:
        self.group = group
        self.seq = seq
        self.ranks = ranks
        self.stacks = stacks
        self._columns = columns
        self._index = index

    signatures = _PerRank[tuple["Signature | None", ...]]("signatures")
    states = _PerRank[tuple["CallState | None", ...]]("states")
    arrive_ns = _PerRank[tuple["int | None", ...]]("arrive_ns")
    start_ns = _PerRank[tuple["int | None", ...]]("start_ns")
    end_ns = _PerRank[tuple["int | None", ...]]("end_ns")
    stack_ids = _PerRank[tuple["int | None", ...]]("stack_ids")
    sources = _PerRank[tuple["str | None", ...]]("sources")
    duration_ns = _PerRank[tuple["int | None", ...]]("duration_ns")
    gpu_begin_ns = _PerRank[tuple["int | None", ...]]("gpu_begin_ns")

    @property
    def on_gpu(self) -> bool:
        """It runs on a GPU backend (NCCL ...) or some rank's GPU time is known: its time is then its GPU work
        only, never a CPU call or Flight Recorder's discovery times (the GPU queue and the watchdog's polling)."""
        return self._columns.on_gpu

    def __repr__(self) -> str:
        return f"Collective({self.group.uid!r}, seq={self.seq}, op={self.op!r})"

    @property
    def op(self) -> str:
        """The op most ranks issued."""
        # Not set(signatures): hashing a signature, and comparing one with None, are Python calls: a
        # millisecond a collective at 2,048 ranks.
        counts = Counter(sig.op for sig in self.signatures if sig is not None)
        return max(counts, key=counts.__getitem__) if counts else "?"

    @property
    def joined_ranks(self) -> tuple[int, ...]:
        sigs = self.signatures  # a signature is always true: all() and compress() test None in C, where
        if all(sigs):  # `None in sigs` would call Signature.__eq__ once a rank
            return self.ranks
        return tuple(compress(self.ranks, sigs))

    def index_of(self, rank: int) -> int:
        """Where ``rank`` sits in ``ranks`` (ValueError when it is no member): a dict lookup, not a scan."""
        return self._columns.position(rank)

    def state_of(self, rank: int) -> str | None:
        return self.states[self._columns.position(rank)]

    def arrival_of(self, rank: int) -> int | None:
        return self.arrive_ns[self._columns.position(rank)]

    def end_of(self, rank: int) -> int | None:
        return self.end_ns[self._columns.position(rank)]

    @property
    def last_arrival_rank(self) -> int | None:
        """The rank that arrived last (the others waited for it), or None without arrival times."""
        return _latest(self.arrive_ns, self.ranks)

    @property
    def arrival_skew_ns(self) -> int | None:
        return _spread(self.arrive_ns)

    @property
    def ready_ns(self) -> tuple[int | None, ...]:
        """When each rank was ready to communicate: its GPU begin where every rank that joined has one (the
        GPU runs behind the CPU, so the CPU's arrival order says nothing of who the others' kernels waited
        for), else its arrival."""
        begins = self.gpu_begin_ns
        if begins and None not in compress(begins, self.signatures):  # in C: a signature is always true
            return begins
        return self.arrive_ns

    @property
    def ready_skew_ns(self) -> int | None:
        """The last ready rank's ``ready_ns`` minus the first's: the arrival skew, on the GPU where known."""
        return _spread(self.ready_ns)

    @property
    def last_ready_rank(self) -> int | None:
        """The rank ready last (see ``ready_ns``), or None without times."""
        return _latest(self.ready_ns, self.ranks)

    def work_of(self, i: int) -> tuple[int | None, int | None]:
        """(begin, end) of rank ``ranks[i]``'s part (``work_span``)."""
        return work_span(self.arrive_ns[i], self.end_ns[i], self.gpu_begin_ns[i] if self.gpu_begin_ns else None,
                         self.duration_ns[i] if self.duration_ns else None, self.on_gpu)

    @property
    def work_ns(self) -> tuple[tuple[int | None, ...], tuple[int | None, ...]]:
        """Every rank's ``work_of``: (begins, ends), aligned with ``ranks``; arrivals and ends as they are where
        no trace shows GPU work."""
        if not self.gpu_begin_ns and not self.on_gpu:
            return self.arrive_ns, self.end_ns
        begins, ends = zip(*map(self.work_of, range(len(self.ranks))))
        return begins, ends

    def timing(self) -> tuple[int, int] | None:
        """(duration, transfer time) in ns; None when no rank's time is known.

        On a GPU (``on_gpu``) only GPU times count: the duration runs from the first rank's kernel begin to the
        last rank's kernel end (without begins: the longest rank's GPU time, which also runs from its begin
        to the common end), the transfer time is the shortest rank's GPU time (the others' kernels also
        waited for the late ranks). Otherwise from the first arrival to the last completion, and the transfer
        time is the fastest rank's arrival to completion.

        >>> g = ProcessGroup("0[0,1]", "0", "default_pg", (0, 1))
        >>> s = Signature("all_reduce", ((4,),), ("Float",), None, None)
        >>> from comm2perfetto.group_columns import GroupCollectives, Rows
        >>> c = GroupCollectives(g, [Rows([1], [s], ["completed"], [a], [None], [e], [None], ["kineto"], durations=[d],
        ...                               gpu_begins=[b]) for a, e, d, b in ((0, 400, 120, 300), (50, 420, 40, 380))],
        ...                      ())[0]
        >>> c.timing(), c.ready_ns, c.work_of(1), c.queue_ns()
        ((120, 40), (300, 380), (380, 420), [300, 330])
        """
        gpu = known_values(self.duration_ns)
        if gpu:
            spans = [(b, b + d) for b, d in zip(self.gpu_begin_ns, self.duration_ns)
                     if b is not None and d is not None] if self.gpu_begin_ns else []
            if len(spans) == len(gpu):
                return max(e for _, e in spans) - min(b for b, _ in spans), min(gpu)
            return max(gpu), min(gpu)
        return None if self.on_gpu else span_timing(self.arrive_ns, self.end_ns)

    def queue_ns(self) -> list[int]:
        """Each rank's queue delay where a trace shows it: from its CPU enqueue (arrival) to its first kernel's
        begin. Nothing on the GPU's time counts it: it is the work queued before, not the collective's. A kernel
        that began at its arrival is one no CPU op enqueued in the trace (its begin stands in for the arrival): no
        queue delay is known there, rather than 0 (a launch takes microseconds)."""
        if not self.gpu_begin_ns:
            return []
        return [b - a for a, b in zip(self.arrive_ns, self.gpu_begin_ns) if a is not None and b is not None and b > a]

    @property
    def completed_everywhere(self) -> bool:
        return self.states.count(CallState.COMPLETED) == len(self.states)

    def part(self, rank: int) -> CollectivePart | None:
        i = self._columns.position(rank)
        sig = self.signatures[i]
        if sig is None:
            return None
        sid = self.stack_ids[i]
        stack = self.stacks[sid] if sid is not None and sid < len(self.stacks) else ()
        return CollectivePart(
            rank=rank, signature=sig, state=self.states[i] or CallState.UNKNOWN, t_arrive_ns=self.arrive_ns[i],
            t_start_ns=self.start_ns[i], t_end_ns=self.end_ns[i], call_site=call_site(stack), stack=stack,
            source=self.sources[i] or "",
        )


class GroupView(Protocol):
    """One process group's collectives in seq order, as ``Job.collectives`` holds them: views over the members'
    columns (``group_columns.GroupCollectives``, what the loader builds), indexed and iterated as a sequence of
    ``Collective``, that also read one member's values across every collective, or in one, at C speed without
    gathering the other members'."""

    @property
    def group(self) -> ProcessGroup: ...

    @property
    def ranks(self) -> tuple[int, ...]:
        """The group's global ranks: every view's per-rank tuples are aligned with them."""
        ...

    @property
    def seqs(self) -> Sequence[int]:
        """The seq of each collective, ascending."""
        ...

    @property
    def on_gpu(self) -> bool:
        """The group's collectives run on a GPU (``Collective.on_gpu``)."""
        ...

    @property
    def gpu_timed(self) -> bool:
        """Some rank has a GPU time of some of the group's collectives (``Collective.duration_ns``): GPU timing
        worked for the group, so an untimed one was not yet timed (see ``report.untimed``)."""
        ...

    def __len__(self) -> int: ...

    @overload
    def __getitem__(self, index: int) -> Collective: ...

    @overload
    def __getitem__(self, index: slice) -> list[Collective]: ...

    def __iter__(self) -> Iterator[Collective]: ...

    def find(self, seq: int) -> Collective | None:
        """The collective with this seq, or None."""
        ...

    def member_column(self, name: str, rank: int) -> list:
        """``rank``'s value of field ``name`` (``Collective``'s per-rank fields: ``signatures``, ``arrive_ns`` ...)
        in every collective, in order; None where it has no record."""
        ...

    def value(self, name: str, rank: int, index: int) -> Any:
        """``rank``'s value of field ``name`` in the ``index``-th collective (None: no record)."""
        ...

    def settled_prefix(self) -> int:
        """How many leading collectives every member finished with one signature (0 where that cannot be told
        from the columns alone): a search for the first problem may skip them."""
        ...


def span_timing(arrive: Iterable[int | None], end: Iterable[int | None]) -> tuple[int, int] | None:
    """(duration, transfer time) from per-rank arrivals and completions on the CPU: from the first arrival to
    the last completion, and the fastest rank's arrival to completion; None when no rank has both.

    >>> span_timing((0, 30, None), (100, 110, 90))
    (110, 80)
    """
    pairs = [(a, e) for a, e in zip(arrive, end) if a is not None and e is not None and e >= a]
    if not pairs:
        return None
    return max(e for _, e in pairs) - min(a for a, _ in pairs), min(e - a for a, e in pairs)


@dataclass(frozen=True, slots=True)
class P2POp:
    """One send or recv on one rank. ``peer`` is a global rank."""

    rank: int
    group_uid: str
    kind: str  # "send" or "recv"
    peer: int
    index: int  # position among this rank's ops of this kind to this peer in this group
    signature: Signature
    state: CallState
    t_arrive_ns: int | None
    t_end_ns: int | None
    stack_id: int | None
    source: str
    seq: int | None = None  # Flight Recorder's p2p_seq_id, where it recorded the op
    gpu_ns: tuple[int, int] | None = None  # its kernel's (begin, end), where a profiler trace shows it


@dataclass(frozen=True, slots=True)
class P2PTransfer:
    """A send and the recv it pairs with (the i-th send from A to B pairs with B's i-th recv from A)."""

    group_uid: str
    src: int
    dst: int
    index: int
    send: P2POp | None
    recv: P2POp | None

    @property
    def matched(self) -> bool:
        return self.send is not None and self.recv is not None


class ClockMethod(StrEnum):
    """How a rank's clock was put on rank 0's (``ClockAlignment.method``)."""

    MEASURED = "measured"  # the recorder's start-up measurement
    REFINED = "refined"  # corrected from collectives that completed on every rank
    ASSUMED = "assumed"  # no information: offset 0
    NONE = "none"  # not aligned (merge --no-align): each rank on its own clock


class ClockFit(StrEnum):
    """What was fitted to a refined rank's clock (``ClockAlignment.fit``)."""

    DRIFT = "offset and drift"  # an offset and a rate: the rank's clock runs fast or slow against the reference
    OFFSET = "offset"  # one offset: the ends resolve no drift beyond their own scatter
    OFFSET_ONLY = "offset only"  # one offset: too few ends, or too close in time, to fit a rate


@dataclass(frozen=True, slots=True)
class RankClock:
    """How one rank's local times map onto the job's clock: ``t_job = t + offset_ns + round(rate * (t -
    anchor_ns))``. ``rate`` is how much the rank's clock loses per nanosecond against the reference's (-2e-4 for
    a clock 200 ppm fast); 0 for one offset. Every time the ``Job`` holds is moved through one of these, once.

    >>> RankClock(offset_ns=-1_000, rate=-2e-4, anchor_ns=10**9)(10**9 + 10**6)
    1000998800
    """

    offset_ns: int = 0
    rate: float = 0.0
    anchor_ns: int = 0

    def __bool__(self) -> bool:
        """False when it moves nothing (rank 0, a rank assumed on time)."""
        return bool(self.offset_ns or self.rate)

    def __call__(self, t: int) -> int:
        if self.rate:
            return t + self.offset_ns + round(self.rate * (t - self.anchor_ns))
        return t + self.offset_ns

    def times(self, values: Iterable[int | None], missing: int | None = None) -> list:
        """A column of local times on the job's clock; ``None`` (or ``missing``, a column's no-value code) kept."""
        off, rate, anchor = self.offset_ns, self.rate, self.anchor_ns
        if rate:
            return [t + off + round(rate * (t - anchor)) if t is not None and t != missing else t for t in values]
        if missing is None:
            return [t + off if t is not None else None for t in values]
        return [t + off if t != missing else t for t in cast(Iterable[int], values)]  # a coded column: no None


@dataclass(frozen=True, slots=True)
class ClockAlignment:
    """Per-rank clocks put on rank 0's: ``t_rank0 = t_local + offset_ns[rank] + rate[rank] * (t_local -
    anchor_ns[rank])`` (``of(rank)``: the ``RankClock`` that does it); ``rate`` only where a drift was fitted.

    ``method[rank]``: ``measured`` (the recorder's start-up measurement), ``refined`` (corrected from
    collectives that completed on every rank, whose ends are near-simultaneous), ``assumed`` (no
    information: 0). A refined rank has its ``fit`` (an offset, or an offset and a drift, ``ClockFit``) and
    ``residual_ns``, the median distance of its collective ends from the reference's after alignment;
    ``residual_skew_ns`` is the largest of these: what is left of the skew; None when unmeasurable.
    ``uncalibrated``: the ranks whose ends stray from their fit by more than the ends resolve (``align``), with
    how far a tenth of them stray: their times are not comparable with other ranks', and no view takes their
    lateness as evidence.
    """

    offset_ns: Mapping[int, int] = field(default_factory=_empty)
    method: Mapping[int, ClockMethod] = field(default_factory=_empty)
    uncertainty_ns: Mapping[int, int] = field(default_factory=_empty)
    residual_skew_ns: int | None = None
    samples: int = 0
    rate: Mapping[int, float] = field(default_factory=_empty)
    anchor_ns: Mapping[int, int] = field(default_factory=_empty)
    fit: Mapping[int, ClockFit] = field(default_factory=_empty)
    residual_ns: Mapping[int, int] = field(default_factory=_empty)
    uncalibrated: Mapping[int, int] = field(default_factory=_empty)

    def of(self, rank: int) -> RankClock:
        """The map of ``rank``'s local times onto the job's clock."""
        return RankClock(self.offset_ns.get(rank, 0), self.rate.get(rank, 0.0), self.anchor_ns.get(rank, 0))

    def drift_ppm(self, rank: int) -> float | None:
        """How many parts per million ``rank``'s clock runs fast (+) or slow; None where no drift was fitted."""
        rate = self.rate.get(rank)
        return None if rate is None else -rate * 1e6

    def drifts_ppm(self) -> dict[int, float]:
        """``drift_ppm`` of every rank whose drift was fitted."""
        return {rank: -rate * 1e6 for rank, rate in sorted(self.rate.items())}


@dataclass(frozen=True, slots=True)
class Skipped:
    """A file that was not used, and why."""

    path: str
    reason: str


# torch itself, and our own recorder's wrappers around torch.distributed.
_LIBRARY_MARKERS = ("/torch/", "\\torch\\", "/comm2perfetto/record/", "\\comm2perfetto\\record\\")


def is_torch_frame(frame: Frame) -> bool:
    """True for frames inside torch (distributed_c10d.py, c10d_logger.py...) or the recorder's wrappers."""
    f = frame.file
    return f.startswith("torch/") or any(m in f for m in _LIBRARY_MARKERS)


def call_site(stack: Stack) -> Frame | None:
    """The first frame outside torch: where user code made the call."""
    for frame in stack:
        if not is_torch_frame(frame):
            return frame
    return stack[0] if stack else None
