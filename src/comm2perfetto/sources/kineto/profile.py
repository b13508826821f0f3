"""A rank's profiler (Kineto) traces reduced, where they are read, to what ``report`` measures: unions of GPU
compute, communication and memory kernels, of CPU compute and communication, the profiler steps (on the CPU
and on the GPU), the profiled windows, and with ``collectives`` the traces' communication events (what the
matching joins). ``read_profiles`` reads every rank's traces in worker processes: what crosses the process
boundary is a few lists of spans a rank, never an event object. Never imports torch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from operator import itemgetter
from pathlib import Path

from comm2perfetto.intervals import Span, intersection, union
from comm2perfetto.model import RankProfile
from comm2perfetto.sources.kineto.events import KinetoSpans
from comm2perfetto.sources.kineto.reader import KinetoFormatError, read_kineto_spans

__all__ = ["kineto_intervals", "rank_profile", "read_profiles"]

_END = itemgetter(1)


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
