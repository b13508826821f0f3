"""trace's entry point: ``write_trace(job, diagnosis, options)`` writes one trace file of a loaded job (what
``merge`` does) and, when asked, its PNG preview. Never imports torch. (Its records are named tuples: a
dataclass costs merge's start-up a millisecond each.)

The job is laid out once: diagnose's findings planned into markers (``markers``), the ranks shown chosen
(``timeline.select_ranks``), the job's time span taken (the origin of ``--window`` and the trace's wall-clock
anchor); then ``timeline.write_timeline`` writes through the writer the output's suffix names (``formats``).
The file is written under a temporary name and renamed when complete, so an interrupted merge (Ctrl-C,
SIGTERM, SIGHUP) leaves nothing behind, and one killed outright (SIGKILL, the OOM killer) leaves a
``.NAME.PID.partial`` file that the next merge to the same name removes.
"""

from __future__ import annotations

import glob
import os
import re
import signal
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from comm2perfetto.diagnose.findings import Diagnosis, Finding
from comm2perfetto.errors import OptionError, writing
from comm2perfetto.job import Job
from comm2perfetto.load_options import Traces
from comm2perfetto.report.classes import job_classes
from comm2perfetto.sources.kineto.load import trace_span
from comm2perfetto.trace.formats import open_writer
from comm2perfetto.trace.markers import plan_markers
from comm2perfetto.trace.sink import WriteStats
from comm2perfetto.trace.timeline import TimelineSummary, select_ranks, write_timeline
from comm2perfetto.words import duration, rank_list, ranks_text, sample_text

__all__ = ["RankChoice", "TraceOptions", "TraceResult", "Window", "brief", "write_trace"]


class RankChoice(NamedTuple):
    """The ranks asked for (``--ranks 0-7,12``), and the option as given, for the message when none is in the job."""

    text: str
    ranks: frozenset[int]


class Window(NamedTuple):
    """Only what overlaps ``start_ns`` to ``end_ns`` after the job's first event (``--window 10:20``, ``text``)."""

    text: str
    start_ns: int
    end_ns: int


class TraceOptions(NamedTuple):
    """What ``write_trace`` writes: the trace ``output`` (its suffix picks the format), of the ranks ``ranks``
    (default: every rank up to ``timeline.SAMPLE_LIMIT``, or all with ``all_ranks``), in ``window``; a PNG
    ``preview``; ``lean``: profiler events without their args, ids and launch flows. ``progress(done, total)``
    follows the ranks written."""

    output: Path
    ranks: RankChoice | None = None
    window: Window | None = None
    all_ranks: bool = False
    preview: Path | None = None
    lean: bool = False
    progress: Callable[[int, int], None] | None = None


class TraceResult(NamedTuple):
    """What was written: the trace's ``summary`` and the writer's ``stats``; the window on the job's clock and how
    many collectives overlap it; why the preview asked for was not drawn (None: it was, or none was asked for)."""

    summary: TimelineSummary
    stats: WriteStats
    window_ns: tuple[int, int] | None
    in_window: int | None
    preview_skipped: str | None


def write_trace(job: Job, diagnosis: Diagnosis, options: TraceOptions) -> TraceResult:
    """Write ``job`` and its ``diagnosis`` (marked where the findings happened) as ``options`` say. Raises
    ``OptionError`` for ranks or a window the job does not have, ``OutputError`` when a file cannot be written."""
    out = options.output
    markers = plan_markers(job, diagnosis)
    selection = select_ranks(job, markers, requested=set(options.ranks.ranks) if options.ranks else None,
                             all_ranks=options.all_ranks)
    if not selection.ranks:
        assert options.ranks is not None  # the default selection holds every rank of the job
        raise OptionError(f"--ranks {options.ranks.text}: none of these ranks is in the job "
                          f"(ranks with data: {rank_list(job.ranks)})")
    collectives = job.collectives_span()
    start, end = job_span(job, collectives)
    window = None
    if options.window is not None:
        if start is None or end is None:
            raise OptionError("--window: the job has no timed events to measure the window from")
        if options.window.start_ns > end - start:
            raise OptionError(f"--window {options.window.text}: the job's events end {duration(end - start)} after "
                              "its first one; nothing falls in this window")
        window = (start + options.window.start_ns, start + options.window.end_ns)

    _remove_stale_partials(out)
    temp = out.with_name(f".{out.name}.{os.getpid()}.partial")
    with writing(out):
        sink = open_writer(out, write_to=temp, realtime_anchor_ns=start)
    # SIGTERM/SIGHUP (a job scheduler's kill, a closed terminal) end the write like Ctrl-C, so the finally
    # below removes the partial file; one left by a SIGKILL is removed by the next merge to the same name.
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    classes = job_classes(job, job.profiles, selection.ranks) if options.preview is not None else None
    try:
        with writing(out):
            summary = write_timeline(job, diagnosis, markers, sink, selection, window=window,
                                     kineto=job.options.traces != Traces.NONE, preview=options.preview is not None,
                                     progress=options.progress, classes=classes, kineto_detail=not options.lean,
                                     job_end=collectives[1])
            stats = sink.close()
            os.replace(temp, out)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if temp.exists():
            temp.unlink()
    skipped = None
    if options.preview is not None:
        skipped = _draw_preview(options.preview, summary, diagnosis, selection.note)
    return TraceResult(summary, stats, window, _in_window(job, window) if window is not None else None, skipped)


def job_span(job: Job, collectives: tuple[int | None, int | None]) -> tuple[int | None, int | None]:
    """The earliest timed event (the origin of --window and the trace's wall-clock anchor) and the latest:
    ``collectives`` (``Job.collectives_span``) widened by the profiler traces and the recorder logs."""
    first, last = collectives
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


def brief(f: Finding) -> str:
    """A finding in a few words: ``missing_ranks all_reduce (default_pg seq 4)``, or its kind alone."""
    return f"{f.kind} {f.op or ''} ({f.process_group} seq {f.seq})" if f.seq is not None else f.kind


def _draw_preview(path: Path, summary: TimelineSummary, diagnosis: Diagnosis, note: str | None) -> str | None:
    """Draw the preview; why not, when the trace has no timed events."""
    from comm2perfetto.trace.preview import render_preview
    from comm2perfetto.trace.preview_frame import preview_frame

    if summary.t_begin_ns is None or summary.t_end_ns is None or summary.t_end_ns <= summary.t_begin_ns:
        return f"no timed events to draw; {path} not written"
    notes = [f"diagnose: {diagnosis.status}"] + [brief(f) for f in diagnosis.findings[:3]]
    if diagnosis.sampled:
        notes.append(sample_text(diagnosis.sampled, diagnosis.ranks_with_data, diagnosis.world_size))
    if note:
        notes.append(note)
    frame = preview_frame(summary.preview, summary.t_begin_ns, summary.t_end_ns)
    if frame.note:
        notes.append(frame.note)
    with writing(path):
        render_preview(path, summary.preview, frame.t0, frame.t1,
                       title=f"comm2perfetto: {ranks_text(summary.ranks)}", notes=notes)
    return None


def _in_window(job: Job, window: tuple[int, int]) -> int:
    """How many of the job's collectives overlap the window."""
    lo, hi = window
    inside = 0
    for c in job.iter_collectives():
        times = [t for t in c.arrive_ns + c.end_ns if t is not None]
        inside += bool(times) and min(times) <= hi and max(times) >= lo
    return inside


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
