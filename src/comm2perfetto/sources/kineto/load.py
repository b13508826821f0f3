"""Profiler (Kineto) traces as a source of the job: which rank each belongs to, reading them, and whether they
come from the same job as the Flight Recorder dumps and event logs next to them. Never imports torch.

A trace whose rank cannot be told (see ``rank``) is skipped with one line naming it and the option
that gives its rank (``--trace-rank FILE=RANK``). Traces are read whole here (``read_kineto``: ``merge`` draws
their events), or in worker processes into profile unions (``profile``); every command builds collectives
from their communication events (``collectives``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from comm2perfetto.errors import OptionError
from comm2perfetto.model import Skipped
from comm2perfetto.sources.kineto.events import KinetoSpans, KinetoTrace
from comm2perfetto.sources.kineto.profile import RankProfile, rank_profile
from comm2perfetto.sources.kineto.rank import distributed_info, rank_from_trace_name
from comm2perfetto.sources.kineto.reader import KinetoFormatError, read_kineto, read_kineto_and_spans

__all__ = ["LoadedTraces", "check_against_job", "load_traces", "parse_trace_ranks", "trace_rank", "trace_span"]

# Traces and dumps whose times lie further apart than this are not one job: no training job runs for a month
# without a restart, and a folder mixing a 2023 profile with today's dumps is the mistake this catches.
MAX_JOB_SPAN_NS = 30 * 86_400 * 10**9


def parse_trace_ranks(values: list[str] | None) -> dict[str, int]:
    """``["traces/a.json=3"]`` (``--trace-rank``) -> ``{"traces/a.json": 3}``; OptionError (a ValueError) on a
    bad one."""
    out: dict[str, int] = {}
    for value in values or ():
        path, sep, rank = value.rpartition("=")
        if not sep or not path or not rank.strip().isdigit():
            raise OptionError(f"--trace-rank {value!r}: expected FILE=RANK, e.g. traces/worker7.json=7")
        out[path] = int(rank)
    return out


def trace_rank(path: Path, gzipped: bool, given: Mapping[str, int]) -> tuple[int | None, int | None, str]:
    """(rank, world size, where the rank came from) of one trace: ``--trace-rank`` (by path or file name),
    else ``distributedInfo``, else the file name; (None, world, "") when unknown."""
    for key in (str(path), path.name):
        if key in given:
            return given[key], distributed_info(path, gzipped)[1], "--trace-rank"
    resolved = path.resolve()
    for key, given_rank in given.items():
        if Path(key).resolve() == resolved:
            return given_rank, distributed_info(path, gzipped)[1], "--trace-rank"
    rank, world = distributed_info(path, gzipped)
    if rank is not None:
        return rank, world, "distributedInfo"
    rank = rank_from_trace_name(path.name)
    return rank, world, "file name" if rank is not None else ""


@dataclass(slots=True)
class LoadedTraces:
    """What ``load_traces`` found: the traces' paths by rank, read where asked (``traces``, and ``profiles``:
    their unions of one reading), the files skipped, mixed-job problems (traces disagreeing on world size), and
    the world size the traces' ``distributedInfo`` agree on (None: none, or they disagree)."""

    paths: dict[int, list[Path]]
    traces: dict[int, list[KinetoTrace]]
    profiles: dict[int, RankProfile]
    skipped: list[Skipped]
    problems: list[str]
    world: int | None


def load_traces(files: list[Any], given: Mapping[str, int], read: bool, spans: bool = False) -> LoadedTraces:
    """Rank every trace (``files``: discover's FoundFile of kind kineto) and, with ``read``, parse it; with
    ``spans`` also into each rank's profile unions (``sources.kineto.profile``), from the same reading."""
    paths: dict[int, list[Path]] = defaultdict(list)
    traces: dict[int, list[KinetoTrace]] = defaultdict(list)
    read_spans: dict[int, list[KinetoSpans]] = defaultdict(list)
    skipped: list[Skipped] = []
    worlds: dict[int, list[Path]] = defaultdict(list)
    for f in files:
        rank, world, _how = trace_rank(f.path, f.gzipped, given)
        if rank is None:
            skipped.append(Skipped(str(f.path), "profiler trace of unknown rank (no distributedInfo, no rank in "
                                   f"its name): give it with --trace-rank {f.path}=RANK"))
            continue
        if world is not None:
            worlds[world].append(f.path)
        if read:
            try:
                if spans:
                    trace, its_spans = read_kineto_and_spans(f.path)
                    read_spans[rank].append(its_spans)
                else:
                    trace = read_kineto(f.path)
            except KinetoFormatError as exc:
                skipped.append(Skipped(str(f.path), str(exc).removeprefix(f"{f.path}: ")))
                continue
            traces[rank].append(trace)
        paths[rank].append(f.path)
    problems = []
    if len(worlds) > 1:
        examples = ", ".join(f"{p[0]} (world size {w})" for w, p in sorted(worlds.items()))
        problems.append(f"profiler traces disagree on world size: {examples}")
    profiles = {rank: rank_profile(s) for rank, s in read_spans.items()}
    return LoadedTraces(dict(paths), dict(traces), profiles, skipped, problems,
                        next(iter(worlds)) if len(worlds) == 1 else None)


def trace_span(trace: KinetoTrace) -> tuple[int, int] | None:
    """First begin and last end of a trace's events (CPU ops, GPU work, communication)."""
    begins = [evs[0].t_begin_ns for evs in (trace.cpu_ops, trace.gpu_events) if evs]
    begins += [min(e.t_begin_ns for e in trace.comm_events)] if trace.comm_events else []
    ends = [max(e.t_end_ns for e in evs) for evs in (trace.cpu_ops, trace.gpu_events) if evs]
    ends += [max(e.t_end_ns for e in trace.comm_events)] if trace.comm_events else []
    return (min(begins), max(ends)) if begins else None


def check_against_job(traces: Mapping[int, list[KinetoTrace]], world: int | None,
                      other_times: list[int], problems: list[str]) -> None:
    """Mixed-job evidence between traces and the dumps/logs: another world size, or times more than
    ``MAX_JOB_SPAN_NS`` apart (``other_times``: a few times of the dumps and logs)."""
    for rank in sorted(traces):
        for trace in traces[rank]:
            if world is not None and trace.world_size is not None and trace.world_size != world:
                problems.append(f"{trace.path} is from a job of world size {trace.world_size}, the dumps and "
                                f"logs from one of {world}")
                return
            span = trace_span(trace)
            if span is None or not other_times:
                continue
            gap = max(min(other_times) - span[1], span[0] - max(other_times), 0)
            if gap > MAX_JOB_SPAN_NS:
                problems.append(f"{trace.path} was recorded {gap / 86_400e9:.0f} days away from the Flight "
                                "Recorder dumps and event logs")
                return
