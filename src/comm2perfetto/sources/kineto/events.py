"""What a read Kineto trace is made of: the events kept (``KinetoEvent``, ``KinetoCommEvent``), one rank's trace
(``KinetoTrace``) and its begin/end spans (``KinetoSpans``). Frozen, times in integer nanoseconds. How they are
read from the raw events: ``reader`` (the file), ``parse`` and ``spans`` (the two parsers).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from comm2perfetto.model import RankClock
from comm2perfetto.sources.kineto.classify import GPU_WORK_KINDS, normalise_kind

__all__ = [
    "NOT_DETAIL", "NO_ARGS", "SHOWN_ARGS", "SHOWN_ARG_SET", "ArgValue", "Detail", "KinetoCommEvent", "KinetoEvent",
    "KinetoSpans", "KinetoTrace", "Span",
]

# The args worth showing next to an event; the rest (occupancy, registers, Ev Idx ...) is dropped. Most
# events have none of them, so most keep no args at all: the ids that every event has are fields of their own,
# and a GPU event's device and stream are in its lane.
SHOWN_ARGS = (
    "Collective name", "Seq", "Process Group Name", "Process Group Description", "In msg nelems",
    "Out msg nelems", "Group size", "dtype", "bytes",
)
SHOWN_ARG_SET = frozenset(SHOWN_ARGS)

ArgValue = str | int | float | bool
NO_ARGS: Mapping[str, ArgValue] = MappingProxyType({})

# The rest of an event's args, as Perfetto shows them for the raw trace (a kernel's grid, block, registers,
# shared memory, occupancy; a CPU op's Input Dims, Input type, Concrete Inputs, Sequence number; a runtime
# call's cbid): ((name, value), ...), lists and objects as their JSON text, one copy per distinct tuple (the
# same op launches the same kernel with the same args every step). Left out: what is kept elsewhere
# (``SHOWN_ARGS``, ``External id`` and ``correlation`` as fields, a GPU event's device and stream in its lane)
# and the profiler's own per-event indices, whose value is only ever their place in the file (Ev Idx, Record
# function id, Python id, Python parent id): those would make every tuple different.
Detail = tuple[tuple[str, ArgValue], ...]
NOT_DETAIL = SHOWN_ARG_SET | {"External id", "correlation", "device", "stream", "Ev Idx", "Record function id",
                              "Python id", "Python parent id"}


@dataclass(slots=True)
class KinetoCommEvent:
    """A communication event on any thread or stream (see ``classify.COMM_NAME``), with what its args say about
    the collective (recent torch writes them on ``record_param_comms`` and on the NCCL kernel; older traces have
    none): ``"Collective name": "allreduce"``, ``"Seq": 5``, ``"Process Group Name": "0"``,
    ``"Process Group Description": "default_pg"``, ``"Process Group Ranks": "[0, 1]"``, ``"In msg nelems"``,
    ``"Out msg nelems"``, ``"dtype": "Float"``. ``external_id`` (Kineto's ``External id``) ties a kernel to the
    CPU op that launched it."""

    name: str
    t_begin_ns: int
    duration_ns: int
    pid: Any
    tid: Any
    category: str
    collective: str | None
    seq: int | None
    pg_name: str | None
    pg_desc: str | None = None
    pg_ranks: str | None = None
    in_nelems: int | None = None
    out_nelems: int | None = None
    dtype: str | None = None
    external_id: int | None = None

    @property
    def t_end_ns(self) -> int:
        return self.t_begin_ns + self.duration_ns

    @property
    def on_gpu(self) -> bool:
        return normalise_kind(self.category) in GPU_WORK_KINDS


@dataclass(slots=True)
class KinetoEvent:
    """One complete event of a training thread or a GPU stream.

    From ``{"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "pid": 0, "tid": 20,
    "ts": 20.0, "dur": 50.0, "args": {"device": 0, "stream": 20, "correlation": 77, "External id": 9,
    "Seq": 5, "grid": [2, 1, 1]}}`` with ``baseTimeNanoseconds`` B: ``KinetoEvent(
    "ncclDevKernel_AllReduce_Sum_f32_RING_LL", B + 20_000, 50_000, "gpu 0 stream 20", "kernel", "comm",
    {"Seq": 5}, external_id=9, correlation=77)``.

    ``lane`` is a display key: ``"thread <tid>"`` for CPU events, ``"gpu <device> stream <stream>"`` for GPU
    ones (``KinetoTrace.lane_names`` has a label for each). ``klass`` is None for CPU events. ``args`` holds
    only the ``SHOWN_ARGS`` present; treat it as read-only. ``external_id`` links a CPU op to the kernels it
    launched (Kineto's ``External id``), ``correlation`` a ``cudaLaunchKernel`` to its kernel. ``detail``: the
    other args (see ``Detail``): ``(("grid", "[2, 1, 1]"),)`` above.
    """

    name: str
    t_begin_ns: int
    duration_ns: int
    lane: str
    kind: str
    klass: str | None = None
    args: Mapping[str, ArgValue] = field(default_factory=lambda: NO_ARGS)
    external_id: int | None = None
    correlation: int | None = None
    detail: Detail = ()

    @property
    def t_end_ns(self) -> int:
        return self.t_begin_ns + self.duration_ns


@dataclass(slots=True)
class KinetoTrace:
    """One rank's profiler trace. ``cpu_ops``, ``gpu_events`` and ``gpu_annotations`` are sorted by lane (CPU
    lanes by thread id, then GPU lanes by device and stream), then by begin time, the longer event first at
    equal begins so that an enclosing op comes before what it encloses."""

    path: Path
    rank: int | None
    world_size: int | None
    backend: str | None
    base_time_ns: int
    pg_config: Any
    comm_events: tuple[KinetoCommEvent, ...]
    event_count: int
    cpu_ops: tuple[KinetoEvent, ...] = ()
    gpu_events: tuple[KinetoEvent, ...] = ()
    gpu_annotations: tuple[KinetoEvent, ...] = ()
    steps: tuple[tuple[int, int, int], ...] = ()
    gpu_steps: tuple[tuple[int, int, int], ...] = ()  # the steps on the GPU's time: see steps.gpu_step_spans
    pid: int | None = None  # the profiled process (the pid of most CPU events)
    lane_names: Mapping[str, str] = field(default_factory=dict)  # lane -> label, e.g. "thread 5370 (python)"
    skipped_threads: tuple[str, ...] = ()  # CPU lanes left out of cpu_ops: see is_training_thread

    def shift(self, clock: RankClock) -> None:
        """Move every time the trace holds through ``clock``, in place: from the rank's own clock onto the job's
        (``match.build_job`` does, once, after aligning the clocks). In place because a trace holds a million
        events: a moved copy of each would cost merge a tenth of its time. Durations are kept: a drift of
        200 ppm changes a 10 ms kernel's by 2 us."""
        if not clock:
            return
        kinds: list[Sequence[KinetoEvent | KinetoCommEvent]] = [self.comm_events, self.cpu_ops, self.gpu_events,
                                                                self.gpu_annotations]
        for events in kinds:
            for ev, t in zip(events, clock.times([ev.t_begin_ns for ev in events])):
                ev.t_begin_ns = t
        self.base_time_ns = clock(self.base_time_ns)
        self.steps = tuple((n, clock(begin), clock(end)) for n, begin, end in self.steps)
        self.gpu_steps = tuple((n, clock(begin), clock(end)) for n, begin, end in self.gpu_steps)


Span = tuple[int, int]


@dataclass(frozen=True, slots=True)
class KinetoSpans:
    """What the time accounting of ``report`` needs from a trace: begin/end pairs, no events.

    ``gpu`` maps a class (``compute``, ``comm``, ``memory``: see ``classify_gpu``) to the spans of that class's
    kernels, memcpys and memsets; ``cpu_compute`` holds the CPU ops and user annotations of training threads that
    are neither communication nor ``ProfilerStep#n``; ``comm`` every communication event (``classify.COMM_NAME``)
    on any thread or stream. Reading spans is 3x faster than ``read_kineto``, which builds an object per event.
    ``cpu_read``: False when the trace has compute or communication kernels and the CPU side was skipped
    (``cpu_compute`` and ``comm`` empty): report's figures then come from the kernels alone.
    """

    path: Path
    gpu: Mapping[str, list[Span]]
    cpu_compute: list[Span]
    comm: list[Span]
    steps: tuple[tuple[int, int, int], ...]
    event_count: int
    cpu_read: bool = True
    gpu_steps: tuple[tuple[int, int, int], ...] = ()  # see steps.gpu_step_spans
    collectives: KinetoTrace | None = None  # the trace's comm events only: see read_kineto_spans
