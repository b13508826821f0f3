"""What each rank was doing, as unions of compute, communication and memory-copy time on the job's clock.

Two bases, chosen per rank:

- ``gpu``: the rank has profiler (Kineto) traces with GPU work. Kernels on every stream, classified by
  ``sources.kineto.classify.classify_gpu``: the communication kernels of ``sources/kineto/comm_kernels.py``'s
  table (NCCL, RCCL, symmetric memory, NVSHMEM ...) are communication, Memcpy/Memset are memory, everything
  else is compute.
  Steps follow the GPU: a kernel belongs to the ``ProfilerStep#n`` whose CPU span launched it
  (``sources.kineto.steps.gpu_step_spans``).
- ``cpu``: no GPU work known (gloo jobs, or no profiler). Compute is the recorded NVTX and
  ``comm2perfetto.range()`` ranges plus the profiler's CPU ops on training threads; communication is each
  recorded ``torch.distributed`` call from call to completion (or return), Flight Recorder's start-to-end of the
  collectives the patch layer did not see (DDP's), and the profiler's communication events (gloo's worker
  annotations). Time a thread spends inside a collective call is never compute, even inside an op or a
  user's range that wraps it: every communication op's interval (c10d ops, gloo and NCCL annotations,
  ``record_param_comms``, the recorder's calls from call to return) leaves the compute of its thread.

Profiler traces are read by the loader (``match.load_job`` with ``LoadOptions.profiles``), in worker processes,
into compact unions (``sources.kineto.profile.RankProfile``), not events.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from itertools import compress
from operator import add, itemgetter

from comm2perfetto.intervals import Measured, Span, difference, envelope, intersection, union
from comm2perfetto.job import Job
from comm2perfetto.model import GroupView
from comm2perfetto.report_doc import Basis
from comm2perfetto.sources.event_log import RankLog
from comm2perfetto.sources.kineto.profile import RankProfile

__all__ = ["FlightRecorderSpans", "RankActivity", "rank_activity"]

_END = itemgetter(1)


@dataclass(frozen=True)
class RankActivity:
    """A rank's compute, communication and memory unions on the job's (aligned) clock."""

    rank: int
    basis: Basis
    sources: tuple[str, ...]
    compute: list[Span]
    comm: list[Span]
    memory: list[Span]
    steps: tuple[tuple[int, int, int], ...]  # (step, begin, end)
    overlapped: list[Span] | None = None  # compute ∩ comm and compute ∪ comm ∪ memory, when known already
    busy: list[Span] | None = None
    # Where the profiler ran, when it is the only source of compute (no recorder ranges): outside these
    # windows the rank's compute is unknown, not zero.
    compute_windows: tuple[Span, ...] | None = None
    # Arrivals (sorted) of the rank's collectives that no source timed (gloo's outside the profiled steps):
    # a window holding one has its communication unknown, not just what was timed.
    untimed: tuple[int, ...] = ()

    def knows_compute(self, window: Span) -> bool:
        """Whether the rank's compute is known in ``window``: everywhere, or its middle is in a profiled window."""
        if self.compute_windows is None:
            return True
        middle = (window[0] + window[1]) // 2
        return any(b <= middle < e for b, e in self.compute_windows)

    def knows_comm(self, window: Span) -> bool:
        """Whether every collective the rank arrived at in ``window`` has a time."""
        i = bisect.bisect_left(self.untimed, window[0])
        return i == len(self.untimed) or self.untimed[i] >= window[1]

    def profiled_steps(self) -> list[int] | None:
        """The steps whose middle falls in a profiled window, when compute is known only there."""
        if self.compute_windows is None:
            return None
        return [n for n, b, e in self.steps if any(wb <= (b + e) // 2 < we for wb, we in self.compute_windows)]

    @property
    def span(self) -> Span | None:
        return envelope(self.compute, self.comm, self.memory)

    @cached_property
    def measured(self) -> tuple[Measured, Measured, Measured, Measured]:
        """compute, comm, comm ∩ compute and compute ∪ comm ∪ memory, each measurable in any window."""
        overlapped = self.overlapped if self.overlapped is not None else intersection(self.compute, self.comm)
        busy = self.busy
        if busy is None:
            parts = [u for u in (self.compute, self.comm, self.memory) if u]
            busy = parts[0] if len(parts) == 1 else union([s for u in parts for s in u])  # one is a union already
        measured = {id(u): Measured(u) for u in (self.compute, self.comm, overlapped, busy)}  # each union once
        return measured[id(self.compute)], measured[id(self.comm)], measured[id(overlapped)], measured[id(busy)]


def rank_activity(job: Job | None, rank: int, profile: RankProfile | None,
                  fr_spans: list[Span] | None = None, untimed: Iterable[int] = ()) -> RankActivity:
    """Combine what the recorder, Flight Recorder and the profiler know about one rank, all on the job's clock
    (``profile`` as ``Job.profiles`` holds it). ``fr_spans``: its Flight Recorder spans, from the caller's
    ``FlightRecorderSpans`` when it reads many ranks; else read here. ``untimed``: the arrivals of its
    collectives that nothing timed (``FlightRecorderSpans.untimed``), for a CPU basis's figures per step."""
    log = job.logs.get(rank) if job is not None else None
    profile = profile or RankProfile()
    if profile.gpu_compute or profile.gpu_comm:
        steps = profile.gpu_steps or _steps(log, profile, envelope(profile.gpu_compute, profile.gpu_comm))
        return RankActivity(rank, Basis.GPU, ("profiler GPU kernels",), profile.gpu_compute, profile.gpu_comm,
                            profile.gpu_memory, steps, profile.gpu_overlapped, profile.gpu_busy,
                            profile.windows)
    sources: list[str] = []
    compute: list[Span] = []
    comm: list[Span] = []
    if log is not None:
        ranges: dict[int, list[Span]] = defaultdict(list)
        for r in log.ranges:
            if r.t_end_ns is not None:
                ranges[r.tid].append((r.t_begin_ns, r.t_end_ns))
        in_calls: dict[int, list[Span]] = defaultdict(list)  # thread -> its calls, call to return
        for call in log.calls:
            end = call.t_end_ns  # None for GPU work whose completion was not seen: Flight Recorder covers it
            if end is not None:
                comm.append((call.t_call_ns, end))
            if call.t_return_ns is not None:
                in_calls[call.tid].append((call.t_call_ns, call.t_return_ns))
        for tid, spans in ranges.items():  # a range that wraps a call: the call is not its compute
            compute += difference(union(spans), union(in_calls[tid])) if tid in in_calls else spans
        sources += ["recorder ranges"] * bool(log.ranges) + ["recorder calls"] * bool(log.calls)
        blocked = union([s for spans in in_calls.values() for s in spans])
    else:
        blocked = []
    if profile.cpu_compute or profile.cpu_comm:
        # The profiler's threads are the OS's, the recorder's Python's: a recorded call leaves the profiler's
        # compute of every thread (a collective's own ops, on its thread, left it as the trace was read).
        compute += difference(profile.cpu_compute, blocked) if blocked else profile.cpu_compute
        comm += profile.cpu_comm
        sources.append("profiler CPU ops")
    compute_u = union(compute)
    comm_u = union(comm)
    if fr_spans is None:
        fr_spans = FlightRecorderSpans(job)(rank) if job is not None else []
    if fr_spans:
        comm_u = union(comm_u + fr_spans)
        sources.append("Flight Recorder")
    profiled_only = bool(profile.cpu_compute) and not (log is not None and log.ranges)
    return RankActivity(rank, Basis.CPU, tuple(sources), compute_u, comm_u, [],
                        _steps(log, profile, envelope(compute_u, comm_u)),
                        compute_windows=profile.windows if profiled_only else None, untimed=tuple(sorted(untimed)))


class FlightRecorderSpans:
    """``spans_of(rank)``: start (or enqueue) to end of the rank's collectives known only from Flight Recorder
    (the calls the patch layer saw are already counted, from the recorder's more precise times), on the job
    clock, one rank at a time: a report of 16,384 ranks holds one rank's spans, not every rank's.

    On a GPU backend Flight Recorder's end is when its watchdog noticed the work done: a collective counts its
    ``duration_ms`` from its enqueue (``Collective.work_of``, as the trace draws it), or nothing without one.
    The rank's values are read as its columns across each group's collectives (C-level slices), not as one
    tuple of every rank per collective."""

    def __init__(self, job: Job) -> None:
        self._groups: dict[int, list[GroupView]] = defaultdict(list)  # rank -> its groups' collectives
        for cols in job.collectives.values():
            if cols:
                for rank in cols[0].ranks:
                    self._groups[rank].append(cols)

    def __call__(self, rank: int) -> list[Span]:
        spans: list[Span] = []
        for cols in self._groups.get(rank, ()):
            # what each rule reads: a GPU's needs neither start nor end (see _gpu_spans)
            names = ("sources", "arrive_ns", "duration_ns") if cols.on_gpu else ("sources", "start_ns", "arrive_ns",
                                                                                  "end_ns")
            columns = [cols.member_column(name, rank) for name in names]
            spans.extend(_gpu_spans(*columns) if cols.on_gpu else _cpu_spans(*columns))
        return spans

    def untimed(self, rank: int) -> list[int]:
        """The arrivals of the rank's collectives on CPU backends that no source timed (Flight Recorder's
        alone, without an end: gloo's that the profiler did not see)."""
        out: list[int] = []
        for cols in self._groups.get(rank, ()):
            if not cols.on_gpu:
                columns = [cols.member_column(name, rank) for name in ("sources", "arrive_ns", "end_ns")]
                out.extend(arrive for source, arrive, end in zip(*columns)
                           if source == "fr" and arrive is not None and end is None)
        return out


def _gpu_spans(sources: list, arrives: list, gpus: list) -> Iterable[Span]:
    """``model.work_span`` of a rank's collectives known only from Flight Recorder on a GPU (no kernel begin):
    its ``duration_ms`` from its enqueue, nothing without one. Every one in C where all are known."""
    if sources.count("fr") == len(sources) and None not in arrives:
        if None in gpus:
            gpus = [0 if gpu is None else gpu for gpu in gpus]
        return compress(zip(arrives, map(add, arrives, gpus)), gpus)  # those with a time of their own
    return ((arrive, arrive + gpu) for source, arrive, gpu in zip(sources, arrives, gpus)
            if source == "fr" and arrive is not None and gpu)


def _cpu_spans(sources: list, starts: list, arrives: list, ends: list) -> Iterable[Span]:
    """Start (else arrival) to end of a rank's collectives known only from Flight Recorder on a CPU backend."""
    return ((begin, end) for source, start, arrive, end in zip(sources, starts, arrives, ends)
            if source == "fr" and (begin := start or arrive) is not None and end is not None and end > begin)


def _steps(log: RankLog | None, profile: RankProfile, span: Span | None) -> tuple[tuple[int, int, int], ...]:
    """Step windows: the recorder's step marks (step n runs from the mark that started it to the next one, the
    last to the end of the rank's activity), else the profiler's ``ProfilerStep#n``."""
    marks = [(step, t) for step, t, _source in log.steps] if log is not None else []
    if marks:
        end_of_run = span[1] if span is not None else marks[-1][1]
        first_begin = span[0] if span is not None else marks[0][1]
        bounds = ([(0, first_begin)] if first_begin < marks[0][1] else []) + marks
        out = []
        for (step, t), nxt in zip(bounds, bounds[1:] + [(None, max(end_of_run, bounds[-1][1]))]):
            if nxt[1] > t:
                out.append((step, t, nxt[1]))
        return tuple(out)
    return profile.steps
