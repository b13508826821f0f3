"""Find and load everything a job left behind, recognising each file by its content. Never imports torch.

Files are told apart by their first bytes, never by their names (which vary: ``nccl_trace_rank_5``,
``comm_lib_trace_rank_5``, ``rank5.pkl``, ``rank5.fr.3.pkl``, names with hosts in them)::

    \\x80\\x02...                                   pickle        -> Flight Recorder dump
    {"version": "2.10", "pg_config": ..., "entries"  JSON          -> Flight Recorder dump (_dump_fr_trace_json)
    {"kind": "header", "format": "comm2perfetto-events"...          -> recorder event log
    {"format": "comm2perfetto-stacks"...                            -> stall stacks
    {"schemaVersion": 1, "traceEvents": [...]       JSON or gzip  -> Kineto trace
    job.json                                                        -> the recorder's job summary
    {"format": "comm2perfetto-stall-verdict"...                     -> record's live verdict (not read)

Unreadable, truncated or unknown files are skipped and listed; nothing usable at all is an error.
"""

from __future__ import annotations

import gzip
import os
import sys
import zlib
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from comm2perfetto.model import Skipped
from comm2perfetto.sources.event_log import EventLogError, RankLog, is_event_log, read_event_log, read_stacks
from comm2perfetto.sources.flight_recorder import FrDump, FrFormatError, rank_from_name, read_fr_dump
from comm2perfetto.sources.fr_ingest import FrRankTrace, build_rank_trace
from comm2perfetto.sources.fr_tables import SignatureTable, StackTable
from comm2perfetto.sources.kineto import gunzip_head, sniff_kineto
from comm2perfetto.sources.safe_pickle import looks_like_pickle

HEAD_BYTES = 8192

FR, EVENT_LOG, STACKS, KINETO, JOB = "fr", "event_log", "stacks", "kineto", "job"
VERDICT = "verdict"  # record's live stall verdict (cli/live.py): an output, not evidence; read by no command


class SourceError(Exception):
    """Input the user must fix (wrong path, nothing usable, mixed jobs): one clear message."""


class MixedJobsError(SourceError):
    """Files from more than one job in the folders given."""


@dataclass(frozen=True, slots=True)
class FoundFile:
    path: Path
    kind: str
    gzipped: bool = False


@dataclass(slots=True)
class Sources:
    """Everything loaded, per rank, before alignment and matching."""

    fr: dict[int, FrRankTrace] = field(default_factory=dict)
    logs: dict[int, RankLog] = field(default_factory=dict)
    stacks: dict[int, list[dict[str, Any]]] = field(default_factory=dict)  # stall stacks, oldest first
    kineto: dict[int | None, list[Path]] = field(default_factory=dict)
    job_info: dict[str, Any] | None = None
    skipped: list[Skipped] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    stack_table: StackTable = field(default_factory=StackTable)
    signatures: SignatureTable = field(default_factory=SignatureTable)

    @property
    def ranks(self) -> set[int]:
        return set(self.fr) | set(self.logs) | set(self.stacks)


def classify(head: bytes, name: str) -> str | None:
    """Which kind of file these first bytes start, or None when unknown."""
    if looks_like_pickle(head):
        return FR
    if head[:2] == b"\x1f\x8b":
        inner = gunzip_head(head, HEAD_BYTES)
        if looks_like_pickle(inner):  # a gzipped dump (rank3.pkl.gz)
            return FR
        return _classify_json(inner, name) if inner else None
    return _classify_json(head, name)


def _classify_json(head: bytes, name: str) -> str | None:
    text = head.lstrip()
    if text[:1] not in (b"{", b"["):
        return None
    if is_event_log(head):
        return EVENT_LOG
    if b'"comm2perfetto-stacks"' in head:
        return STACKS
    # Kineto first: its distributedInfo also carries a "pg_config".
    if sniff_kineto(head):
        return KINETO
    if b'"profiling_name"' in head or b'"pg_config"' in head or (
        b'"entries"' in head and b'"version"' in head
    ):
        return FR
    if name == "job.json" or b'"comm2perfetto-job"' in head:
        return JOB
    if b'"comm2perfetto-stall-verdict"' in head:
        return VERDICT
    return None


def discover(paths: Sequence[str | Path]) -> tuple[list[FoundFile], list[Skipped]]:
    """Walk the given folders (or files) recursively; classify every file by its first bytes."""
    found: list[FoundFile] = []
    skipped: list[Skipped] = []
    for root in paths:
        root = Path(root)
        if not root.exists():
            raise SourceError(f"{root}: no such file or folder; give the folder the job's dumps were written to")
        candidates = [root] if root.is_file() else _walk(root)
        for path in candidates:
            try:
                with open(path, "rb") as fh:
                    head = fh.read(HEAD_BYTES)
            except OSError as exc:
                skipped.append(Skipped(str(path), f"cannot read ({exc.strerror})"))
                continue
            if not head:
                skipped.append(Skipped(str(path), "empty file"))
                continue
            kind = classify(head, path.name)
            if kind is None:
                skipped.append(Skipped(str(path), "unknown format (not a dump, log, stacks or trace file)"))
                continue
            found.append(FoundFile(path, kind, head[:2] == b"\x1f\x8b"))
    return found, skipped


def _walk(root: Path) -> list[Path]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        out.extend(Path(dirpath) / f for f in sorted(filenames) if not f.startswith("."))
    return out


def load_sources(
    paths: Sequence[str | Path], force: bool = False, keep_entries: bool = False, with_stacks: bool = True,
    workers: int | None = None, progress: Callable[[int, int], None] | None = None, profiles_suffice: bool = False,
) -> Sources:
    """Discover and load every file; raises SourceError when nothing is usable or jobs are mixed.

    ``profiles_suffice``: profiler traces alone are usable input (``report`` works from them; ``merge`` and
    ``diagnose`` need Flight Recorder dumps or event logs).

    With ``force``, mixed jobs are loaded anyway (a note says so) instead of refused. Without
    ``with_stacks``, Flight Recorder call stacks are not read now (a quarter of the load time on big jobs):
    ``Job.stack_of`` re-reads the few a report needs. ``workers``: processes reading dumps (default: one per
    CPU up to 8 from 32 ranks on, Linux; ``COMM2PERFETTO_LOAD_WORKERS`` overrides). ``progress(done, total)``
    is called as ranks' dumps are read.
    """
    found, skipped = discover(paths)
    src = Sources(skipped=skipped)
    by_kind: dict[str, list[FoundFile]] = defaultdict(list)
    for f in found:
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
    _check_log_headers(src.logs, problems)

    for f in by_kind[STACKS]:
        try:
            doc = read_stacks(f.path)
            rank = int(doc["rank"])
        except (EventLogError, KeyError, TypeError, ValueError) as exc:
            src.skipped.append(Skipped(str(f.path), f"unreadable stall stacks ({type(exc).__name__})"))
            continue
        doc = dict(doc, _path=str(f.path))
        src.stacks.setdefault(rank, []).append(doc)
    for docs in src.stacks.values():
        docs.sort(key=lambda d: d.get("t_ns") or 0)

    for f in by_kind[JOB]:
        try:
            info = orjson.loads(f.path.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            src.skipped.append(Skipped(str(f.path), "unreadable job.json"))
            continue
        if isinstance(info, dict):
            src.job_info = dict(info, _path=str(f.path))

    kineto_worlds: dict[int, list[Path]] = defaultdict(list)
    for f in by_kind[KINETO]:
        rank, world = _kineto_rank(f)
        src.kineto.setdefault(rank, []).append(f.path)
        if world is not None:
            kineto_worlds[world].append(f.path)
    if len(kineto_worlds) > 1:
        examples = ", ".join(f"{paths[0]} (world size {w})" for w, paths in sorted(kineto_worlds.items()))
        problems.append(f"profiler traces disagree on world size: {examples}")

    _load_fr(by_kind[FR], src, problems, keep_entries, with_stacks, workers, progress)
    _check_fr_groups(src, problems)

    if problems:
        if not force:
            raise MixedJobsError(
                "these files look like more than one job: " + "; ".join(problems[:3])
                + ". Point comm2perfetto at one job's folder, or pass --force to read them together anyway"
            )
        src.notes.extend(f"--force: {p}" for p in problems)
    if not src.fr and not src.logs and not (profiles_suffice and src.kineto):
        where = ", ".join(str(p) for p in paths)
        detail = f" ({len(src.skipped)} file(s) skipped, e.g. {src.skipped[0].path}: {src.skipped[0].reason})" \
            if src.skipped else ""
        wanted = "Flight Recorder dump, comm2perfetto event log or profiler trace" if profiles_suffice \
            else "Flight Recorder dump or comm2perfetto event log"
        raise SourceError(
            f"no {wanted} found in {where}{detail}; "
            "give the folder `comm2perfetto record` wrote, or the folder of TORCH_FR_DUMP_TEMP_FILE dumps"
        )
    return src


def _check_log_headers(logs: dict[int, RankLog], problems: list[str]) -> None:
    worlds = {log.header.get("world_size") for log in logs.values()}
    if len(worlds) > 1:
        problems.append(f"event logs disagree on world size ({sorted(map(str, worlds))})")
    runs = {log.header.get("run_id") for log in logs.values() if log.header.get("run_id")}
    if len(runs) > 1:
        problems.append(f"event logs come from different runs ({', '.join(sorted(runs))})")


def _kineto_rank(f: FoundFile) -> tuple[int | None, int | None]:
    """(rank, world size) from ``distributedInfo`` near the top of the trace; the rank from the name otherwise.

    ``"distributedInfo": {"backend": "nccl", "rank": 3, "world_size": 8, ...}`` -> (3, 8)
    """
    try:
        with open(f.path, "rb") as fh:
            head = fh.read(1 << 16)
    except OSError:
        return None, None
    if f.gzipped:
        head = gunzip_head(head, 1 << 16)
    start = head.find(b'"distributedInfo"')
    if start >= 0:
        rank, world = _int_after(head, b'"rank":', start), _int_after(head, b'"world_size":', start)
        if rank is not None:
            return rank, world
    return rank_from_name(f.path.name), None


def _int_after(head: bytes, key: bytes, start: int) -> int | None:
    i = head.find(key, start)
    if i < 0:
        return None
    digits = head[i + len(key):i + len(key) + 13].split(b",")[0].strip(b" }\n")
    return int(digits) if digits.isdigit() else None


PARALLEL_MIN_RANKS = 32  # below this, starting workers costs more than it saves
MAX_WORKERS = 8


def _load_fr(
    files: list[FoundFile], src: Sources, problems: list[str], keep_entries: bool, with_stacks: bool,
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
        per_rank[rank].append(f)
    n = _worker_count(len(per_rank), workers) if not keep_entries else 1
    results = None
    if n > 1:
        try:
            results = list(_load_parallel(per_rank, n, with_stacks))
        except (OSError, RuntimeError, MemoryError, EOFError) as exc:  # no fork, a worker killed...: do it here
            src.notes.append(f"reading dumps in worker processes failed ({type(exc).__name__}); read serially")
            n = 1
    if results is None:
        results = (
            (rank,) + _load_rank(rank, per_rank[rank], src.stack_table, src.signatures, keep_entries, with_stacks)
            for rank in sorted(per_rank)
        )
    for done, (rank, trace, conflict, skipped, used_stacks) in enumerate(results, 1):
        if progress is not None:
            progress(done, len(per_rank))
        src.skipped.extend(skipped)
        if conflict:
            problems.append(conflict)
        if trace is not None:
            if n > 1:
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
    return max(1, min(os.cpu_count() or 1, MAX_WORKERS))


def _load_rank(
    rank: int, files: list[FoundFile], stack_table: StackTable, signatures: SignatureTable, keep_entries: bool,
    with_stacks: bool,
) -> tuple[FrRankTrace | None, str | None, list[Skipped], dict[int, Any]]:
    """Read and normalise one rank's dumps: (trace or None, snapshot conflict, skipped files, stacks used)."""
    skipped: list[Skipped] = []
    dumps: list[FrDump] = []
    for f in files:
        try:
            data = f.path.read_bytes()
            if f.gzipped:
                data = gzip.decompress(data)
            dumps.append(read_fr_dump(f.path, data))
        except (OSError, EOFError, zlib.error, gzip.BadGzipFile, FrFormatError) as exc:
            skipped.append(Skipped(str(f.path), str(exc).removeprefix(f"{f.path}: ")))
    if not dumps:
        return None, None, skipped, {}
    try:
        trace, conflict = build_rank_trace(rank, dumps, stack_table, signatures, keep_entries, with_stacks)
    except (AttributeError, TypeError, KeyError, IndexError, ValueError) as exc:
        skipped.extend(Skipped(str(d.path), f"malformed Flight Recorder entries ({type(exc).__name__})")
                       for d in dumps)
        return None, None, skipped, {}
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
    trace, conflict, skipped, _ = _load_rank(rank, files, stacks, signatures, False, with_stacks)
    used: dict[int, Any] = {}
    if trace is not None and with_stacks:
        for track in trace.groups.values():
            for sid in set(track.stack_ids) | {row[7] for row in track.p2p}:
                if sid is not None:
                    used[sid] = stacks.stacks[sid]
    return rank, trace, conflict, skipped, used


def _load_parallel(per_rank: dict[int, list[FoundFile]], workers: int, with_stacks: bool):
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
    sid_of: dict[int | None, int | None] = {None: None}
    for sid, stack in used_stacks.items():
        sid_of[sid] = table.intern(tuple(table.frame(f.file, f.line, f.func) for f in stack))
    intern = src.signatures.intern
    for track in trace.groups.values():
        ids = list(map(id, track.sigs))
        new = {k: intern(s) for k, s in dict(zip(ids, track.sigs)).items()}
        track.sigs = list(map(new.__getitem__, ids))
        if used_stacks:
            track.stack_ids = list(map(sid_of.__getitem__, track.stack_ids))
        if track.p2p:
            track.p2p = [row[:3] + (intern(row[3]),) + row[4:7] + (sid_of.get(row[7]),) + row[8:]
                         for row in track.p2p]


def _check_fr_groups(src: Sources, problems: list[str]) -> None:
    """Dumps of one job agree on each group's members; the default group's size is the world size."""
    seen: dict[str, tuple[tuple[int, ...], int]] = {}
    for rank, trace in src.fr.items():
        for name, cfg in trace.pg_config.items():
            if cfg.ranks is None:
                continue
            if name in seen and seen[name][0] != cfg.ranks and name == "0":
                problems.append(
                    f"rank {seen[name][1]} and rank {rank} disagree on the default group "
                    f"({len(seen[name][0])} vs {len(cfg.ranks)} ranks)"
                )
            seen.setdefault(name, (cfg.ranks, rank))
    worlds = {log.world_size for log in src.logs.values()}
    if "0" in seen and len(worlds) == 1:
        (world,) = worlds
        if len(seen["0"][0]) != world:
            problems.append(
                f"the event logs say world size {world} but the Flight Recorder dumps' default group has "
                f"{len(seen['0'][0])} ranks"
            )
