"""``comm2perfetto merge DIR [-o job.pftrace]``: every rank's dumps and logs in one Perfetto trace.

Reads what ``diagnose`` reads (Flight Recorder dumps, recorder logs, stall stacks) plus profiler traces,
aligns the ranks' clocks, and writes one trace: a process per rank, a track per process group, compute
tracks, a flow across the ranks of every collective, and diagnose's findings marked where they happened.
The closing summary goes to stdout, progress to stderr. Never imports torch.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from dataclasses import replace
from pathlib import Path

from comm2perfetto.cli import UserError, check_writable, exit_status, write_stdout
from comm2perfetto.cli.progress import Phase, Progress
from comm2perfetto.cli.ranges import parse_ranks, parse_window
from comm2perfetto.cli.reading import add_reading_options, add_sample_option, add_trace_rank_option, reading
from comm2perfetto.diagnose.attempts import attempts_text
from comm2perfetto.diagnose.diagnosis import diagnose
from comm2perfetto.diagnose.findings import Diagnosis
from comm2perfetto.diagnose.other_attempts import with_attempts
from comm2perfetto.job import Job
from comm2perfetto.load_options import MERGE
from comm2perfetto.match import load_job
from comm2perfetto.sources.discover import require_paths
from comm2perfetto.trace.formats import format_for
from comm2perfetto.trace.write import RankChoice, TraceOptions, TraceResult, Window, brief, write_trace
from comm2perfetto.words import clock_text, duration, ranks_text, size

__all__ = ["add_parser", "run"]

def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "merge", help="merge every rank's dumps and logs into one Perfetto trace",
        description="Merge every rank's Flight Recorder dumps, comm2perfetto event logs, stall stacks and "
                    "profiler traces under the given folders into ONE trace: a process per rank, a track per "
                    "process group, compute tracks, each collective linked across ranks, and where the job "
                    "stalled. Open the result at https://ui.perfetto.dev.",
        epilog="example:\n  comm2perfetto merge run1 --preview run1.png     writes run1.pftrace and run1.png\n\n"
               + exit_status("0  trace written (also when the job had problems: the summary names them)"),
    )
    p.add_argument("paths", nargs="+", metavar="DIR", help="folder(s) or file(s) a job left behind")
    p.add_argument("-o", "--output", metavar="OUT",
                   help="the trace to write: .pftrace (Perfetto protobuf) or .json / .json.gz (Chrome JSON); "
                        "default: DIR.pftrace, next to the (one) folder given")
    p.add_argument("--ranks", metavar="LIST", help="only these ranks, e.g. 0-7,12")
    p.add_argument("--window", metavar="START:END",
                   help="only events overlapping this time window, relative to the job's first event: "
                        "10:20 (seconds), 1500ms:2s, :30, 12.5:")
    p.add_argument("--no-align", action="store_true",
                   help="keep each rank's own clock instead of aligning every rank to rank 0's")
    p.add_argument("--all-ranks", action="store_true",
                   help="keep every rank of a job above 256 ranks (default: ranks findings name plus a sample)")
    p.add_argument("--preview", metavar="FILE.png", help="also draw a compact PNG picture of the job")
    p.add_argument("--no-profiler", action="store_true", help="leave profiler (Kineto) traces out")
    p.add_argument("--lean", action="store_true",
                   help="draw profiler events without their args (grid, block, Input Dims ...), External and "
                        "correlation ids and launch-to-kernel flows: a smaller trace (a fifth to two fifths "
                        "smaller on public GPU traces)")
    add_trace_rank_option(p)
    add_sample_option(p)
    add_reading_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    gc.disable()  # see diagnose: millions of long-lived objects, no cycles to find
    options = _trace_options(args)
    with reading(args, replace(MERGE, align=not args.no_align, profiles=options.preview is not None)) as load:
        job = load_job(args.paths, load)
    with Phase("diagnosing"):
        diagnosis = with_attempts(diagnose(job, now_ns=time.time_ns()), job)
    progress = Progress("writing the trace (ranks)")
    try:
        result = write_trace(job, diagnosis, options._replace(progress=progress))
    finally:
        progress.finish()
    if result.preview_skipped is not None:
        print(f"comm2perfetto merge: {result.preview_skipped}", file=sys.stderr)
    write_stdout(summary_text(options, job, diagnosis, result))
    return 0


def _trace_options(args: argparse.Namespace) -> TraceOptions:
    """The trace asked for, checked before the (long) loading."""
    out = Path(args.output) if args.output else default_output(args.paths)
    if out.is_dir():
        raise UserError(f"-o {out}: that is a folder; name the trace file, e.g. -o {out / 'job.pftrace'}")
    format_for(out)
    check_writable(out)
    preview = Path(args.preview) if args.preview else None
    if preview is not None:
        if preview.suffix.lower() != ".png":
            raise UserError(f"--preview writes a PNG: name it FILE.png, not {preview.name!r}")
        check_writable(preview)
    try:
        ranks = RankChoice(args.ranks, frozenset(parse_ranks(args.ranks))) if args.ranks else None
    except ValueError as exc:
        raise UserError(f"--ranks: {exc}") from None
    try:
        window = Window(args.window, *parse_window(args.window)) if args.window else None
    except ValueError as exc:
        raise UserError(f"--window {exc}") from None
    return TraceOptions(out, ranks, window, args.all_ranks, preview, args.lean)


def default_output(paths: list[str]) -> Path:
    """``run1/`` -> ``run1.pftrace`` next to it, as perf and nsys name their output without being asked."""
    require_paths(paths)
    folder = Path(paths[0])
    if len(paths) > 1 or not folder.is_dir():
        raise UserError("name the trace with -o when merging files or several folders (one folder DIR "
                        "defaults to DIR.pftrace)")
    if folder.name in ("", ".", ".."):
        folder = folder.resolve()
    return folder.with_name(folder.name + ".pftrace")


_NO_FINDINGS = {
    "ok": "every collective matched on all ranks",
    "interrupted": "the job was interrupted; no communication problem before that",
    "running": "the job is still running; nothing wrong so far",
}


def summary_text(options: TraceOptions, job: Job, diagnosis: Diagnosis, result: TraceResult) -> str:
    """The closing lines: what was written, of which ranks and collectives, the clock, the findings."""
    summary, stats, out = result.summary, result.stats, options.output
    span = (summary.t_end_ns - summary.t_begin_ns) if summary.t_begin_ns is not None and \
        summary.t_end_ns is not None else 0
    sampled = f" (a sample: {job.sampled} of {ranks_text(job.ranks_with_data)})" if job.sampled else ""
    in_window = f" ({result.in_window:,} in the window)" if result.in_window is not None else ""
    lines = [
        (f"wrote {out} ({size(stats.bytes)}; {stats.slices:,} slices, {stats.instants:,} instants, "
         f"{stats.flows:,} flows; {stats.bytes / max(stats.slices, 1):.1f} bytes per slice)"),
        (f"  ranks: {len(summary.ranks)} of {summary.total_ranks}{sampled}; collectives: {summary.collectives:,}"
         f"{in_window}; p2p transfers: {summary.p2p:,}; time span: {duration(span)}"),
        "  " + clock_text(job.clock.method, job.clock.residual_skew_ns, job.clock.samples),
    ]
    if diagnosis.findings:
        lines.append(f"  findings ({diagnosis.status}): " + "; ".join(map(brief, diagnosis.findings[:4]))
                     + (" ..." if len(diagnosis.findings) > 4 else "") + "  (comm2perfetto diagnose for details)")
    else:
        ok = _NO_FINDINGS[diagnosis.status]
        lines.append(f"  findings: none ({ok.replace('all ranks', 'the ranks sampled') if job.sampled else ok})")
    attempts = attempts_text(diagnosis.attempt, diagnosis.other_attempts, "this trace")
    if attempts is not None:
        lines.append(f"  attempts: {attempts}")
    for note in summary.notes[:5]:
        lines.append(f"  note: {note}")
    if job.skipped:
        lines.append(f"  skipped {len(job.skipped)} file(s) (comm2perfetto diagnose lists them)")
    if options.preview is not None and options.preview.exists():
        lines.append(f"  preview: {options.preview}")
    lines.append(f"open it: comm2perfetto open {out}   (or https://ui.perfetto.dev -> Open trace file)")
    return "\n".join(lines) + "\n"
