"""Find everything a job left behind, recognising each file by its content (``sources.read`` reads what is
found, ``sources.checks`` checks it is one job). Never imports torch.

Files are told apart by their first bytes, never by their names (which vary: ``nccl_trace_rank_5``,
``comm_lib_trace_rank_5``, ``rank5.pkl``, ``rank5.fr.3.pkl``, names with hosts in them)::

    \\x80\\x02...                                   pickle        -> Flight Recorder dump
    {"version": "2.10", "pg_config": ..., "entries"  JSON          -> Flight Recorder dump (_dump_fr_trace_json)
    {"kind": "header", "format": "comm2perfetto-events"...          -> recorder event log
    {"format": "comm2perfetto-stacks"...                            -> stall stacks
    {"schemaVersion": 1, "traceEvents": [...]       JSON or gzip  -> Kineto trace
    job.json                                                        -> the recorder's job summary
    {"format": "comm2perfetto-stall-verdict"...                     -> record's live verdict (not read)

A folder named ``attempt<k>`` below a path given holds attempt k of a job torchrun restarted (the files
above any such folder are attempt 0; see ``layout.attempt_dir``). One attempt is read at a time, the last
by default (``pick_attempt``): its files, and the job files, which describe the whole run.

Only regular files are opened; an unreadable, empty or unknown file is skipped and listed.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from comm2perfetto import layout
from comm2perfetto.errors import Comm2PerfettoError
from comm2perfetto.model import Skipped
from comm2perfetto.sources.event_log import is_event_log
from comm2perfetto.sources.fr.columns import COLUMNS_MAGIC
from comm2perfetto.sources.kineto.reader import gunzip_head, sniff_kineto
from comm2perfetto.sources.limits import regular_file_problem
from comm2perfetto.sources.safe_pickle import looks_like_pickle

__all__ = ["ATTEMPT_KINDS", "EVENT_LOG", "FR", "FR_COLUMNS", "JOB", "KINETO", "STACKS", "VERDICT", "FoundFile",
           "SourceError", "classify", "discover", "find_files", "pick_attempt", "require_paths"]

HEAD_BYTES = 8192

FR, EVENT_LOG, STACKS, KINETO, JOB = "fr", "event_log", "stacks", "kineto", "job"
FR_COLUMNS = "fr_columns"  # a rank's Flight Recorder data in compact columns (``comm2perfetto compact``)
VERDICT = "verdict"  # record's live stall verdict (stall_watch.py): an output, not evidence; read by no command


class SourceError(Comm2PerfettoError):
    """Input the user must fix (wrong path, nothing usable, mixed jobs): one clear message."""


@dataclass(frozen=True, slots=True)
class FoundFile:
    path: Path
    kind: str
    gzipped: bool = False
    attempt: int = 0  # torchrun's attempt: from an ``attempt<k>`` folder below the path given, else 0


def classify(head: bytes, name: str) -> str | None:
    """Which kind of file these first bytes start, or None when unknown."""
    if looks_like_pickle(head):
        return FR
    if head.startswith(COLUMNS_MAGIC):
        return FR_COLUMNS
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
    found, skipped = find_files(paths)
    return found, [s for s, _attempt in skipped]


def require_paths(paths: Sequence[str | Path]) -> None:
    """SourceError naming the first of ``paths`` that does not exist (every command says it the same way)."""
    for root in paths:
        if not Path(root).exists():
            raise SourceError(f"{root}: no such file or folder; give the folder the job's dumps were written to")


def find_files(paths: Sequence[str | Path]) -> tuple[list[FoundFile], list[tuple[Skipped, int]]]:
    """``discover``, with the attempt of each file skipped (what ``read.load_sources`` reads from)."""
    found: list[FoundFile] = []
    skipped: list[tuple[Skipped, int]] = []
    seen: set[Path] = set()  # `diagnose run1 run1/` or a folder and a file in it: each file is read once
    require_paths(paths)
    for root in paths:
        root = Path(root)
        candidates = [root] if root.is_file() else _walk(root)
        for path in candidates:
            attempt = _attempt_below(root, path)
            problem = regular_file_problem(path)
            if problem is not None:
                skipped.append((Skipped(str(path), problem), attempt))
                continue
            real = path.resolve()
            if real in seen:
                continue
            seen.add(real)
            try:
                with open(path, "rb") as fh:
                    head = fh.read(HEAD_BYTES)
            except OSError as exc:
                skipped.append((Skipped(str(path), f"cannot read ({exc.strerror})"), attempt))
                continue
            if not head:
                skipped.append((Skipped(str(path), "empty file"), attempt))
                continue
            kind = classify(head, path.name)
            if kind is None:
                skipped.append((Skipped(str(path), "unknown format (not a dump, log, stacks or trace file)"),
                                attempt))
                continue
            found.append(FoundFile(path, kind, head[:2] == b"\x1f\x8b", attempt))
    return found, skipped


def _attempt_below(root: Path, path: Path) -> int:
    """The attempt the innermost ``attempt<k>`` folder between ``root`` and ``path`` names, else 0. The
    root's own name does not count: a recording folder the user named ``attempt3`` is no attempt."""
    try:
        parts = path.parent.relative_to(root).parts
    except ValueError:  # root is the file itself
        return 0
    for name in reversed(parts):
        attempt = layout.attempt_of_folder(name)
        if attempt is not None:
            return attempt
    return 0


# What torchrun's restart makes anew in each attempt; job files describe the whole run.
ATTEMPT_KINDS = (FR, FR_COLUMNS, EVENT_LOG, STACKS, KINETO)


def pick_attempt(found: list[FoundFile], attempt: int | None,
                  paths: Sequence[str | Path]) -> tuple[int, tuple[int, ...]]:
    """(the attempt to read, every attempt found): ``attempt``, or the last one by default."""
    attempts = tuple(sorted({f.attempt for f in found if f.kind in ATTEMPT_KINDS})) or (0,)
    if attempt is None:
        return attempts[-1], attempts
    if attempt not in attempts:
        where = ", ".join(str(p) for p in paths)
        raise SourceError(f"--attempt {attempt}: {where} holds no files of attempt {attempt} (attempts found: "
                          f"{', '.join(map(str, attempts))}; torchrun's attempt k >= 1 is the folder attempt<k>)")
    return attempt, attempts


def _walk(root: Path) -> list[Path]:
    out: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        live = os.path.basename(dirpath) == layout.WINDOWS_DIR  # the live windows' outputs: not read here
        out.extend(Path(dirpath) / f for f in sorted(filenames) if not f.startswith(".")
                   and not (live and f.removesuffix(".tmp") in layout.WINDOWS_OUTPUTS))
    return out
