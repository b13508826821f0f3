"""The options of every command that reads a job (merge, diagnose, report, compact): ``--attempt N``, ``--jobs N``
(how many processes read the ranks' files) and ``--force``."""

from __future__ import annotations

import argparse

from comm2perfetto.cli import UserError
from comm2perfetto.cli.attempts import add_attempt_option


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
