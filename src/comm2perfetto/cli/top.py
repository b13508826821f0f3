"""``comm2perfetto top DIR``: a live table of the ranks of a job recording with live windows.

It reads ``DIR/live/window.json``, the last window the job gathered (record/gather.py, docs/live.md), and shows
it as render/window_text.py lays it out, again at each new window (``--once``: one table, then exit, for
scripts).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from comm2perfetto import layout
from comm2perfetto.cli import UserError, exit_status, write_stdout
from comm2perfetto.render.window_text import table
from comm2perfetto.sources.live_window import LiveWindowError, read_window

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "top", help="live table of a recording job's ranks: step time, communication, lateness, stragglers",
        description="Show the last window a job recording with live windows (record --live-every, on by "
                    "default) gathered: per rank its step time, communication, exposed communication, lateness "
                    "and share of last arrivals, stragglers first. Redraws at each new window.",
        epilog="example:\n  comm2perfetto top run1\n  comm2perfetto top run1 --once\n\n"
               + exit_status("0    shown (or stopped with Ctrl-C)"),
    )
    p.add_argument("folder", metavar="DIR", help="the folder the job records into (record -o DIR)")
    p.add_argument("--once", action="store_true", help="print the last window's table once and exit")
    p.add_argument("--interval", type=float, default=1.0, metavar="SECONDS",
                   help="how often to look for a new window (default 1)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    path = Path(args.folder) / layout.LIVE_WINDOW_FILE
    if not Path(args.folder).is_dir():
        raise UserError(f"{args.folder} is not a folder")
    if args.interval <= 0:
        raise UserError("--interval must be positive")
    if args.once:
        if not path.exists():
            raise UserError(f"no window gathered in {path.parent} yet: is the job recording (record -o "
                            f"{args.folder}), with live windows on (--live-every, not off)?")
        write_stdout(table(read_window(path), args.folder))
        return 0
    clear = sys.stdout.isatty()
    seen = None
    waiting = False
    try:
        while True:
            try:
                st = os.stat(path)
            except OSError:
                if not waiting:
                    write_stdout(f"waiting for the first window in {path.parent} ...\n")
                    waiting = True
                time.sleep(args.interval)
                continue
            if (st.st_mtime_ns, st.st_size) != seen:
                seen = (st.st_mtime_ns, st.st_size)
                try:
                    text = table(read_window(path), args.folder)
                except LiveWindowError as exc:
                    text = f"{exc}\n"
                write_stdout(("\x1b[H\x1b[2J" if clear else "\n") + text)
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return 0
