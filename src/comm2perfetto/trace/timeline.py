"""Lay a loaded job out as one timeline and write it to a ``TraceSink``. Never imports torch.

What goes where (processes top-down, tracks in this order inside each)::

    job                     findings (stalls, mismatches, missing ranks) · collectives in flight (counter)
    rank 0 (host, pid)      steps
                            <group>            one slice per collective or p2p op; more lanes if they overlap
                            python calls (THREAD)     every torch.distributed call, call -> return
                            ranges (THREAD)           NVTX and comm2perfetto.range() ranges
                            cpu ops (thread T)        torch.profiler CPU ops of the training threads
                            GPU <stream>              kernels: compute, communication or memory
                            recorder                  stalls seen, Flight Recorder dumps, warnings, marks
    rank 1 ...

A flow links the slices of one collective across its ranks (and a send to its recv). This module lays out the
job: which ranks are shown, the job process, the flows; each rank's process is written by a
``rank_writer.RankWriter``, one rank after another, so memory holds one rank's events at a time besides the job
itself. What every rank's slices share (args, call sites, flows) is built once, in ``shared_args``.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from operator import itemgetter

from comm2perfetto.diagnose.attempts import attempts_text
from comm2perfetto.diagnose.findings import Diagnosis
from comm2perfetto.job import Job
from comm2perfetto.model import Collective, known_values
from comm2perfetto.report.classes import RankClasses
from comm2perfetto.trace.markers import Markers
from comm2perfetto.trace.preview import PreviewRow
from comm2perfetto.trace.rank_writer import RankWriter, everything
from comm2perfetto.trace.shared_args import Flow, GroupTable, SiteCache, rank_at
from comm2perfetto.trace.sink import TraceSink
from comm2perfetto.words import duration

SAMPLE_LIMIT = 256  # above this many ranks, the default trace keeps implicated ranks plus a sample


@dataclass(frozen=True, slots=True)
class Selection:
    """The ranks drawn. ``note`` says why some are left out, for the summary and the trace."""

    ranks: tuple[int, ...]
    total: int
    note: str | None = None


def select_ranks(job: Job, markers: Markers, requested: set[int] | None = None, all_ranks: bool = False,
                 limit: int = SAMPLE_LIMIT) -> Selection:
    """``requested`` ranks, or every rank up to ``limit``; past it, implicated ranks plus an even sample. Ranks
    without data are drawn (they are what a finding may name), except those a sample left out (Job.sampled)."""
    have = set(job.ranks) | (set() if job.sampled else {r for g in job.groups.values() for r in g.ranks})
    total = job.world_size or len(have) if job.sampled else len(have)
    if requested is not None:
        return Selection(tuple(sorted(requested & have)), total,
                         f"showing {len(requested & have)} of {total} ranks (--ranks)")
    if all_ranks or total <= limit:
        return Selection(tuple(sorted(have)), total)
    keep = markers.implicated_ranks & have
    if len(keep) > limit:  # a finding naming thousands (ranks that left no data): those with data come first
        named = sorted(keep, key=lambda r: (r not in job.ranks, r))
        keep = set(named[:max(limit, len(job.ranks))])
    others = sorted(have - keep)
    room = max(limit - len(keep), 0)
    if room:
        step = len(others) / room  # evenly spread, so every node of the job shows up
        keep.update(others[int(i * step)] for i in range(room))
    note = (f"showing {len(keep)} of {total} ranks: the ranks findings name plus an even sample; "
            "--all-ranks keeps every rank")
    return Selection(tuple(sorted(keep)), total, note)


@dataclass(slots=True)
class TimelineSummary:
    ranks: tuple[int, ...]
    total_ranks: int
    collectives: int
    p2p: int
    t_begin_ns: int | None
    t_end_ns: int | None
    notes: list[str] = field(default_factory=list)
    preview: list[PreviewRow] = field(default_factory=list)


def write_timeline(job: Job, diagnosis: Diagnosis, markers: Markers, sink: TraceSink, selection: Selection,
                   window: tuple[int, int] | None = None, kineto: bool = True, preview: bool = False,
                   progress: Callable[[int, int], None] | None = None,
                   classes: Mapping[int, RankClasses] | None = None, kineto_detail: bool = True,
                   job_end: int | None = None) -> TimelineSummary:
    """Write the whole job to ``sink`` (not closed here), its ``diagnosis`` marked as ``markers`` (planned from it:
    ``markers.plan_markers``) say. ``window`` keeps events overlapping [start, end]. ``preview``: also lay out
    ``summary.preview``, each rank's ``classes`` (``report.classes.job_classes``: what ``report`` measures) and
    diagnose's stalls and missing ranks. ``kineto_detail=False`` (merge --lean): profiler events without their
    args, ids and launch flows. ``job_end``: the last time of the job's collectives (``Job.collectives_span``),
    where a finding that has no time of its own is marked."""
    shown = set(selection.ranks)
    inside = _window_test(window)
    flows = _collective_flows(job, shown, inside)
    # p2p flow ids follow the collectives' (1 .. their count), and each rank's own flows (from a collective's
    # CPU enqueue to its GPU work) follow those
    flow_ids = itertools.count(sum(map(len, flows.values())) + 1).__next__
    p2p_flows = _p2p_flows(job, shown, inside, flow_ids)
    uuid = itertools.count(2).__next__  # track uuids (0 is the Perfetto writer's root track)
    summary = TimelineSummary(ranks=selection.ranks, total_ranks=selection.total,
                              collectives=sum(len(c) for c in job.collectives.values()),
                              p2p=sum(len(t) for t in job.p2p.values()), t_begin_ns=None, t_end_ns=None)
    if selection.note:
        summary.notes.append(selection.note)

    job_pid = uuid()
    sink.process(job_pid, pid=1, name="job", description=_job_description(job, diagnosis, selection),
                 sort_index=0)
    _write_job_tracks(job, diagnosis, sink, uuid, job_pid, inside or everything, job_end)
    sites = SiteCache(job)
    tables: dict[str, GroupTable] = {}  # per group, built for the first rank that needs it
    for n, rank in enumerate(selection.ranks, 1):
        writer = RankWriter(job, rank, markers, flows, p2p_flows, sites, tables, inside, kineto, preview, flow_ids,
                            kineto_detail)
        span = writer.write(sink, uuid)
        if span is not None:
            lo, hi = span
            summary.t_begin_ns = lo if summary.t_begin_ns is None else min(summary.t_begin_ns, lo)
            summary.t_end_ns = hi if summary.t_end_ns is None else max(summary.t_end_ns, hi)
        summary.notes.extend(writer.notes)
        if preview:
            summary.preview.append(writer.preview_row())
        if progress is not None:
            progress(n, len(selection.ranks))
    if preview and summary.t_begin_ns is not None and summary.t_end_ns is not None:
        window_ns = (summary.t_begin_ns, summary.t_end_ns)
        summary.preview = [_preview_row(row, (classes or {}).get(rank), window_ns)
                           for rank, row in zip(selection.ranks, summary.preview)]
    return summary


def _preview_row(row: PreviewRow, classes: RankClasses | None, window: tuple[int, int]) -> PreviewRow:
    """A rank's row of the preview: its classes (no data all along without any), then diagnose's marks."""
    spans: list[tuple[int, int, str]] = []
    if classes is not None:
        for kind, union in (("compute", classes.compute), ("comm", classes.comm), ("memory", classes.memory)):
            spans += [(b, e, kind) for b, e in union]
        spans += [(t, t, "comm") for t in classes.instants]
        spans += [(b, e, "nodata") for b, e in classes.no_data(*window)]
    else:
        spans.append((*window, "nodata"))
    return PreviewRow(row.label, spans + list(row.spans), row.marks)


# --- what the job process shows ----------------------------------------------------------------------------


def _job_description(job: Job, diagnosis: Diagnosis, selection: Selection) -> str:
    parts = [f"world size {job.world_size}" if job.world_size else "world size unknown",
             f"diagnose: {diagnosis.status}"]
    if job.clock.residual_skew_ns is not None:
        parts.append(f"residual clock skew {duration(job.clock.residual_skew_ns)}")
    attempts = attempts_text(diagnosis.attempt, diagnosis.other_attempts, "this trace")
    if attempts is not None:
        parts.append(attempts)
    if selection.note:
        parts.append(selection.note)
    return "; ".join(parts)


def _write_job_tracks(job: Job, diagnosis: Diagnosis, sink: TraceSink, uuid: Callable[[], int], pid: int,
                      inside: Callable[[int, int], bool], job_end: int | None) -> None:
    findings = uuid()
    sink.track(findings, parent=pid, name="findings", sort_index=0)
    for f in diagnosis.findings:
        t = f.t_ns if f.t_ns is not None else job_end
        if t is None:
            continue
        what = f" {f.op} ({f.process_group} seq {f.seq})" if f.seq is not None else ""
        sink.instant(findings, t, f"{f.kind}{what}" + (" (resolved)" if f.resolved else ""), {
            "detail": f.detail, "action": f.action, "culprit_ranks": list(f.culprit_ranks),
            "ranks_missing": list(f.ranks_missing), "resolved": f.resolved,
        }, category="finding")
    in_flight = uuid()
    sink.counter_track(in_flight, parent=pid, name="collectives in flight", sort_index=1)
    deltas: dict[int, int] = defaultdict(int)
    for c in job.iter_collectives():
        arrivals = known_values(c.arrive_ns)
        if not arrivals:
            continue
        begin = min(arrivals)
        ends = c.end_ns
        # the max only where no end is None (mypy cannot narrow a tuple's items)
        end = max(ends) if (all(ends) or None not in ends) and c.completed_everywhere else None  # type: ignore[type-var]
        if not inside(begin, end if end is not None else begin):
            continue
        deltas[begin] += 1
        if end is not None:
            deltas[end] -= 1
    level = 0
    for t in sorted(deltas):
        level += deltas[t]
        sink.counter(in_flight, t, level)




# --- flows ---------------------------------------------------------------------------------------------------


def _window_test(window: tuple[int, int] | None) -> Callable[[int, int], bool] | None:
    """``inside(begin, end)``, or None without a window (everything is inside)."""
    if window is None:
        return None
    lo, hi = window
    return lambda begin, end: end >= lo and begin <= hi



def _event_time(arrive: int | None, start: int | None, end: int | None) -> int | None:
    return arrive if arrive is not None else (start if start is not None else end)


def _collective_flows(job: Job, shown: set[int], inside: Callable[[int, int], bool] | None
                      ) -> dict[str, dict[int, Flow]]:
    """Per group and seq, for collectives drawn on two or more ranks: the flow id and the ranks at its ends (the
    first and the last ready: ``Collective.ready_ns``, on the GPU where traces show every rank's kernels)."""
    flows: dict[str, dict[int, Flow]] = {}
    fid = 1
    for uid, cols in job.collectives.items():
        if not cols:
            continue
        ranks = cols[0].ranks
        positions = [i for i, r in enumerate(ranks) if r in shown]
        everyone = len(positions) == len(ranks)
        # The usual case, at C speed: no window, and every shown rank (two or more) issued it and arrived.
        pick = None if everyone or len(positions) < 2 else itemgetter(*positions)
        picked = ranks if pick is None else pick(ranks)
        quick = inside is None and len(positions) > 1
        # The shown ranks of a sample (256 of 16,384): read from their columns, where every collective's view
        # would decode every rank's values to pick theirs. Without GPU begins, ready is the arrival.
        shown_columns = None
        if quick and pick is not None and not cols[0].gpu_begin_ns:
            shown_columns = (list(zip(*(cols.member_column("arrive_ns", r) for r in picked))),
                             list(zip(*(cols.member_column("signatures", r) for r in picked))))
        by_seq = flows[uid] = {}
        sigs: tuple | None
        for k, c in enumerate(cols):
            if quick:
                if shown_columns is not None:
                    arrive, sigs = shown_columns[0][k], shown_columns[1][k]
                else:
                    arrive = c.ready_ns if pick is None else pick(c.ready_ns)
                    sigs = None if pick is None else pick(c.signatures)
                if all(arrive) and (sigs is None or all(sigs)):
                    by_seq[c.seq] = Flow(fid, rank_at(min, arrive, picked), rank_at(max, arrive, picked))
                    fid += 1
                    continue
            if everyone and inside is None:
                times = [(t, r) for t, r in zip(c.ready_ns, ranks) if t is not None]
                if len(times) < sum(1 for s in c.signatures if s is not None):
                    times = _flow_times(c, shown, inside)  # a rank known without arrival: the slow way
            else:
                times = _flow_times(c, shown, inside)
            if len(times) > 1:
                by_seq[c.seq] = Flow(fid, min(times)[1], max(times)[1])
                fid += 1
    return flows



def _flow_times(c: Collective, shown: set[int], inside: Callable[[int, int], bool] | None) -> list[tuple[int, int]]:
    times = []
    ready = c.ready_ns
    for i, r in enumerate(c.ranks):
        if r not in shown or c.signatures[i] is None:
            continue
        end = c.work_of(i)[1]
        t = _event_time(ready[i], c.start_ns[i], end)
        if t is not None and (inside is None or inside(t, end if end is not None else t)):
            times.append((t, r))
    return times


def _p2p_flows(job: Job, shown: set[int], inside: Callable[[int, int], bool] | None,
               fid: Callable[[], int]) -> dict[tuple[str, int, int, int], tuple[int, str]]:
    """Per matched send/recv on shown ranks: flow id and which side comes first in time."""
    out: dict[tuple[str, int, int, int], tuple[int, str]] = {}
    for uid, transfers in job.p2p.items():
        for tr in transfers:
            if not tr.matched or tr.src not in shown or tr.dst not in shown:
                continue
            ts = tr.send.t_arrive_ns  # type: ignore[union-attr]
            tr_ = tr.recv.t_arrive_ns  # type: ignore[union-attr]
            if ts is None or tr_ is None or (inside is not None and not (inside(ts, ts) and inside(tr_, tr_))):
                continue
            out[(uid, tr.src, tr.dst, tr.index)] = (fid(), "send" if ts <= tr_ else "recv")
    return out
