"""``comm2perfetto merge DIR [-o job.pftrace]``: every rank's dumps and logs in one Perfetto trace.

Reads what ``diagnose`` reads (Flight Recorder dumps, recorder logs, stall stacks) plus profiler traces,
aligns the ranks' clocks, and writes one trace: a process per rank, a track per process group, compute
tracks, a flow across the ranks of every collective, and diagnose's findings marked where they happened.
The closing summary goes to stdout, progress to stderr. Never imports torch.
"""

from __future__ import annotations

import argparse
import gc
import glob
import os
import re
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path

from comm2perfetto.cli import UserError, check_writable, exit_status, write_stdout
from comm2perfetto.cli.attempts import with_attempts
from comm2perfetto.cli.jobs import add_reading_options, load_options
from comm2perfetto.cli.progress import Phase, Progress
from comm2perfetto.cli.ranges import parse_ranks
from comm2perfetto.cli.trace_rank import add_sample_option, add_trace_rank_option
from comm2perfetto.diagnose.attempts import attempts_text
from comm2perfetto.diagnose.diagnosis import diagnose
from comm2perfetto.diagnose.findings import Diagnosis, Finding
from comm2perfetto.load_options import MERGE
from comm2perfetto.match import load_job
from comm2perfetto.model import Job
from comm2perfetto.render.words import clock_text, duration, rank_list, ranks_text, sample_text, size
from comm2perfetto.report.classes import job_classes
from comm2perfetto.sources.discover import require_paths
from comm2perfetto.sources.kineto.load import trace_span
from comm2perfetto.trace.formats import format_for, open_writer
from comm2perfetto.trace.markers import plan_markers
from comm2perfetto.trace.sink import WriteStats
from comm2perfetto.trace.timeline import TimelineSummary, select_ranks, write_timeline

__all__ = ["add_parser", "run"]

_UNITS = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000, "": 1_000_000_000}


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
        requested = parse_ranks(args.ranks) if args.ranks else None
    except ValueError as exc:
        raise UserError(f"--ranks: {exc}") from None
    window_rel = _parse_window(args.window) if args.window else None

    progress = Progress("reading dumps (ranks)", then="matching collectives across ranks")
    try:
        load = replace(load_options(args, MERGE, progress), align=not args.no_align, profiles=preview is not None)
        job = load_job(args.paths, load)
    finally:
        progress.finish()
    with Phase("diagnosing"):
        diagnosis = with_attempts(diagnose(job, now_ns=time.time_ns()), job)
        markers = plan_markers(job, diagnosis)
        selection = select_ranks(job, markers, requested=requested, all_ranks=args.all_ranks)
    if not selection.ranks:
        raise UserError(f"--ranks {args.ranks}: none of these ranks is in the job "
                        f"(ranks with data: {rank_list(job.ranks)})")
    start, end = _job_span(job)
    window = None
    if window_rel is not None:
        if start is None or end is None:
            raise UserError("--window: the job has no timed events to measure the window from")
        if window_rel[0] > end - start:
            raise UserError(f"--window {args.window}: the job's events end {duration(end - start)} after its first "
                            "one; nothing falls in this window")
        window = (start + window_rel[0], start + window_rel[1])

    _remove_stale_partials(out)
    temp = out.with_name(f".{out.name}.{os.getpid()}.partial")
    try:
        sink = open_writer(out, write_to=temp, realtime_anchor_ns=start)
    except OSError as exc:
        raise UserError(f"cannot write {out}: {exc.strerror or exc}") from None
    progress = Progress("writing the trace (ranks)")
    # SIGTERM/SIGHUP (a job scheduler's kill, a closed terminal) end the write like Ctrl-C, so the finally
    # below removes the partial file; one left by a SIGKILL is removed by the next merge to the same name.
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    classes = job_classes(job, job.profiles, selection.ranks) if preview is not None else None
    try:
        summary = write_timeline(job, diagnosis, sink, selection, window=window, kineto=not args.no_profiler,
                                 preview=preview is not None, progress=progress, classes=classes,
                                 kineto_detail=not args.lean)
        stats = sink.close()
        os.replace(temp, out)
    except OSError as exc:
        raise UserError(f"cannot write {out}: {exc.strerror or exc}") from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        progress.finish()
        if temp.exists():
            temp.unlink()
    if preview is not None:
        _draw_preview(preview, summary, diagnosis, selection.note)
    _print_summary(out, job, diagnosis, summary, stats, preview, window)
    return 0


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



def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


_PARTIAL = re.compile(r"\.(\d+)\.partial$")


def _remove_stale_partials(out: Path) -> None:
    """Remove ``.NAME.PID.partial`` files next to ``out`` whose merge process is gone (killed with SIGKILL,
    or by the OOM killer: nothing runs in the process then)."""
    for path in out.parent.glob(f".{glob.escape(out.name)}.*.partial"):
        m = _PARTIAL.search(path.name)
        if m is None or _alive(int(m.group(1))):
            continue
        try:
            path.unlink()
        except OSError:
            pass  # another merge removed it, or the folder is not ours to clean


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # someone else's process, or not a pid: leave the file alone
    return True


def _parse_window(text: str) -> tuple[int, int]:
    """``10:20`` -> (10 s, 20 s) in ns; either side may be empty; units ns, us, ms, s (default s)."""
    if ":" not in text:
        raise UserError(f"--window {text!r}: expected START:END, e.g. 10:20 or 1500ms:2s")
    lo_text, hi_text = text.split(":", 1)
    lo = _parse_time(lo_text, text) if lo_text.strip() else 0
    hi = _parse_time(hi_text, text) if hi_text.strip() else 2**62
    if hi <= lo:
        raise UserError(f"--window {text!r}: the end must come after the start")
    return lo, hi


def _parse_time(part: str, whole: str) -> int:
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(ns|us|ms|s)?\s*", part)
    if m is None:
        raise UserError(f"--window {whole!r}: cannot read {part!r} as a time (e.g. 12.5, 300ms, 2s)")
    return int(float(m.group(1)) * _UNITS[m.group(2) or ""])


def _job_span(job: Job) -> tuple[int | None, int | None]:
    """The earliest timed event (the origin of --window and the trace's wall-clock anchor) and the latest."""
    first, last = job.collectives_span()
    firsts = [first] if first is not None else []
    lasts = [last] if last is not None else []
    for traces in job.traces.values():  # profiled steps may lie long before the first collective kept
        for span in filter(None, map(trace_span, traces)):
            firsts.append(span[0])
            lasts.append(span[1])
    for log in job.logs.values():
        firsts += [call.t_call_ns for call in log.calls[:1]]
        firsts += [r.t_begin_ns for r in log.ranges[:1]]
        firsts += [t for _, t, _ in log.steps[:1]]
        lasts += [call.t_return_ns or call.t_call_ns for call in log.calls[-1:]]
        lasts += [r.t_end_ns for r in log.ranges if r.t_end_ns is not None]
        lasts += [t for _, t, _ in log.steps[-1:]]
    return (min(firsts) if firsts else None), (max(firsts + lasts) if firsts else None)


def _draw_preview(path: Path, summary: TimelineSummary, diagnosis: Diagnosis, note: str | None) -> None:
    from comm2perfetto.trace.preview import render_preview

    if summary.t_begin_ns is None or summary.t_end_ns is None or summary.t_end_ns <= summary.t_begin_ns:
        print(f"comm2perfetto merge: no timed events to draw; {path} not written", file=sys.stderr)
        return
    notes = [f"diagnose: {diagnosis.status}"] + [_brief(f) for f in diagnosis.findings[:3]]
    if diagnosis.sampled:
        notes.append(sample_text(diagnosis.sampled, diagnosis.ranks_with_data, diagnosis.world_size))
    if note:
        notes.append(note)
    try:
        render_preview(path, summary.preview, summary.t_begin_ns, summary.t_end_ns,
                       title=f"comm2perfetto: {ranks_text(summary.ranks)}", notes=notes)
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror or exc}") from None


_NO_FINDINGS = {
    "ok": "every collective matched on all ranks",
    "interrupted": "the job was interrupted; no communication problem before that",
    "running": "the job is still running; nothing wrong so far",
}


def _print_summary(out: Path, job: Job, diagnosis: Diagnosis, summary: TimelineSummary, stats: WriteStats,
                   preview: Path | None, window: tuple[int, int] | None) -> None:
    span = (summary.t_end_ns - summary.t_begin_ns) if summary.t_begin_ns is not None and \
        summary.t_end_ns is not None else 0
    sampled = f" (a sample: {job.sampled} of {ranks_text(job.ranks_with_data)})" if job.sampled else ""
    lines = [
        (f"wrote {out} ({size(stats.bytes)}; {stats.slices:,} slices, {stats.instants:,} instants, "
         f"{stats.flows:,} flows; {stats.bytes / max(stats.slices, 1):.1f} bytes per slice)"),
        (f"  ranks: {len(summary.ranks)} of {summary.total_ranks}{sampled}; collectives: {summary.collectives:,}"
         f"{_in_window(job, window)}; p2p transfers: {summary.p2p:,}; time span: {duration(span)}"),
        "  " + clock_text(job.clock.method, job.clock.residual_skew_ns, job.clock.samples),
    ]
    if diagnosis.findings:
        lines.append(f"  findings ({diagnosis.status}): " + "; ".join(map(_brief, diagnosis.findings[:4]))
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
    if preview is not None and preview.exists():
        lines.append(f"  preview: {preview}")
    lines.append(f"open it: comm2perfetto open {out}   (or https://ui.perfetto.dev -> Open trace file)")
    write_stdout("\n".join(lines) + "\n")


def _brief(f: Finding) -> str:
    """A finding in a few words: ``missing_ranks all_reduce (default_pg seq 4)``, or its kind alone."""
    return f"{f.kind} {f.op or ''} ({f.process_group} seq {f.seq})" if f.seq is not None else f.kind


def _in_window(job: Job, window: tuple[int, int] | None) -> str:
    """`` (12 in the window)``: how many of the job's collectives overlap --window."""
    if window is None:
        return ""
    lo, hi = window
    inside = 0
    for c in job.iter_collectives():
        times = [t for t in c.arrive_ns + c.end_ns if t is not None]
        inside += bool(times) and min(times) <= hi and max(times) >= lo
    return f" ({inside:,} in the window)"
