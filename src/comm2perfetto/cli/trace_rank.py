"""``--trace-rank FILE=RANK``: the rank of a profiler trace that says neither in ``distributedInfo`` nor in its
file name; ``--sample``: the ranks with data are a sample of the job (shared by merge, diagnose and report)."""

from __future__ import annotations

import argparse

from comm2perfetto.sources.kineto.load import parse_trace_ranks


def add_trace_rank_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace-rank", action="append", metavar="FILE=RANK",
                   help="the rank of a profiler trace whose rank is neither in its distributedInfo nor in its "
                        "file name (rank3, rank-3, rank_3); repeat for several traces")


def add_sample_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sample", action="store_true",
                   help="the ranks with data are a sample of the job (e.g. the few ranks profiled): the others "
                        "are not suspects; the default for profiler traces alone")


def trace_ranks_option(args: argparse.Namespace) -> dict[str, int]:
    """``{FILE: RANK}``; a bad value raises ``OptionError``, which ``cli.main`` says in one line."""
    return parse_trace_ranks(getattr(args, "trace_rank", None))
