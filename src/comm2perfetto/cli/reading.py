"""The options of the commands that read a job (diagnose, merge, report, compare, compact) and what they make of
them: ``--attempt N``, ``--jobs N`` (how many processes read the ranks' files), ``--force``, ``--trace-rank
FILE=RANK`` (the rank of a profiler trace that says neither in ``distributedInfo`` nor in its file name),
``--sample`` (the ranks with data are a sample of the job); ``reading`` turns them, with a product's preset
(``load_options.DIAGNOSE`` ...), into the ``LoadOptions`` to load with, progress shown.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

from comm2perfetto.cli import UserError
from comm2perfetto.cli.progress import Progress
from comm2perfetto.load_options import LoadOptions, Traces
from comm2perfetto.sources.kineto.load import parse_trace_ranks

__all__ = ["add_attempt_option", "add_reading_options", "add_sample_option", "add_trace_rank_option", "reading"]

MATCHING = "matching collectives across ranks"


def _attempt_number(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not an attempt number (0, 1, ...)")
    return int(text)


def add_attempt_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--attempt", type=_attempt_number, metavar="N",
                   help="of a job torchrun restarted (--max-restarts), read attempt N (counted from 0, as "
                        "TORCHELASTIC_RESTART_COUNT; attempt N >= 1 is the folder attemptN); default: the last, "
                        "with a note on how the others ended")


def add_reading_options(p: argparse.ArgumentParser) -> None:
    """``--attempt``, ``--jobs`` and ``--force``."""
    add_attempt_option(p)
    p.add_argument("--jobs", "-j", type=int, metavar="N",
                   help="processes reading the ranks' dumps and traces (default: every core, from 32 ranks on; "
                        "1 reads in this process)")
    p.add_argument("--force", action="store_true",
                   help="read files that look like they come from different jobs together anyway")


def add_trace_rank_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace-rank", action="append", metavar="FILE=RANK",
                   help="the rank of a profiler trace whose rank is neither in its distributedInfo nor in its "
                        "file name (rank3, rank-3, rank_3); repeat for several traces")


def add_sample_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sample", action="store_true",
                   help="the ranks with data are a sample of the job (e.g. the few ranks profiled): the others "
                        "are not suspects; the default for profiler traces alone")


@contextmanager
def reading(args: argparse.Namespace, preset: LoadOptions, dumps: str = "reading dumps (ranks)",
            matching: bool = True) -> Iterator[LoadOptions]:
    """``preset`` with what the command's options change (``--force``, ``--attempt``, ``--jobs``, ``--trace-rank``,
    ``--sample``, ``--no-profiler``), and progress on stderr while it loads: ``dumps`` counted as the ranks'
    dumps are read, the profiler traces where workers read them (``Traces.COLLECTIVES`` with profiles), then
    the matching (``matching``) until the block ends. A bad ``--jobs`` or ``--trace-rank`` raises at once."""
    traces = Traces.NONE if getattr(args, "no_profiler", False) else preset.traces
    counted = traces == Traces.COLLECTIVES and preset.profiles
    progress = Progress(dumps, then=MATCHING if matching and not counted else None)
    trace_progress = Progress("reading profiler traces (ranks)", then=MATCHING if matching else None) \
        if counted else None
    try:
        yield replace(preset, traces=traces, force=args.force, attempt=args.attempt, workers=_jobs(args),
                      trace_ranks=parse_trace_ranks(getattr(args, "trace_rank", None)),
                      sample=getattr(args, "sample", False), progress=progress, trace_progress=trace_progress)
    finally:
        progress.finish()
        if trace_progress is not None:
            trace_progress.finish()


def _jobs(args: argparse.Namespace) -> int | None:
    """The ``--jobs`` given (None: the default)."""
    n = getattr(args, "jobs", None)
    if n is not None and n < 1:
        raise UserError(f"--jobs {n}: give 1 or more")
    return n
