"""``comm2perfetto compare BASE NEW``: what changed in communication between two runs, with run-to-run noise
told apart from a change, and ``--fail-on`` to make a CI job fail on the changes it names.

Each side is what ``report`` reads (a recording folder, Flight Recorder dumps, profiler traces) or a saved
``report --format json``; compare reads only the report documents (docs/compare.md). Never imports torch.
"""

from __future__ import annotations

import argparse
import gc
import sys

from comm2perfetto.cli import UserError, exit_status
from comm2perfetto.cli.output import Renderers, emit, output_options
from comm2perfetto.cli.ranges import int_range
from comm2perfetto.cli.reading import add_attempt_option, add_trace_rank_option, reading
from comm2perfetto.compare.document import MIN_CHANGE, CompareOptions, build
from comm2perfetto.compare.gate import GateError, parse_gate
from comm2perfetto.compare.sides import load_side
from comm2perfetto.errors import writing
from comm2perfetto.load_options import COMPARE
from comm2perfetto.render.compare_csv import render_csv_stdout, write_csv
from comm2perfetto.render.compare_plot import write_html
from comm2perfetto.render.compare_text import render_text

EXAMPLE = ("comm2perfetto compare base/ new/ --steps 5-24 --fail-on 'exposed_comm>5%,busbw<-10%' "
           "--plot compare.html")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compare", help="what changed in communication between two runs, noise told apart; a CI gate",
        description="Compare two runs: per step, rank, process group, op and message size, per straggler and "
                    "module: step time, exposed communication, overlap, durations, bandwidth, arrival skew, "
                    "counts. Each change comes with a confidence interval from the runs' own samples, and a "
                    "verdict: regressed, improved, unchanged, new, gone or inconclusive. Each side is a "
                    "recording folder, Flight Recorder dumps, profiler traces, or a saved 'report --format json'.",
        epilog=f"example:\n  {EXAMPLE}\n\n"
               + exit_status("0  compared (and no --fail-on expression fired)",
                             "1  a --fail-on expression fired: the lines that tripped it are printed on stderr"),
    )
    p.add_argument("base", metavar="BASE", help="the reference run: a folder, a file, or a saved report .json")
    p.add_argument("new", metavar="NEW", help="the run to judge, read the same way")
    p.add_argument("--format", choices=("text", "json", "csv"),
                   help="output format (default: from -o's suffix .json/.csv/.txt, else text)")
    p.add_argument("-o", "--output", metavar="FILE",
                   help="write here instead of stdout (csv: FILE.lines.csv and FILE.steps.csv)")
    p.add_argument("--plot", metavar="FILE.html",
                   help="also write the two runs side by side: per-step bars and the changed lines, coloured "
                        "(one self-contained HTML file)")
    p.add_argument("--steps", metavar="A-B[:C-D]",
                   help="compare steps A-B of both runs, or A-B of BASE with C-D of NEW (paired by position); "
                        "default: every step of each run, paired by number")
    p.add_argument("--fail-on", metavar="EXPR",
                   help="exit 1 when a change passes a threshold with confidence, e.g. 'exposed_comm>5%%,"
                        "busbw<-10%%,count>0' (grammar in docs/compare.md)")
    p.add_argument("--min-change", metavar="PCT", default=f"{100 * MIN_CHANGE:g}",
                   help="the smallest change a verdict counts, in %% (points for a percentage); "
                        "default %(default)s")
    p.add_argument("--no-profiler", action="store_true", help="leave profiler (Kineto) traces out")
    add_trace_rank_option(p)
    add_attempt_option(p)
    p.add_argument("--force", action="store_true",
                   help="read files that look like they come from different jobs together anyway (within a side)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    gc.disable()  # see diagnose: many long-lived objects, no cycles to find
    out, fmt, plot = output_options(args, (".html",))
    base_steps, new_steps, by_position = parse_step_ranges(args.steps)
    min_change = parse_min_change(args.min_change)
    try:
        gate = tuple(parse_gate(args.fail_on)) if args.fail_on is not None else ()
    except GateError as exc:
        raise UserError(str(exc)) from None

    with reading(args, COMPARE) as load:
        base = load_side("BASE", args.base, base_steps, load)
    with reading(args, COMPARE) as load:
        new = load_side("NEW", args.new, new_steps, load)
    doc = build(base, new, CompareOptions(min_change=min_change, steps_by_position=by_position, gate=gate))
    if plot is not None:
        with writing(plot):
            write_html(doc, plot)
    emit(doc, fmt, out, "compare", Renderers(render_text, render_csv_stdout, write_csv))
    if plot is not None:
        print(f"comm2perfetto compare: wrote {plot}", file=sys.stderr)
    failed = doc["gate"]["failed"] if gate else []
    for failure in failed:
        lines = [doc["lines"][i] for i in failure["lines"]]
        print(f"comm2perfetto compare: --fail-on {failure['expression']!r} fired on {len(lines)} line"
              f"{'s' if len(lines) != 1 else ''}: " + "; ".join(_line_name(line) for line in lines[:5])
              + (" ..." if len(lines) > 5 else ""), file=sys.stderr)
    return 1 if failed else 0


def parse_step_ranges(text: str | None) -> tuple[tuple[int, int] | None, tuple[int, int] | None, bool]:
    """``5-24`` -> both sides 5-24, paired by number; ``5-24:10-29`` -> BASE 5-24 and NEW 10-29, by position."""
    if text is None:
        return None, None, False
    parts = text.split(":")
    ranges = [int_range(p.strip()) for p in parts]
    if len(parts) > 2 or any(r is None for r in ranges):
        raise UserError(f"--steps {text!r}: expected A-B (both runs) or A-B:C-D (BASE's, then NEW's), "
                        "with 0 <= A <= B, e.g. 5-24 or 5-24:10-29")
    if len(ranges) == 1:
        return ranges[0], ranges[0], False
    return ranges[0], ranges[1], True


def parse_min_change(text: str) -> float:
    """``10`` or ``10%`` -> 0.10."""
    try:
        value = float(text.strip().removesuffix("%"))
    except ValueError:
        value = -1.0
    if not 0 <= value < 1000:
        raise UserError(f"--min-change {text!r}: expected a percentage from 0, e.g. 10 or 10%")
    return value / 100


def _line_name(line: dict) -> str:
    from comm2perfetto.render.compare_text import change_text, metric_text, what_text

    return f"{what_text(line)} {metric_text(line)} {change_text(line)} ({line['verdict']})"
