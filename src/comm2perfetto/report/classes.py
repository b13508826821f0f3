"""One classification of every rank's time, computed once (``report.activity``) and drawn by every view: the
report's figures, ``merge --preview``'s picture, ``report --plot``'s bars and the trace's tracks.

Each instant of a rank's time is one of:

- ``compute``, ``comm``, ``memory``: inside the unions of ``RankActivity`` (``report.activity``): on the
  ``gpu`` basis its kernels, memcpys and memsets; on the ``cpu`` basis its ranges and profiler CPU ops
  (compute) and its calls, Flight Recorder's and the profiler's communication events (comm). CPU ops that only
  wrap work are never compute: ``ProfilerStep#n``, Python frames, runtime calls, and every communication op
  (``record_param_comms``, ``c10d::allreduce_``, the backend's own ``gloo:all_reduce``, ``nccl:all_reduce``;
  ``sources.kineto.classify.cpu_class``). Compute and communication may overlap (overlapped communication);
- ``idle``: none of those, where the rank's data covers its time (``known``);
- ``waiting``: blocked in a collective the others never joined, from the stall to the end (diagnose's
  findings: ``trace.markers``; the trace draws it as a slice to the end, the preview hatched);
- ``no data``: outside what the rank's data covers: a rank that left none; before its first and after its
  last activity; where compute is known only inside profiled windows, the rest of the time that is not
  communication (unknown, not idle).

Collectives that have no duration (gloo's Flight Recorder times none of those issued from C++) are
communication at one point in time: ``instants``, which the preview draws at a minimum width.

>>> from comm2perfetto.report.activity import RankActivity
>>> a = RankActivity(0, "cpu", (), compute=[(0, 40)], comm=[(30, 50)], memory=[], steps=(),
...                  compute_windows=((0, 45),))
>>> c = rank_classes(a)
>>> c.known, c.no_data(0, 60), c.idle()
([(0, 50)], [(50, 60)], [])
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from comm2perfetto.intervals import Span, difference, intersection, union
from comm2perfetto.job import Job
from comm2perfetto.report.activity import FlightRecorderSpans, RankActivity, rank_activity
from comm2perfetto.sources.kineto.profile import RankProfile

__all__ = ["CLASSES", "COMM", "COMPUTE", "IDLE", "MEMORY", "NO_DATA", "WAITING", "RankClasses", "comm_instants",
           "job_classes", "rank_classes"]

COMPUTE, COMM, MEMORY, IDLE, WAITING, NO_DATA = "compute", "comm", "memory", "idle", "waiting", "no data"
CLASSES = (COMPUTE, COMM, MEMORY, IDLE, WAITING, NO_DATA)


@dataclass(frozen=True)
class RankClasses:
    """One rank's time by class (see the module's docstring), on the job's clock; unions of ``(begin, end)``."""

    rank: int
    compute: list[Span] = field(default_factory=list)
    comm: list[Span] = field(default_factory=list)
    memory: list[Span] = field(default_factory=list)
    known: list[Span] = field(default_factory=list)  # where the data covers the rank's time
    instants: list[int] = field(default_factory=list)  # collectives with no duration: communication at a point

    def idle(self) -> list[Span]:
        """Known time with neither compute, communication nor memory copies."""
        return difference(self.known, union(self.compute + self.comm + self.memory))

    def no_data(self, t0: int, t1: int) -> list[Span]:
        """The parts of ``[t0, t1)`` the rank's data does not cover."""
        return difference([(t0, t1)], self.known)


def rank_classes(activity: RankActivity, instants: Iterable[int] = ()) -> RankClasses:
    """The classes of one rank's activity; ``instants``: see ``comm_instants``."""
    span = activity.span
    known = [span] if span is not None else []
    if activity.compute_windows is not None:  # compute known inside the profiled windows only; comm everywhere
        known = union(intersection(known, union(activity.compute_windows)) + activity.comm + activity.memory)
    return RankClasses(activity.rank, activity.compute, activity.comm, activity.memory, known, sorted(instants))


def job_classes(job: Job | None, profiles: Mapping[int, RankProfile], ranks: Iterable[int]
                ) -> dict[int, RankClasses]:
    """``rank_classes`` of each of ``ranks``, from the same activity ``report`` measures (``rank_activity``);
    a rank without data has no data all along."""
    have = set(job.ranks if job is not None else ()) | set(profiles)
    fr_spans = FlightRecorderSpans(job) if job is not None else None  # read for the ranks drawn only
    points = comm_instants(job) if job is not None else {}
    out = {}
    for rank in ranks:
        if rank not in have:
            out[rank] = RankClasses(rank, instants=sorted(points.get(rank, ())))
            continue
        activity = rank_activity(job, rank, profiles.get(rank), fr_spans(rank) if fr_spans is not None else [])
        out[rank] = rank_classes(activity, points.get(rank, ()))
    return out


def comm_instants(job: Job) -> dict[int, list[int]]:
    """Per rank, the arrivals of its collectives and point-to-point ops that have no end time (gloo's Flight
    Recorder records none): communication known at one point in time only."""
    out: dict[int, list[int]] = defaultdict(list)
    for c in job.iter_collectives():
        for rank, sig, arrive, end in zip(c.ranks, c.signatures, c.arrive_ns, c.end_ns):
            if sig is not None and arrive is not None and end is None:
                out[rank].append(arrive)
    for transfers in job.p2p.values():
        for t in transfers:
            for op in (t.send, t.recv):
                if op is not None and op.t_arrive_ns is not None and op.t_end_ns is None:
                    out[op.rank].append(op.t_arrive_ns)
    return out
