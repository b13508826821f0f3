"""Compute/communication breakdown of a rank, a step or the whole job.

For one rank over a window (its whole activity, or one step):

- ``compute`` = |union(compute)|, ``comm`` = |union(comm)|;
- ``overlapped_comm`` = |union(comm) ∩ union(compute)|: communication hidden behind compute;
- ``exposed_comm`` = ``comm - overlapped_comm``: communication nothing else hides;
- ``idle`` = ``span - |union(compute ∪ comm ∪ memory)|``;
- ``comm_to_compute`` = ``comm / compute``; ``overlap_pct`` = ``100 * overlapped_comm / comm``, which on GPU
  kernels is Holistic Trace Analysis's comm/comp overlap (``get_comm_comp_overlap``).

The job's times are the mean over ranks; its ratios come from the totals, so a rank with more communication
weighs more, as it does for the job's throughput.

A figure not measured in a window is None, never 0: compute outside the profiled steps when the profiler is its
only source, communication in a window where a collective has no time (gloo's outside the profiled steps), and
every figure made from them (overlapped, exposed, idle, the ratios). A sum or mean over windows or ranks is
known only when every part is.

>>> from comm2perfetto.report.activity import RankActivity
>>> a = RankActivity(0, "gpu", (), compute=[(0, 60)], comm=[(40, 100)], memory=[], steps=())
>>> b = breakdown(a)
>>> b.overlapped_ns, b.exposed_ns, round(b.overlap_pct, 1)
(20, 40, 33.3)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from comm2perfetto.intervals import NS, Span
from comm2perfetto.report.activity import RankActivity
from comm2perfetto.report_doc import Figures, JobFigures


@dataclass(frozen=True)
class Breakdown:
    span_ns: int
    compute_ns: int
    comm_ns: int
    overlapped_ns: int
    busy_ns: int  # compute, comm or memory copies
    compute_known: bool = True  # False: compute was not measured in this window (see the module docstring)
    comm_known: bool = True

    @property
    def exposed_ns(self) -> int:
        return self.comm_ns - self.overlapped_ns

    @property
    def idle_ns(self) -> int:
        return max(self.span_ns - self.busy_ns, 0)

    @property
    def comm_to_compute(self) -> float | None:
        return self.comm_ns / self.compute_ns if self.compute_ns and self.known else None

    @property
    def overlap_pct(self) -> float | None:
        return 100.0 * self.overlapped_ns / self.comm_ns if self.comm_ns and self.known else None

    @property
    def known(self) -> bool:
        return self.compute_known and self.comm_known

    def as_dict(self) -> Figures:
        """The report's keys, times in seconds; None for what was not measured."""
        both = self.known
        return {
            "span_s": self.span_ns * NS, "compute_s": self.compute_ns * NS if self.compute_known else None,
            "comm_s": self.comm_ns * NS if self.comm_known else None,
            "overlapped_comm_s": self.overlapped_ns * NS if both else None,
            "exposed_comm_s": self.exposed_ns * NS if both else None,
            "idle_s": self.idle_ns * NS if both else None, "comm_to_compute": self.comm_to_compute,
            "overlap_pct": self.overlap_pct,
        }


def breakdown(activity: RankActivity, window: Span | None = None) -> Breakdown:
    """The breakdown of one rank, over ``window`` (default: from its first to its last activity)."""
    compute, comm, overlapped, busy = activity.measured
    if window is None:
        whole = activity.span
        return Breakdown(whole[1] - whole[0] if whole else 0, compute.total, comm.total, overlapped.total,
                         busy.total)
    begin, end = window
    return Breakdown(max(end - begin, 0), compute.within(begin, end), comm.within(begin, end),
                     overlapped.within(begin, end), busy.within(begin, end), activity.knows_compute(window),
                     activity.knows_comm(window))


def total(parts: Iterable[Breakdown]) -> Breakdown:
    """Every figure added up: several windows of one rank, or every rank of the job; known where every part
    is."""
    sums = [0, 0, 0, 0, 0]
    compute_known = comm_known = True
    for b in parts:
        for i, value in enumerate((b.span_ns, b.compute_ns, b.comm_ns, b.overlapped_ns, b.busy_ns)):
            sums[i] += value
        compute_known &= b.compute_known
        comm_known &= b.comm_known
    span, compute, comm, overlapped, busy = sums
    return Breakdown(span, compute, comm, overlapped, busy, compute_known, comm_known)


def job_breakdown(parts: Sequence[Breakdown]) -> JobFigures:
    """The job's row: mean times over ranks, ratios from the totals, and how many ranks it averages."""
    n = len(parts)
    summed = total(parts)
    whole = summed.as_dict()

    def mean(seconds: float | None) -> float | None:
        return seconds / n if n and seconds is not None else seconds

    return {
        "span_s": whole["span_s"] / n if n else whole["span_s"], "compute_s": mean(whole["compute_s"]),
        "comm_s": mean(whole["comm_s"]), "overlapped_comm_s": mean(whole["overlapped_comm_s"]),
        "exposed_comm_s": mean(whole["exposed_comm_s"]),
        # idle is clamped at 0 per rank (a step window can be shorter than what ran in it): mean the clamped values
        "idle_s": (sum(b.idle_ns for b in parts) * NS / n if n else 0.0) if summed.known else None,
        "comm_to_compute": whole["comm_to_compute"], "overlap_pct": whole["overlap_pct"], "ranks": n,
    }
