"""``comm2perfetto top DIR``: a live table of the ranks of a job recording with live windows, latest first.

It reads ``DIR/live/window.json``, the last window the job gathered (record/gather.py, docs/live.md), and shows
each rank's median step time, the share of the window it spent in communication and waited in it (exposed),
its lateness (its mean arrival after the earliest member of its most late group) and the share of that group's
collectives it arrived last at, stragglers first, then by lateness. It redraws when a new window comes
(``--once``: one table, then exit, for scripts). Unknown figures show ``-``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from comm2perfetto import layout
from comm2perfetto.cli import UserError, exit_status, write_stdout
from comm2perfetto.render.words import duration
from comm2perfetto.sources.live_window import LiveWindowError, Window, read_window

__all__ = ["add_parser", "run", "table"]


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


def _share(part: float | None, whole: float | None) -> str:
    return f"{part / whole:.0%}" if part is not None and whole else "-"


def table(window: Window, folder: str = "", now_ns: int | None = None) -> str:
    """The window as ``top`` prints it."""
    now_ns = time.time_ns() if now_ns is None else now_ns
    ended = ""
    if window.end_ns is not None:
        ended = f", ended {time.strftime('%H:%M:%S', time.localtime(window.end_ns / 1e9))} " \
                f"({duration(max(now_ns - window.end_ns, 0))} ago)"
    gathered = f", gathered by rank {window.gathered_by}" if window.gathered_by is not None else ""
    attempt = f", attempt {window.attempt}" if window.attempt else ""
    missing = f", no summary from rank{'s' if len(window.missing) > 1 else ''} " + \
        ", ".join(map(str, window.missing[:16])) if window.missing else ""
    lines = [f"{folder}  window {window.window} ({window.every_s:g} s{ended}{gathered}{attempt}): "
             f"{len(window.ranks)} of {window.world_size} ranks{missing}"]
    desc = {g.group: g.desc or f"group {g.group}" for g in window.groups}
    stragglers: dict[int, list[str]] = {}
    for rank, group, _since in window.stragglers:
        stragglers.setdefault(rank, []).append(desc.get(group, f"group {group}"))
    if stragglers:
        lines.append("stragglers: " + "; ".join(f"rank {rank} on {', '.join(groups)}"
                                                for rank, groups in sorted(stragglers.items())))
    else:
        lines.append("stragglers: none")
    # Each rank's most late group: its lateness and share of last arrivals there.
    worst: dict[int, tuple[float, float | None]] = {}
    for g in window.groups:
        for m in g.members:
            if m.mean_s is not None and (m.rank not in worst or m.mean_s > worst[m.rank][0]):
                worst[m.rank] = (m.mean_s, m.last_share)
    header = ("RANK", "HOST", "STEP", "COMM", "EXPOSED", "LATENESS", "LAST", "STRAGGLER")
    rows = []
    for r in sorted(window.ranks, key=lambda r: (r.rank not in stragglers, -worst.get(r.rank, (-1.0, None))[0],
                                                 r.rank)):
        late, last = worst.get(r.rank, (None, None))
        rows.append((str(r.rank), r.host, duration(r.step_s * 1e9) if r.step_s is not None else "-",
                     _share(r.comm_s, r.window_s), _share(r.exposed_s, r.window_s),
                     duration(late * 1e9) if late is not None else "-",
                     f"{last:.0%}" if last is not None else "-",
                     ", ".join(stragglers.get(r.rank, ())) or "-"))
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines.append("")
    for row in [header, *rows]:
        lines.append("  ".join(cell.rjust(w) if i in (0, 2, 3, 4, 5, 6) else cell.ljust(w)
                               for i, (cell, w) in enumerate(zip(row, widths))).rstrip())
    return "\n".join(lines) + "\n"
