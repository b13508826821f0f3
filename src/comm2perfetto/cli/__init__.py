"""The ``comm2perfetto`` command: the only place that parses arguments, prints and picks exit codes.

Each subcommand lives in its own module here and exposes ``add_parser(subparsers)``, which registers the
subcommand and sets ``func`` to a ``run(args) -> int`` function. Exit codes: 0 success, 1 a problem was found
in the job (diagnose) or the recorded job failed (record), 2 usage or input error.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from comm2perfetto import __version__

USAGE_ERROR = 2


class UserError(Exception):
    """An error the user can fix: printed as one line, exit status 2, never a traceback."""


def build_parser() -> argparse.ArgumentParser:
    from comm2perfetto.cli import demo, diagnose, merge, record, report

    parser = argparse.ArgumentParser(
        prog="comm2perfetto",
        description="Record, diagnose and visualise PyTorch distributed communication across every rank.",
    )
    parser.add_argument("--version", action="version", version=f"comm2perfetto {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for module in (record, merge, diagnose, report, demo):
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except UserError as exc:
        print(f"comm2perfetto {args.command}: error: {exc}", file=sys.stderr)
        return USAGE_ERROR
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
