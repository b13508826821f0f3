"""``comm2perfetto report DIR``: how much of each step is communication, how much of it hides behind compute,
which collectives are slow, who everyone waits for, and which module sends what.

Reads what ``merge`` reads; profiler traces alone are enough (``torch.profiler`` traces of a GPU job give
HTA's overlap numbers). Output: text (default), JSON (the contract in docs/report.md) or CSV, to stdout or
``-o FILE``; ``--plot`` draws per-rank bars and a lateness heat map. Never imports torch.
"""

from __future__ import annotations

import argparse
import gc
import sys
from dataclasses import replace

from comm2perfetto.cli import UserError, exit_status
from comm2perfetto.cli.output import Renderers, emit, output_options
from comm2perfetto.cli.progress import Phase
from comm2perfetto.cli.ranges import int_range
from comm2perfetto.cli.reading import add_reading_options, add_sample_option, add_trace_rank_option, reading
from comm2perfetto.errors import writing
from comm2perfetto.load_options import REPORT
from comm2perfetto.match import load_job
from comm2perfetto.render.report_csv import render_csv_stdout, write_csv
from comm2perfetto.render.report_plot import SUFFIXES as PLOT_SUFFIXES
from comm2perfetto.render.report_plot import write_plot
from comm2perfetto.render.report_text import render_text
from comm2perfetto.report.document import ReportOptions, build

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report", help="comm/compute ratio, overlap, bandwidth, stragglers and collectives per module",
        description="Report, per rank, per step and for the job: compute, communication, overlapped and exposed "
                    "communication, idle time; per collective type and process group: counts, bytes, "
                    "durations, algorithm and bus bandwidth; stragglers; collectives per nn.Module. Reads a "
                    "`comm2perfetto record` folder, Flight Recorder dumps, or torch.profiler traces alone.",
        epilog="example:\n  comm2perfetto report run1 --steps 5-8 --plot run1.html\n\n"
               + exit_status("0  report written"),
    )
    p.add_argument("paths", nargs="+", metavar="DIR", help="folder(s) or file(s) a job left behind")
    p.add_argument("--format", choices=("text", "json", "csv"),
                   help="output format (default: from -o's suffix .json/.csv/.txt, else text)")
    p.add_argument("-o", "--output", metavar="FILE",
                   help="write here instead of stdout (csv: FILE.ranks.csv, FILE.collectives.csv ...)")
    p.add_argument("--plot", metavar="FILE",
                   help="also draw per-rank bars and a lateness heat map: .html (self-contained, no extra "
                        "packages), .png or .svg (need matplotlib: pip install 'comm2perfetto[plot]')")
    p.add_argument("--steps", metavar="A-B", help="only steps A to B (inclusive), e.g. 10-20 or 5")
    p.add_argument("--depth", type=int, metavar="N", help="module tree depth: paths cut to N components")
    p.add_argument("--no-profiler", action="store_true", help="leave profiler (Kineto) traces out")
    p.add_argument("--hta-rounding", action="store_true",
                   help="round profiler events inward to whole microseconds first, as HTA does by default, so "
                        "that overlap equals HTA's get_comm_comp_overlap (default: the nanoseconds Kineto "
                        "writes; HTA's rounding lowers overlap by about half a point)")
    p.add_argument("--hta-scope", action="store_true",
                   help="count what HTA's get_comm_comp_overlap counts by default, to compare with HTA: kernels "
                        "launched inside a ProfilerStep other than the last, NCCL/RCCL kernels as communication "
                        "(not symmetric memory, NVSHMEM ...), times rounded as --hta-rounding does")
    add_trace_rank_option(p)
    add_sample_option(p)
    add_reading_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    gc.disable()  # see diagnose: many long-lived objects, no cycles to find
    out, fmt, plot = output_options(args, PLOT_SUFFIXES)
    steps = parse_steps(args.steps) if args.steps else None
    if args.depth is not None and args.depth < 1:
        raise UserError(f"--depth {args.depth}: give 1 or more")

    with reading(args, replace(REPORT, hta_rounding=args.hta_rounding, hta_scope=args.hta_scope)) as load:
        job = load_job(args.paths, load)
    with Phase("analysing overlap, bandwidth and stragglers"):
        doc = build(job, ReportOptions(steps=steps, depth=args.depth))
    if plot is not None:
        with writing(plot):
            write_plot(doc, plot)
    emit(doc, fmt, out, "report", Renderers(render_text, render_csv_stdout, write_csv))
    if plot is not None:
        print(f"comm2perfetto report: wrote {plot}", file=sys.stderr)
    return 0


def parse_steps(text: str) -> tuple[int, int]:
    """``10-20`` -> (10, 20); ``5`` -> (5, 5)."""
    steps = int_range(text)
    if steps is None:
        raise UserError(f"--steps {text!r}: expected A-B or A with 0 <= A <= B, e.g. 10-20")
    return steps
