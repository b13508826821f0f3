"""The ``comm2perfetto`` command: the only place that parses arguments, prints and picks exit codes.

Each subcommand lives in its own module here and exposes ``add_parser(subparsers)``, which registers the
subcommand and sets ``func`` to a ``run(args) -> int`` function. Exit codes: 0 success, 1 a problem was found
in the job (diagnose) or the recorded job failed (record), 2 usage or input error, 3 an internal error (a bug
of comm2perfetto, never a verdict about the job): one line asking to report it, the traceback only with
``COMM2PERFETTO_TRACEBACK=1``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from comm2perfetto import __version__

USAGE_ERROR = 2
INTERNAL_ERROR = 3


class UserError(Exception):
    """An error the user can fix: printed as one line, exit status 2, never a traceback."""


COMMANDS = ("record", "merge", "diagnose", "report", "demo")


def check_writable(path: Path) -> None:
    """Fail before the (long) loading when the output cannot be written."""
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise UserError(f"cannot write {path}: it is a folder")
    if parent.exists() and not parent.is_dir():
        raise UserError(f"cannot write {path}: {parent} is not a folder")
    if not parent.is_dir():
        raise UserError(f"cannot write {path}: folder {parent} does not exist")
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise UserError(f"cannot write {path}: permission denied")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line, or with ``only`` one subcommand: each subcommand's module imports what its
    ``run`` needs, and a command should not pay for the others' imports (a tenth of a second)."""
    parser = argparse.ArgumentParser(
        prog="comm2perfetto",
        description="Record, diagnose and visualise PyTorch distributed communication across every rank.",
    )
    parser.add_argument("--version", action="version", version=f"comm2perfetto {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMANDS:
        if only is None or name == only:
            importlib.import_module(f"comm2perfetto.cli.{name}").add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = argv[0] if argv and argv[0] in COMMANDS else None
    args = build_parser(command).parse_args(argv)
    try:
        return int(args.func(args))
    except UserError as exc:
        print(f"comm2perfetto {args.command}: error: {exc}", file=sys.stderr)
        return USAGE_ERROR
    except KeyboardInterrupt:
        return 130
    except MemoryError:
        print(f"comm2perfetto {args.command}: internal error: ran out of memory; the inputs should have been "
              "refused before that: please report this bug with the command you ran", file=sys.stderr)
        return INTERNAL_ERROR
    except Exception as exc:  # noqa: BLE001 - a bug: one line, a distinct status, never "problem found"
        if os.environ.get("COMM2PERFETTO_TRACEBACK") == "1":
            import traceback

            traceback.print_exc()
        where = _innermost_frame(exc)
        print(f"comm2perfetto {args.command}: internal error ({type(exc).__name__}: {str(exc)[:200]} at {where}); "
              "this is a bug: please report it with this line and the command you ran "
              "(COMM2PERFETTO_TRACEBACK=1 prints the traceback)", file=sys.stderr)
        return INTERNAL_ERROR


def _innermost_frame(exc: BaseException) -> str:
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return "?"
    return f"{Path(tb.tb_frame.f_code.co_filename).name}:{tb.tb_lineno}"


if __name__ == "__main__":
    sys.exit(main())
