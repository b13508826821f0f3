"""``--jobs N``: how many processes read the ranks' files (shared by merge, diagnose, report and compact)."""

from __future__ import annotations

import argparse

from comm2perfetto.cli import UserError


def add_jobs_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--jobs", "-j", type=int, metavar="N",
                   help="processes reading the ranks' dumps and traces (default: every core, from 32 ranks on; "
                        "1 reads in this process)")


def jobs_option(args: argparse.Namespace) -> int | None:
    """The ``--jobs`` given (None: the default)."""
    n = getattr(args, "jobs", None)
    if n is not None and n < 1:
        raise UserError(f"--jobs {n}: give 1 or more")
    return n
