"""Read everything a job left behind, found by ``sources.discover``, into ``Sources``: one attempt's recorder logs,
stall stacks, job files, profiler traces (as ``LoadOptions`` say) and Flight Recorder dumps (in worker
processes on big jobs), each checked once, here, as it becomes model data; then ``sources.checks`` says
whether they are of one job. Never imports torch.

Unreadable, truncated or unknown files are skipped and listed; nothing usable at all is an error. None is read
beyond ``limits.MAX_FILE_BYTES`` (after gzip), and a rank outside the job's world (from a file name, a header
or a stacks file) is not taken as a rank: see ``limits.py``.
"""

from __future__ import annotations

import os
import re
import socket
import sys
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from comm2perfetto.load_options import MERGE, LoadOptions, Traces
from comm2perfetto.model import Skipped
from comm2perfetto.processes import process_state
from comm2perfetto.sources.checks import (
    check_fr_groups,
    check_fr_times,
    check_log_headers,
    dumps_times,
    dumps_world,
    refuse_mixed,
)
from comm2perfetto.sources.discover import (
    ATTEMPT_KINDS,
    EVENT_LOG,
    FR,
    FR_COLUMNS,
    JOB,
    KINETO,
    STACKS,
    FoundFile,
    SourceError,
    find_files,
    pick_attempt,
)
from comm2perfetto.sources.event_log import UNCLOSED, EventLogError, RankLog, read_event_log
from comm2perfetto.sources.fr.dump import FrDump, FrFormatError, rank_from_name, read_fr_dump
from comm2perfetto.sources.fr.ingest import FrRankTrace, build_rank_trace
from comm2perfetto.sources.fr.tables import SignatureTable, StackTable
from comm2perfetto.sources.kineto.events import KinetoTrace
from comm2perfetto.sources.kineto.load import check_against_job, load_traces
from comm2perfetto.sources.kineto.profile import RankProfile, read_profiles
from comm2perfetto.sources.limits import MAX_FILE_BYTES, MAX_WORLD_SIZE, rank_ok, read_bounded, time_ok
from comm2perfetto.sources.stacks import StallStacks, read_stacks

__all__ = ["PARALLEL_MIN_RANKS", "Sources", "cores", "load_sources"]

# A job file's fields that tell how the whole run ended: its last attempt's ending, none of an earlier one's.
_RUN_END_FIELDS = ("exit_status", "signal", "signal_ns", "killed_leftovers")


@dataclass(slots=True)
class Sources:
    """Everything loaded, per rank, before alignment and matching."""

    fr: dict[int, FrRankTrace] = field(default_factory=dict)
    logs: dict[int, RankLog] = field(default_factory=dict)
    stacks: dict[int, list[StallStacks]] = field(default_factory=dict)  # stall stacks, oldest first
    kineto: dict[int, list[Path]] = field(default_factory=dict)  # profiler traces by rank
    traces: dict[int, list[KinetoTrace]] = field(default_factory=dict)  # the same, read (see load_sources)
    profiles: dict[int, RankProfile] = field(default_factory=dict)  # the same, as profile unions (idem)
    jobs: list[dict[str, Any]] = field(default_factory=list)  # every job file (one per `record`, per node)
    unusable_ranks: set[int] = field(default_factory=set)  # ranks whose every dump was skipped
    alive: dict[int, str] = field(default_factory=dict)  # unclosed logs of this host: their process's state
    skipped: list[Skipped] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    stack_table: StackTable = field(default_factory=StackTable)
    signatures: SignatureTable = field(default_factory=SignatureTable)
    attempt: int = 0  # the attempt loaded (of a job torchrun restarted; 0 for one never restarted)
    attempts: tuple[int, ...] = (0,)  # every attempt the paths hold files of

    @property
    def ranks(self) -> set[int]:
        return set(self.fr) | set(self.logs) | set(self.stacks) | set(self.kineto)

    @property
    def job_info(self) -> dict[str, Any] | None:
        """The job file written last (each node's ``record`` writes one)."""
        return max(self.jobs, key=lambda j: j.get("ended_ns") or 0) if self.jobs else None


def load_sources(paths: Sequence[str | Path], options: LoadOptions = MERGE) -> Sources:
    """Discover and load every file of one attempt, as ``options`` say (see ``LoadOptions``); raises
    SourceError when nothing is usable or jobs are mixed.

    ``options.attempt``: which of a restarted job's attempts to read (``attempt<k>`` folders; see
    ``discover.pick_attempt``), default the last; the others are only listed (``Sources.attempts``).

    Profiler traces are a source like the others (traces alone are a job): ranked (``options.trace_ranks``, from
    ``--trace-rank``, first; see ``sources.kineto.load``), then read as ``options.traces`` says: every event in
    this process (``Traces.EVENTS``), or their communication events in worker processes along with the
    profile unions (``Traces.COLLECTIVES``, ``sources.kineto.profile``); with ``options.profiles`` the unions
    are kept (``Sources.profiles``). ``Traces.LISTED`` only lists them (``kineto``); ``Traces.NONE`` leaves them
    out, and refuses a job of profiler traces alone.

    With ``options.force``, mixed jobs are loaded anyway (a note says so) instead of refused. Without
    ``options.stacks``, Flight Recorder call stacks are not read now: ``Job.stack_of`` re-reads the few a
    report needs. ``options.workers``: processes reading dumps (default: one per core from 32 ranks on, Linux;
    ``COMM2PERFETTO_LOAD_WORKERS`` overrides; ``--jobs``). ``options.progress(done, total)`` is called as ranks'
    dumps are read, ``options.trace_progress`` as their traces are.
    """
    attempt, force = options.attempt, options.force
    found, skipped = find_files(paths)
    chosen, attempts = pick_attempt(found, attempt, paths)
    src = Sources(skipped=[s for s, a in skipped if a == chosen], attempt=chosen, attempts=attempts)
    by_kind: dict[str, list[FoundFile]] = defaultdict(list)
    for f in found:
        if f.attempt == chosen or f.kind not in ATTEMPT_KINDS:
            by_kind[f.kind].append(f)
    problems: list[str] = []  # mixed-job evidence

    for f in by_kind[EVENT_LOG]:
        try:
            log = read_event_log(f.path)
        except EventLogError as exc:
            src.skipped.append(Skipped(str(f.path), str(exc).removeprefix(f"{f.path}: ")))
            continue
        if log.rank in src.logs:
            problems.append(f"two event logs for rank {log.rank}: {src.logs[log.rank].path} and {f.path}")
            continue
        src.logs[log.rank] = log
        src.notes.extend(log.problems)
    check_log_headers(src.logs, problems)

    for f in by_kind[STACKS]:
        try:
            doc = read_stacks(f.path)
        except EventLogError as exc:
            src.skipped.append(Skipped(str(f.path), str(exc).removeprefix(f"{f.path}: ")))
            continue
        src.stacks.setdefault(doc.rank, []).append(doc)
    for docs in src.stacks.values():
        docs.sort(key=lambda d: d.t_ns or 0)

    for f in by_kind[JOB]:
        try:
            info = orjson.loads(read_bounded(f.path, MAX_FILE_BYTES >> 10))
        except (OSError, EOFError, ValueError):  # JSONDecodeError and TooLargeError are ValueErrors
            src.skipped.append(Skipped(str(f.path), "unreadable job.json"))
            continue
        if isinstance(info, dict):
            fields = _plain_fields(info)
            if chosen != attempts[-1]:  # torchrun restarted after this attempt: the run's end is not its own
                fields = {k: v for k, v in fields.items() if k not in _RUN_END_FIELDS}
            src.jobs.append(dict(fields, probes=_probes(info.get("probes"), chosen),
                                 exits=_exits(info.get("exits"), chosen), _path=str(f.path)))

    read = options.traces == Traces.EVENTS
    traces = load_traces(by_kind[KINETO], options.trace_ranks, read, spans=read and options.profiles)
    src.kineto, src.traces, src.profiles = traces.paths, traces.traces, traces.profiles
    src.skipped.extend(traces.skipped)
    problems.extend(traces.problems)

    _load_fr(by_kind[FR] + by_kind[FR_COLUMNS], src, problems, options.stacks, options.workers, options.progress)
    _drop_outside_world(src, traces.world)
    check_fr_groups(src.fr, src.logs, problems)
    check_fr_times(src.fr, problems)
    src.alive = _probe_alive(src.logs)
    _say_what_unclosed_logs_are(src)
    if options.traces == Traces.COLLECTIVES and src.kineto:
        _read_profiles(src, options)
    check_against_job(src.traces, dumps_world(src.logs, src.fr), dumps_times(src.fr, src.logs), problems)
    refuse_mixed(problems, force, src.notes)
    if not src.fr and not src.logs and not src.kineto:
        where = ", ".join(str(p) for p in paths)
        detail = f" ({len(src.skipped)} file(s) skipped, e.g. {src.skipped[0].path}: {src.skipped[0].reason})" \
            if src.skipped else ""
        raise SourceError(
            f"no Flight Recorder dump, comm2perfetto event log or profiler trace found in {where}{detail}; "
            "give the folder `comm2perfetto record` wrote, or the folder of TORCH_FR_DUMP_TEMP_FILE dumps"
        )
    if options.traces == Traces.NONE:
        _leave_traces_out(src)
    return src


PARALLEL_TRACE_BYTES = 64 << 20  # below this much of profiler traces, starting workers costs more than it saves


def _read_profiles(src: Sources, options: LoadOptions) -> None:
    """Read the listed traces in worker processes into profile unions and their communication events
    (``Traces.COLLECTIVES``): the events become ``traces``, the unions ``profiles`` when asked for."""
    n = options.workers if options.workers is not None else _trace_workers(src.kineto)
    profiles = read_profiles(src.kineto, workers=n, progress=options.trace_progress, whole_us=options.whole_us,
                             hta_scope=options.hta_scope, collectives=True)
    src.traces = {rank: list(p.traces) for rank, p in profiles.items() if p.traces}
    if options.profiles:
        src.profiles = profiles


def _trace_workers(kineto: Mapping[int, list[Path]]) -> int:
    """Processes to read the profiler traces in: every core for big traces (or many ranks), else this one."""
    paths = [p for ps in kineto.values() for p in ps]
    if len(kineto) < 2:
        return 1
    if len(kineto) >= PARALLEL_MIN_RANKS or sum(p.stat().st_size for p in paths if p.exists()) >= PARALLEL_TRACE_BYTES:
        return min(len(kineto), cores())
    return 1


def _leave_traces_out(src: Sources) -> None:
    """``Traces.NONE`` (``--no-profiler``): the traces were ranked, and checked against the job, but are no part
    of it; SourceError when nothing else is there."""
    if src.kineto and not src.fr and not src.logs:
        example = next(iter(src.kineto.values()))[0]
        raise SourceError(f"only profiler traces found (e.g. {example}), and --no-profiler leaves them out")
    src.kineto.clear()
    src.traces.clear()


def _plain_fields(info: dict[str, Any]) -> dict[str, Any]:
    """job.json's fields that are strings, lists of strings, or numbers an int64 holds (what the recorder
    writes: ``{"format": "comm2perfetto-job", "command": [...], "started_ns": ..., "exit_status": 0}``)."""
    def plain(v: Any) -> bool:
        return (isinstance(v, str) or v is None or (isinstance(v, int) and abs(v) < 1 << 63)
                or (isinstance(v, list) and all(isinstance(x, str) for x in v)))
    return {k: v for k, v in info.items() if plain(v)}


PROCESS_STATES = ("stopped", "held", "running", "gone")  # held: running while its recorder thread did not


def _probes(raw: Any, attempt: int) -> list[dict[str, Any]]:
    """job.json's ``probes`` of one torchrun attempt, checked: what `record` saw of a rank's process at a stall or
    a signal, e.g. ``[{"rank": 1, "pid": 4242, "state": "stopped", "t_ns": 1795313447406614332, "attempt": 0}]``."""
    out = []
    for p in raw[:4096] if isinstance(raw, list) else ():
        if isinstance(p, dict) and rank_ok(p.get("rank")) and time_ok(p.get("t_ns")) \
                and p.get("state") in PROCESS_STATES and p.get("attempt", 0) == attempt:
            out.append({"rank": p["rank"], "t_ns": p["t_ns"], "state": p["state"]})
    return out


_SIGNAL_NAME = re.compile(r"SIG[A-Z0-9]{1,8}")


def _exits(raw: Any, attempt: int) -> list[dict[str, Any]]:
    """job.json's ``exits`` of one torchrun attempt, checked: when `record` saw each of its host's ranks' processes
    end (alive at ``alive_ns``, ended by ``t_ns``) and how, where it looked before the launcher reaped it
    (``exit_watch``), e.g. ``[{"rank": 0, "pid": 4242, "attempt": 0, "alive_ns": 1795313447406614332,
    "t_ns": 1795313447410251003, "signal": "SIGKILL", "status": null}]``. An entry that breaks a rule is left out
    whole."""
    out = []
    for e in raw[:4096] if isinstance(raw, list) else ():
        if not isinstance(e, dict) or not rank_ok(e.get("rank")) or type(e.get("pid")) is not int \
                or not time_ok(e.get("t_ns")) or e.get("attempt", 0) != attempt:
            continue
        alive, sig, status = e.get("alive_ns"), e.get("signal"), e.get("status")
        if not (alive is None or (time_ok(alive) and alive <= e["t_ns"])) \
                or not (sig is None or (isinstance(sig, str) and _SIGNAL_NAME.fullmatch(sig))) \
                or not (status is None or (type(status) is int and 0 <= status <= 255)) \
                or (sig is not None and status is not None):
            continue
        out.append({"rank": e["rank"], "pid": e["pid"], "alive_ns": alive, "t_ns": e["t_ns"], "signal": sig,
                    "status": status})
    return out


def _probe_alive(logs: dict[int, RankLog]) -> dict[int, str]:
    """For each log not closed that was written on this host: its process's state now (``processes``:
    ``running``, ``stopped``, ``gone``).

    (A log without its closing record is either a dead rank's or a live one's; on another host the reader
    relies on the log's heartbeats.)"""
    here = socket.gethostname()
    out = {}
    for rank, log in logs.items():
        pid = log.header.get("pid")
        if log.closed_cleanly or log.header.get("host") != here or not isinstance(pid, int) or pid <= 0:
            continue
        out[rank] = process_state(pid)
    return out


_STATE_SAID = {"running": ": still being written (its process runs on this host): read up to its last record",
               "stopped": ": still being written (its process, on this host, is stopped): read up to its last record",
               "gone": ": not closed cleanly (its process is gone: it died): read up to its last record"}


def _say_what_unclosed_logs_are(src: Sources) -> None:
    """An unclosed log whose process this host can see is told as what it is: still running, or dead."""
    for rank, state in src.alive.items():
        name = src.logs[rank].path.name
        src.notes = [name + _STATE_SAID[state] if note == name + UNCLOSED else note for note in src.notes]


PARALLEL_MIN_RANKS = 32  # below this, starting workers costs more than it saves


def _load_fr(
    files: list[FoundFile], src: Sources, problems: list[str], with_stacks: bool,
    workers: int | None = None, progress: Callable[[int, int], None] | None = None,
) -> None:
    """Load FR dumps rank by rank; each rank's raw dicts are dropped once its columns are built.

    Unpickling is most of the time and runs in C holding the GIL, so on big jobs the ranks are spread over
    worker processes (fork, Linux) that send back the compact columns; see ``_worker_count``.
    """
    per_rank: dict[int, list[FoundFile]] = defaultdict(list)
    for f in files:
        rank = rank_from_name(f.path.name)
        if rank is None:
            src.skipped.append(Skipped(
                str(f.path), "Flight Recorder dumps do not store their rank and this name has no rank number; "
                "rename it to end in the rank (e.g. nccl_trace_rank_3)"))
            continue
        if rank >= MAX_WORLD_SIZE:
            src.skipped.append(Skipped(str(f.path), f"rank {rank} (from the file name) is beyond the largest "
                                                    f"world size accepted ({MAX_WORLD_SIZE:,})"))
            continue
        per_rank[rank].append(f)
    n = _worker_count(len(per_rank), workers)
    loaded: set[int] = set()

    def results() -> Iterator[tuple[_RankLoad, bool]]:
        if n > 1:
            try:
                for result in _load_parallel(per_rank, n, with_stacks):
                    yield result, True
            except (OSError, RuntimeError, MemoryError, EOFError) as exc:  # no fork, a worker killed...
                src.notes.append(f"reading dumps in worker processes failed ({type(exc).__name__}); the ranks "
                                 "left were read in this process")
        for rank in sorted(set(per_rank) - loaded):
            yield (rank,) + _load_rank(rank, per_rank[rank], src.stack_table, src.signatures, with_stacks), False

    for done, ((rank, trace, conflict, skipped, used_stacks), from_worker) in enumerate(results(), 1):
        loaded.add(rank)
        if progress is not None:
            progress(done, len(per_rank))
        if trace is None:
            src.unusable_ranks.add(rank)  # its dumps were there: the rank belongs to the job, without data
        src.skipped.extend(skipped)
        if conflict:
            problems.append(conflict)
        if trace is not None:
            src.notes.extend(trace.notes)
            if from_worker:
                _adopt(trace, used_stacks, src)
            src.fr[rank] = trace


def _worker_count(ranks: int, requested: int | None) -> int:
    if requested is None:
        env = os.environ.get("COMM2PERFETTO_LOAD_WORKERS")
        requested = int(env) if env and env.isdigit() else None
    if requested is not None:
        return max(1, min(requested, ranks))
    if ranks < PARALLEL_MIN_RANKS or not sys.platform.startswith("linux"):
        return 1
    return max(1, min(cores(), ranks))


def cores() -> int:
    """The cores this process may run on (a job scheduler's CPU set, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


# What reading one rank's dumps gives: (rank, its columns or None, a conflict, what was skipped, the stacks used).
_RankLoad = tuple[int, FrRankTrace | None, str | None, list[Skipped], dict[int, Any]]


def _load_rank(
    rank: int, files: list[FoundFile], stack_table: StackTable, signatures: SignatureTable, with_stacks: bool,
) -> tuple[FrRankTrace | None, str | None, list[Skipped], dict[int, Any]]:
    """Read and normalise one rank's dumps (or its compact columns file, written by ``comm2perfetto compact``):
    (trace or None, snapshot conflict, skipped files, stacks used)."""
    skipped: list[Skipped] = []
    columns = [f for f in files if f.kind == FR_COLUMNS]
    if columns:
        return _load_columns(rank, columns[0], [f for f in files if f is not columns[0]], stack_table, signatures)
    dumps: list[FrDump] = []
    for f in files:
        try:
            dumps.append(read_fr_dump(f.path))
        except FrFormatError as exc:
            skipped.append(Skipped(str(f.path), str(exc).removeprefix(f"{f.path}: ")))
    if not dumps:
        return None, None, skipped, {}
    try:
        trace, conflict = build_rank_trace(rank, dumps, stack_table, signatures, with_stacks)
    except (AttributeError, TypeError, KeyError, IndexError, ValueError, RecursionError) as exc:
        # RecursionError: a pickle can hold a list that contains itself, which comparing never finishes
        skipped.extend(Skipped(str(d.path), f"malformed Flight Recorder entries ({type(exc).__name__})")
                       for d in dumps)
        return None, None, skipped, {}
    return trace, conflict, skipped, {}


def _load_columns(rank: int, f: FoundFile, others: list[FoundFile], stack_table: StackTable,
                  signatures: SignatureTable) -> tuple[FrRankTrace | None, str | None, list[Skipped], dict[int, Any]]:
    """A rank's compact columns file, checked as any input; the rank's other dumps are left aside."""
    skipped = [Skipped(str(o.path), f"rank {rank}'s compact columns file {f.path.name} is read instead")
               for o in others]
    from comm2perfetto.sources.fr.compact import read_fr_columns  # only where `compact` wrote files

    try:
        trace, conflict = read_fr_columns(f.path, stack_table)
    except FrFormatError as exc:
        return None, None, [*skipped, Skipped(str(f.path), str(exc).removeprefix(f"{f.path}: "))], {}
    if trace.rank != rank:
        return None, None, [*skipped, Skipped(str(f.path), f"holds rank {trace.rank}'s data but its name says rank "
                                                           f"{rank}; not read")], {}
    for track in trace.groups.values():  # one object per distinct signature, as for dumps
        track.sig_table = list(map(signatures.intern, track.sig_table))
    return trace, conflict, skipped, {}


# --- parallel loading ------------------------------------------------------------------------------------

_worker_tables: tuple[StackTable, SignatureTable] | None = None


def _worker_load(task: tuple[int, list[FoundFile], bool]) -> tuple:
    """In a worker: load one rank with this process's own tables; return what the parent needs to adopt it."""
    global _worker_tables
    if _worker_tables is None:
        _worker_tables = (StackTable(), SignatureTable())
    stacks, signatures = _worker_tables
    rank, files, with_stacks = task
    trace, conflict, skipped, _ = _load_rank(rank, files, stacks, signatures, with_stacks)
    used: dict[int, Any] = {}
    if trace is not None and (with_stacks or any(t.stack_table for t in trace.groups.values())):
        for track in trace.groups.values():
            for sid in set(track.stack_table) | {row[7] for row in track.p2p}:
                if sid is not None:
                    used[sid] = stacks.stacks[sid]
    return rank, trace, conflict, skipped, used


def _load_parallel(per_rank: dict[int, list[FoundFile]], workers: int, with_stacks: bool) -> Iterator[_RankLoad]:
    import multiprocessing

    tasks = [(rank, per_rank[rank], with_stacks) for rank in sorted(per_rank)]
    ctx = multiprocessing.get_context("fork")
    chunk = max(1, min(16, len(tasks) // (workers * 8)))
    with ctx.Pool(workers) as pool:
        yield from pool.imap(_worker_load, tasks, chunksize=chunk)


def _adopt(trace: FrRankTrace, used_stacks: dict[int, Any], src: Sources) -> None:
    """Re-intern a worker's signatures and stacks into this process's tables (identity is per process).

    Per-entry work is done with ``map`` over C callables: a rank has thousands of rows but a handful of
    distinct signatures and stacks.
    """
    table = src.stack_table
    sid_of: dict[int, int] = {}
    for sid, stack in used_stacks.items():
        sid_of[sid] = table.intern(tuple(table.frame(f.file, f.line, f.func) for f in stack))
    intern = src.signatures.intern
    for track in trace.groups.values():
        track.sig_table = list(map(intern, track.sig_table))  # the columns hold ids into these: nothing per row
        if used_stacks:
            track.stack_table = list(map(sid_of.__getitem__, track.stack_table))
        if track.p2p:
            track.p2p = [row[:3] + (intern(row[3]),) + row[4:7] + (sid_of.get(row[7]),) + row[8:]
                         for row in track.p2p]


def _drop_outside_world(src: Sources, trace_world: int | None = None) -> None:
    """Skip dumps, stall stacks and profiler traces of ranks outside the world the job's own files state
    (event log headers, else the dumps' default group, else the profiler traces' distributedInfo): "rank 99"
    of a 2-rank job is no rank of it."""
    worlds = {log.world_size for log in src.logs.values()}
    if len(worlds) != 1:
        worlds = {len(t.pg_config["0"].ranks) for t in src.fr.values()
                  if "0" in t.pg_config and t.pg_config["0"].ranks}
    if len(worlds) != 1 and trace_world is not None:
        worlds = {trace_world}
    if len(worlds) != 1:
        return  # unknown, or files that disagree: the mixed-jobs check says so
    (world,) = worlds
    def outside(what: str, rank: int) -> str:
        return f"{what} rank {rank}, outside the job's {world} ranks (the world size its other files state)"

    for rank in [r for r in src.fr if r >= world]:
        src.skipped.extend(Skipped(path, outside("Flight Recorder dump of (by its name)", rank))
                           for path in src.fr.pop(rank).files)
    for rank in [r for r in src.stacks if r >= world]:
        src.skipped.extend(Skipped(d.path, outside("stall stacks of", rank)) for d in src.stacks.pop(rank))
    for rank in [r for r in src.kineto if r >= world]:
        src.skipped.extend(Skipped(str(p), outside("profiler trace of", rank)) for p in src.kineto.pop(rank))
        src.traces.pop(rank, None)
        src.profiles.pop(rank, None)
