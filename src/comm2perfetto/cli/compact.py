"""``comm2perfetto compact DIR -o OUT``: the map step, run where the dumps are.

Reads every rank's Flight Recorder dumps under DIR (in worker processes, as diagnose does) and writes each
rank's compact columns (``rank<R>.fr-columns``, see ``sources/fr/compact.py``) into OUT, with the job's other
files (recorder logs, stall stacks, profiler traces, job files) copied as they are. Run it on every node of a
job whose dumps sit on the nodes' local disks, gather the OUT folders (49 bytes an entry: a third of the
benchmark's pickles, whose entries share their frames) on one machine, and give them to diagnose, merge or
report as they would be given the dumps. Never imports torch.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from comm2perfetto.cli import UserError, exit_status
from comm2perfetto.cli.reading import add_reading_options, reading
from comm2perfetto.load_options import LoadOptions, Traces
from comm2perfetto.sources.discover import EVENT_LOG, JOB, KINETO, STACKS, discover
from comm2perfetto.sources.fr.compact import file_name, write_fr_columns
from comm2perfetto.sources.read import load_sources
from comm2perfetto.words import size

__all__ = ["add_parser", "run"]

_COPIED = (EVENT_LOG, STACKS, KINETO, JOB)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compact", help="write each rank's Flight Recorder data as compact columns (run it where the dumps are)",
        description="Read the Flight Recorder dumps under the given folders (this node's ranks) and write each "
                    "rank's compact columns into OUT, with the recorder logs, stall stacks, profiler traces and "
                    "job files copied beside them. diagnose, merge and report read OUT as they read the dumps: "
                    "gather every node's OUT on one machine instead of the pickles.",
        epilog="example (one per node, then on one machine):\n"
               "  comm2perfetto compact /local/run1 -o /shared/run1/$(hostname)\n"
               "  comm2perfetto diagnose /shared/run1\n\n"
               + exit_status("0  every rank's columns written"),
    )
    p.add_argument("paths", nargs="+", metavar="DIR", help="folder(s) or file(s) of this node's ranks")
    p.add_argument("-o", "--output", metavar="OUT", required=True, help="the folder to write (created)")
    add_reading_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    out = Path(args.output)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"-o {out}: give a new or empty folder")
    with reading(args, LoadOptions(traces=Traces.LISTED), matching=False) as load:
        src = load_sources(args.paths, load)
    try:
        out.mkdir(parents=True, exist_ok=True)
        written = sum(write_fr_columns(out / file_name(rank), trace, src.stack_table)
                      for rank, trace in sorted(src.fr.items()))
        copied = _copy_others(args.paths, out, src.attempt)
    except OSError as exc:
        raise UserError(f"cannot write into {out}: {exc.strerror or exc}") from None
    read = sum(Path(f).stat().st_size for trace in src.fr.values() for f in trace.files if Path(f).exists())
    print(f"wrote {out}: {len(src.fr)} rank(s) of Flight Recorder columns ({size(written)}, from {size(read)} of "
          f"dumps), {copied} other file(s) copied")
    for s in src.skipped:
        print(f"  skipped {s.path}: {s.reason}", file=sys.stderr)
    return 0


def _copy_others(paths: list[str], out: Path, attempt: int) -> int:
    """Copy the job's files other than dumps (of the attempt read) into ``out``, under their own names."""
    found, _ = discover(paths)
    copied = 0
    for f in found:
        if f.kind not in _COPIED or (f.kind != JOB and f.attempt != attempt):
            continue
        target = out / f.path.name
        if target.exists():  # two nodes' job.json: keep both
            target = out / f"{f.path.parent.name}-{f.path.name}"
        shutil.copy2(f.path, target)
        copied += 1
    return copied
