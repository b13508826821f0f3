"""A rank's profiler (Kineto) traces reduced, where they are read, to what ``report`` measures: unions of GPU
compute, communication and memory kernels, of CPU compute and communication, the profiler steps (on the CPU
and on the GPU), the profiled windows, and with ``collectives`` the traces' communication events (what the
matching joins). ``read_profiles`` reads every rank's traces in worker processes: what crosses the process
boundary is a few lists of spans a rank, never an event object. Never imports torch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from operator import itemgetter
from pathlib import Path

from comm2perfetto.intervals import Span, intersection, union
from comm2perfetto.sources.kineto.events import KinetoSpans
from comm2perfetto.sources.kineto.reader import KinetoFormatError, read_kineto_spans

__all__ = ["RankProfile", "kineto_intervals", "rank_profile", "read_profiles"]

_END = itemgetter(1)


@dataclass(frozen=True)
class RankProfile:
    """One rank's profiler traces reduced to unions of ``(begin, end)`` ns spans (``rank_profile``, on the rank's
    own clock; ``Job.profiles`` holds them moved onto the job's: see ``shifted``). Picklable, small."""

    gpu_compute: list[tuple[int, int]] = field(default_factory=list)
    gpu_comm: list[tuple[int, int]] = field(default_factory=list)
    gpu_memory: list[tuple[int, int]] = field(default_factory=list)
    cpu_compute: list[tuple[int, int]] = field(default_factory=list)
    cpu_comm: list[tuple[int, int]] = field(default_factory=list)
    # gpu_compute ∩ gpu_comm and the union of all three GPU classes: a rank's clock offset moves them but
    # leaves their shape, so the workers that read the traces compute them, in parallel.
    gpu_overlapped: list[tuple[int, int]] | None = None
    gpu_busy: list[tuple[int, int]] | None = None
    steps: tuple[tuple[int, int, int], ...] = ()  # ProfilerStep#n: (n, begin, end)
    gpu_steps: tuple[tuple[int, int, int], ...] = ()  # the same steps on the GPU's time (see gpu_step_spans)
    windows: tuple[tuple[int, int], ...] = ()  # each trace's first to last event: where the profiler was running
    traces: tuple = ()  # with collectives=True: each trace's communication events (KinetoTrace, comm only)
    events: int = 0
    notes: tuple[str, ...] = ()

    def shifted(self, offset_ns: int) -> RankProfile:
        """The same profile with every span moved by ``offset_ns`` (onto the job's clock: ``match.load_job``),
        its communication events left out: the job holds them (``Job.traces``), on its clock."""
        def spans(u: list[tuple[int, int]]) -> list[tuple[int, int]]:
            return [(b + offset_ns, e + offset_ns) for b, e in u] if offset_ns else u

        def steps(s: tuple[tuple[int, int, int], ...]) -> tuple[tuple[int, int, int], ...]:
            return tuple((n, b + offset_ns, e + offset_ns) for n, b, e in s) if offset_ns else s

        return replace(
            self, gpu_compute=spans(self.gpu_compute), gpu_comm=spans(self.gpu_comm),
            gpu_memory=spans(self.gpu_memory), cpu_compute=spans(self.cpu_compute), cpu_comm=spans(self.cpu_comm),
            gpu_overlapped=spans(self.gpu_overlapped) if self.gpu_overlapped is not None else None,
            gpu_busy=spans(self.gpu_busy) if self.gpu_busy is not None else None,
            steps=steps(self.steps), gpu_steps=steps(self.gpu_steps),
            windows=tuple(spans(list(self.windows))), traces=())


def kineto_intervals(paths: Sequence[Path], whole_us: bool = False, hta_scope: bool = False,
                     collectives: bool = False) -> RankProfile:
    """Read a rank's profiler traces (several files: several profiled windows) into unions. ``whole_us`` and
    ``hta_scope``: as HTA reads them; ``collectives``: keep their communication events (``read_kineto_spans``)."""
    read: list[KinetoSpans] = []
    notes: list[str] = []
    for path in paths:
        try:
            read.append(read_kineto_spans(path, whole_us=whole_us, hta_scope=hta_scope, collectives=collectives))
        except KinetoFormatError as exc:
            notes.append(f"skipped {path}: {exc}")
    return rank_profile(read, notes)


def rank_profile(read: Iterable[KinetoSpans], notes: Sequence[str] = ()) -> RankProfile:
    """A rank's traces, read as spans, reduced to its profile: the unions of its GPU classes where it has compute or
    communication kernels, else of its CPU compute and communication; its steps and profiled windows."""
    gpu: dict[str, list[Span]] = {"compute": [], "comm": [], "memory": []}
    cpu_compute: list[Span] = []
    cpu_comm: list[Span] = []
    steps: list[tuple[int, int, int]] = []
    gpu_steps: list[tuple[int, int, int]] = []
    windows: list[Span] = []
    traces: list = []
    events = 0
    for trace in read:
        events += trace.event_count
        for klass, spans in trace.gpu.items():
            gpu[klass] += spans
        cpu_compute += trace.cpu_compute
        cpu_comm += trace.comm
        steps.extend(trace.steps)
        gpu_steps.extend(trace.gpu_steps)
        if trace.collectives is not None:
            traces.append(trace.collectives)
        parts = [part for part in (trace.cpu_compute, trace.comm, *trace.gpu.values()) if part]
        if parts:  # tuple comparison and itemgetter: C speed on a trace's hundred thousand spans
            windows.append((min(min(part)[0] for part in parts), max(max(part, key=_END)[1] for part in parts)))
    windows.sort()
    if gpu["compute"] or gpu["comm"]:  # the rank's figures come from its kernels: CPU intervals go unused
        compute, comm, memory = union(gpu["compute"]), union(gpu["comm"]), union(gpu["memory"])
        return RankProfile(compute, comm, memory, gpu_overlapped=intersection(compute, comm),
                           gpu_busy=union(compute + comm + memory), steps=tuple(sorted(steps)),
                           gpu_steps=tuple(sorted(gpu_steps)), windows=tuple(windows), traces=tuple(traces),
                           events=events, notes=tuple(notes))
    return RankProfile(gpu_memory=union(gpu["memory"]), cpu_compute=union(cpu_compute),
                       cpu_comm=union(cpu_comm), steps=tuple(sorted(steps)), windows=tuple(windows),
                       traces=tuple(traces), events=events, notes=tuple(notes))


def read_profiles(kineto_files: Mapping[int, Sequence[Path]], workers: int = 1,
                  progress: Callable[[int, int], None] | None = None,
                  whole_us: bool = False, hta_scope: bool = False,
                  collectives: bool = False) -> dict[int, RankProfile]:
    """:func:`kineto_intervals` for every rank, in up to ``workers`` processes."""
    ranks = sorted(kineto_files)
    tasks = [kineto_files[r] for r in ranks]
    read = partial(kineto_intervals, whole_us=whole_us, hta_scope=hta_scope, collectives=collectives)
    if workers <= 1 or len(ranks) <= 1:
        return _gather(ranks, map(read, tasks), progress)
    from concurrent.futures import ProcessPoolExecutor  # 30 ms of imports a small job does without

    with ProcessPoolExecutor(max_workers=workers) as pool:
        return _gather(ranks, pool.map(read, tasks), progress)


def _gather(ranks: list[int], results: Iterable[RankProfile],
            progress: Callable[[int, int], None] | None) -> dict[int, RankProfile]:
    out: dict[int, RankProfile] = {}
    for i, (rank, result) in enumerate(zip(ranks, results)):
        out[rank] = result
        if progress:
            progress(i + 1, len(ranks))
    return out
