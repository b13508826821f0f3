"""``comm2perfetto diagnose DIR...``: which collective is stuck or desynced, and which rank is to blame.

Exit status (``findings.STATUS_EXIT``): 0 ``ok``, ``interrupted`` or ``running`` (nothing wrong found; a stall
the job got over is reported and still 0, unless ``--fail-on late``), 1 ``stuck``, ``desync``, ``crashed`` or
``incomplete``, 2 usage or input error, 3 internal error (see ``cli.main``). ``--format json`` prints the
contract other tools read (see docs/diagnose.md)::

    {"status": "stuck", "world_size": 4, "ranks_with_data": [0, 1, 2, 3],
     "findings": [{"kind": "missing_ranks", "process_group": "default_pg", "seq": 4, "op": "all_reduce",
                   "ranks_joined": [0, 1, 3], "ranks_missing": [2], "culprit_ranks": [2], "detail": "...",
                   "call_sites": {"0": "train.py:57"}, "stacks": {"2": ["data.py:88 next_batch"]}}]}

Never imports torch.
"""

from __future__ import annotations

import argparse
import gc
import io
import sys
import time
from pathlib import Path

import orjson

from comm2perfetto.cli import UserError, check_writable, exit_status, write_stdout
from comm2perfetto.cli.progress import Phase
from comm2perfetto.cli.reading import add_reading_options, add_sample_option, add_trace_rank_option, reading
from comm2perfetto.diagnose.diagnosis import diagnose
from comm2perfetto.diagnose.findings import STATUS_EXIT, Diagnosis
from comm2perfetto.diagnose.other_attempts import with_attempts
from comm2perfetto.errors import writing
from comm2perfetto.load_options import DIAGNOSE
from comm2perfetto.match import load_job
from comm2perfetto.render.diagnosis_text import render_text

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "diagnose", help="name the stuck or mismatched collective and the rank to blame",
        description="Read every Flight Recorder dump, comm2perfetto event log and stall stack under the given "
                    "folders (any file names, pickle or JSON, any Flight Recorder version, NCCL or gloo), "
                    "match the collectives across ranks and say, per process group, the first one that did not "
                    "complete on every rank and why.",
        epilog="example:\n  comm2perfetto diagnose run1 --format json -o verdict.json\n\n"
               + exit_status("0  ok, interrupted or still running with nothing wrong so far (a stall the job got "
                             "over is reported, still 0)",
                             "1  a problem was found: stuck, desync, crashed or incomplete; with --fail-on late, "
                             "also a stall the job got over"),
    )
    p.add_argument("paths", nargs="+", metavar="DIR", help="folder(s) or file(s) a job left behind")
    p.add_argument("--format", choices=("text", "json"),
                   help="output format (default: json when -o ends in .json, else text)")
    p.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout")
    p.add_argument("--pg", metavar="NAME", help="only this process group (its name, e.g. 0, or description)")
    p.add_argument("--fail-on", choices=("late",), action="append", default=[],
                   help="late: exit 1 also when the job got over a stall (a rank came late, status still ok), "
                        "for a CI gate that must catch slow ranks")
    add_trace_rank_option(p)
    add_sample_option(p)
    add_reading_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # A loaded job is millions of objects that all live until the command ends and form no cycles: a cyclic
    # GC pass over them costs seconds at 1024 ranks and frees nothing. Off for this short-lived command.
    gc.disable()
    fmt = args.format or ("json" if args.output and args.output.lower().endswith(".json") else "text")
    if args.output:
        check_writable(Path(args.output))
    with reading(args, DIAGNOSE, "reading Flight Recorder dumps (ranks)") as load:
        job = load_job(args.paths, load)
    if args.pg is not None and not any(args.pg in (g.name, g.desc, g.uid) for g in job.groups.values()):
        names = ", ".join(sorted({g.label for g in job.groups.values()})) or "none"
        raise UserError(f"no process group named {args.pg!r} in these dumps (groups: {names})")
    with Phase("diagnosing"):
        result = with_attempts(diagnose(job, pg=args.pg, now_ns=time.time_ns()), job)
    if fmt == "json":
        text = orjson.dumps(result.to_json(), option=orjson.OPT_INDENT_2).decode() + "\n"
    else:
        buf = io.StringIO()
        render_text(result, buf)
        text = buf.getvalue()
    if args.output:
        with writing(args.output):
            Path(args.output).write_text(text)
        print(f"comm2perfetto diagnose: {result.status}; wrote {args.output}", file=sys.stderr)
        return _exit_status(result, args.fail_on)
    write_stdout(text)  # `diagnose DIR | head`: the verdict is still the exit status
    return _exit_status(result, args.fail_on)


def _exit_status(result: Diagnosis, fail_on: list[str]) -> int:
    """The status's exit status; 1 for a resolved stall under ``--fail-on late``."""
    if "late" in fail_on and any(f.resolved for f in result.findings):
        return max(1, STATUS_EXIT[result.status])
    return STATUS_EXIT[result.status]
