"""The ``comm2perfetto`` command: the only place that parses arguments, prints and picks exit codes.

Each subcommand (``record``, ``merge``, ``diagnose``, ``report``, ``compare``, ``compact``, ``open``, ``top``,
``demo``) lives in its own module here and exposes ``add_parser(subparsers)``, which registers the subcommand and sets
``func`` to a ``run(args) -> int`` function; ``main`` imports only the module of the command run. A command
that reads a job loads it with its product's preset (``load_options``, through ``reading.py``), calls the
product's entry point (``diagnose.diagnosis.diagnose``, ``trace.write.write_trace``, ``report.document.build``,
``compare.document.build``), prints what it returns and picks the exit status. ``live.py`` is record's live
verdict; ``reading.py``, ``output.py``, ``progress.py`` and ``ranges.py`` are what several commands share.

Exit codes: 0 success, 1 a problem was found in the job (diagnose), record's the job's own, 2 usage or input
error: any ``comm2perfetto.errors.Comm2PerfettoError`` (``UserError`` here, the readers' errors), printed by
``main`` as one line, 3 an internal error (a bug of comm2perfetto, never a verdict about the job): one line
asking to report it, the traceback only with ``COMM2PERFETTO_TRACEBACK=1``. Each subcommand's --help lists its
own (``exit_status``).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from comm2perfetto import __version__
from comm2perfetto.errors import Comm2PerfettoError

__all__ = ["COMMANDS", "INTERNAL_ERROR", "USAGE_ERROR", "HelpFormatter", "UserError", "build_parser",
           "check_writable", "exit_status", "main", "require_torch"]

USAGE_ERROR = 2
INTERNAL_ERROR = 3


class UserError(Comm2PerfettoError):
    """An error of the command line the user can fix (an option, an output that cannot be written): printed as
    one line, exit status 2, never a traceback."""


COMMANDS = ("record", "merge", "diagnose", "report", "compare", "compact", "open", "top", "demo")

EXAMPLES = """\
examples:
  comm2perfetto demo                    record, merge, report and diagnose a small 2-rank job on CPU
  comm2perfetto record -o run1 -- torchrun --nproc-per-node 4 train.py
  comm2perfetto diagnose run1           which collective is stuck or desynced, and which rank is to blame
  comm2perfetto merge run1              one Perfetto trace of every rank: run1.pftrace
  comm2perfetto open run1.pftrace       load it in ui.perfetto.dev, served from this machine
  comm2perfetto report run1 --plot run1.html
  comm2perfetto compare run1 run2 --fail-on 'exposed_comm>5%'   what changed, beyond noise; exit 1 if that did
  comm2perfetto compact run1 -o run1.c   each rank's dumps as compact columns (run it where the dumps are)
  comm2perfetto top run1                while it records: each rank's step time, communication, lateness

Each command's --help lists its options and exit statuses (2 is always a usage or input error)."""


def exit_status(*codes: str) -> str:
    """The epilog every subcommand's --help ends with: its own exit statuses, then the shared ones.
    ``exit_status("0  trace written")``."""
    return "\n".join(["exit status:", *(f"  {c}" for c in codes),
                      f"  {USAGE_ERROR}  usage or input error (one line on stderr)",
                      f"  {INTERNAL_ERROR}  internal error: a bug of comm2perfetto (one line asking to report it)"])


class HelpFormatter(argparse.HelpFormatter):
    """Reflows a paragraph as argparse does but keeps indented lines as written (examples, exit statuses)."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        fill = super()._fill_text
        return "\n".join(line if line.startswith(" ") or not line else fill(line, width, indent)
                         for line in text.splitlines())


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


def write_stdout(text: str) -> None:
    """Write a command's output to stdout. A reader that left early (``merge DIR | head -1``) is not an error:
    the work is done, and the exit status still says how it went."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        sys.stdout = None  # keeps the interpreter's final flush quiet


def require_torch(command: str) -> None:
    """record and demo run PyTorch jobs; the readers never import torch, so it is an extra, not a dependency."""
    if importlib.util.find_spec("torch") is None:
        raise UserError(f"torch is not installed in this Python ({sys.executable}), and {command} runs a PyTorch "
                        "job: pip install 'comm2perfetto[record]' (or your own torch build)")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line, or with ``only`` one subcommand: each subcommand's module imports what its
    ``run`` needs, and a command should not pay for the others' imports (a tenth of a second)."""
    parser = argparse.ArgumentParser(
        prog="comm2perfetto", formatter_class=HelpFormatter, epilog=EXAMPLES,
        description="Record, diagnose and visualise PyTorch distributed communication across every rank. "
                    "Only record and demo need torch; diagnose, merge and report read a job's files anywhere.",
    )
    parser.add_argument("--version", action="version", version=f"comm2perfetto {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMANDS:
        if only is None or name == only:
            importlib.import_module(f"comm2perfetto.cli.{name}").add_parser(sub)
    for subparser in sub.choices.values():
        subparser.formatter_class = HelpFormatter
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = argv[0] if argv and argv[0] in COMMANDS else None
    args = build_parser(command).parse_args(argv)
    try:
        return int(args.func(args))
    except Comm2PerfettoError as exc:  # UserError and every reader's error about the input: one line, never a traceback
        print(f"comm2perfetto {args.command}: error: {exc}", file=sys.stderr)
        return USAGE_ERROR
    except KeyboardInterrupt:
        return 130
    except MemoryError:
        print(f"comm2perfetto {args.command}: internal error: ran out of memory; the inputs should have been "
              "refused before that: please report this bug with the command you ran", file=sys.stderr)
        return INTERNAL_ERROR
    except Exception as exc:
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
