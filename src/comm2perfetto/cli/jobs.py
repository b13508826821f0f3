"""The options of every command that reads a job (merge, diagnose, report, compact): ``--attempt N``, ``--jobs N``
(how many processes read the ranks' files) and ``--force``; and ``load_options``, a product's preset with what
the command line changes."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import replace

from comm2perfetto.cli import UserError
from comm2perfetto.cli.attempts import add_attempt_option
from comm2perfetto.cli.trace_rank import trace_ranks_option
from comm2perfetto.load_options import LoadOptions, Traces


def add_reading_options(p: argparse.ArgumentParser) -> None:
    """``--attempt``, ``--jobs`` and ``--force``."""
    add_attempt_option(p)
    p.add_argument("--jobs", "-j", type=int, metavar="N",
                   help="processes reading the ranks' dumps and traces (default: every core, from 32 ranks on; "
                        "1 reads in this process)")
    p.add_argument("--force", action="store_true",
                   help="read files that look like they come from different jobs together anyway")


def jobs_option(args: argparse.Namespace) -> int | None:
    """The ``--jobs`` given (None: the default)."""
    n = getattr(args, "jobs", None)
    if n is not None and n < 1:
        raise UserError(f"--jobs {n}: give 1 or more")
    return n


def load_options(args: argparse.Namespace, preset: LoadOptions,
                 progress: Callable[[int, int], None] | None = None,
                 trace_progress: Callable[[int, int], None] | None = None) -> LoadOptions:
    """``preset`` (``load_options.DIAGNOSE`` ...) with what the command's options change: ``--force``,
    ``--attempt``, ``--jobs``, ``--trace-rank``, ``--sample``, ``--no-profiler``; and the progress shown."""
    return replace(preset, force=args.force, attempt=args.attempt, workers=jobs_option(args),
                   trace_ranks=trace_ranks_option(args), sample=getattr(args, "sample", False),
                   traces=Traces.NONE if getattr(args, "no_profiler", False) else preset.traces,
                   progress=progress, trace_progress=trace_progress)
