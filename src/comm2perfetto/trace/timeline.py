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

A flow links the slices of one collective across its ranks (and a send to its recv). Ranks are written
one after another, so memory holds one rank's events at a time besides the job itself.
"""

from __future__ import annotations

import functools
import itertools
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import getitem, gt, is_not, itemgetter, not_, sub
from types import MappingProxyType
from typing import Any

from comm2perfetto.diagnose.findings import Diagnosis
from comm2perfetto.model import NOT_DONE_STATES, Collective, Job, Signature, call_site, tensor_bytes
from comm2perfetto.trace.lanes import UNCLOSED, in_order, layout
from comm2perfetto.trace.markers import Markers, plan_markers
from comm2perfetto.trace.preview import PreviewRow
from comm2perfetto.trace.sink import NO_FLOWS, SharedArgs, TraceSink, arg_text

SAMPLE_LIMIT = 256  # above this many ranks, the default trace keeps implicated ranks plus a sample


@dataclass(frozen=True, slots=True)
class Selection:
    """The ranks drawn. ``note`` says why some are left out, for the summary and the trace."""

    ranks: tuple[int, ...]
    total: int
    note: str | None = None


def select_ranks(job: Job, markers: Markers, requested: set[int] | None = None, all_ranks: bool = False,
                 limit: int = SAMPLE_LIMIT) -> Selection:
    """``requested`` ranks, or every rank up to ``limit``; past it, implicated ranks plus an even sample."""
    have = set(job.ranks) | {r for g in job.groups.values() for r in g.ranks}
    total = len(have)
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


@dataclass(frozen=True, slots=True)
class _Flow:
    fid: int
    first: int  # rank whose event starts the flow
    last: int

    def role(self, rank: int) -> int:
        """Where ``rank``'s event puts the flow: _START, _STEP or _END (its index in SharedArgs.flows)."""
        return _START if rank == self.first else _END if rank == self.last else _STEP


_START, _STEP, _END = 0, 1, 2


def write_timeline(job: Job, diagnosis: Diagnosis, sink: TraceSink, selection: Selection,
                   window: tuple[int, int] | None = None, kineto: bool = True, preview: bool = False,
                   progress: Callable[[int, int], None] | None = None) -> TimelineSummary:
    """Write the whole job to ``sink`` (not closed here). ``window`` keeps events overlapping [start, end]."""
    markers = plan_markers(job, diagnosis)
    shown = set(selection.ranks)
    inside = _window_test(window)
    flows = _collective_flows(job, shown, inside)
    # p2p flow ids follow the collectives' (1 .. their count)
    p2p_flows = _p2p_flows(job, shown, inside, itertools.count(sum(map(len, flows.values())) + 1).__next__)
    uuid = itertools.count(2).__next__  # track uuids (0 is the Perfetto writer's root track)
    summary = TimelineSummary(ranks=selection.ranks, total_ranks=selection.total, collectives=sum(len(c) for c in job.collectives.values()),
                              p2p=sum(len(t) for t in job.p2p.values()), t_begin_ns=None, t_end_ns=None)
    if selection.note:
        summary.notes.append(selection.note)

    job_pid = uuid()
    sink.process(job_pid, pid=1, name="job", description=_job_description(job, diagnosis, selection),
                 sort_index=0)
    _write_job_tracks(job, diagnosis, sink, uuid, job_pid, inside or _everything)
    sites, tables = _SiteCache(job), {}  # tables: per group, built for the first rank that needs it
    for n, rank in enumerate(selection.ranks, 1):
        writer = _RankWriter(job, rank, markers, flows, p2p_flows, sites, tables, inside, kineto, preview)
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
    return summary


# --- what the job process shows ----------------------------------------------------------------------------


def _job_description(job: Job, diagnosis: Diagnosis, selection: Selection) -> str:
    parts = [f"world size {job.world_size}" if job.world_size else "world size unknown",
             f"diagnose: {diagnosis.status}"]
    if job.clock.residual_skew_ns is not None:
        parts.append(f"residual clock skew {job.clock.residual_skew_ns / 1000:.1f} us")
    if selection.note:
        parts.append(selection.note)
    return "; ".join(parts)


def _write_job_tracks(job: Job, diagnosis: Diagnosis, sink: TraceSink, uuid: Callable[[], int], pid: int,
                      inside: Callable[[int, int], bool]) -> None:
    findings = uuid()
    sink.track(findings, parent=pid, name="findings", sort_index=0)
    job_end = None
    for f in diagnosis.findings:
        if f.t_ns is None and job_end is None:
            job_end = _job_end(job)
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
        arrivals = _known(c.arrive_ns)
        if not arrivals:
            continue
        begin = min(arrivals)
        ends = c.end_ns
        end = max(ends) if (all(ends) or None not in ends) and c.completed_everywhere else None
        if not inside(begin, end if end is not None else begin):
            continue
        deltas[begin] += 1
        if end is not None:
            deltas[end] -= 1
    level = 0
    for t in sorted(deltas):
        level += deltas[t]
        sink.counter(in_flight, t, level)


def _job_end(job: Job) -> int | None:
    ends = [max(times) for c in job.iter_collectives() if (times := _known(c.end_ns + c.arrive_ns))]
    return max(ends) if ends else None


def _known(values: tuple[int | None, ...]) -> Sequence[int]:
    """The values that are not None; the tuple itself when none is (tested at C speed: ranks x collectives).

    ``all()`` tests truth, faster than ``None in``: a time of 0 only sends it the slow way.
    """
    return values if all(values) else [v for v in values if v is not None]


# --- flows ---------------------------------------------------------------------------------------------------


def _window_test(window: tuple[int, int] | None) -> Callable[[int, int], bool] | None:
    """``inside(begin, end)``, or None without a window (everything is inside)."""
    if window is None:
        return None
    lo, hi = window
    return lambda begin, end: end >= lo and begin <= hi


def _everything(begin: int, end: int) -> bool:
    return True


def _event_time(arrive: int | None, start: int | None, end: int | None) -> int | None:
    return arrive if arrive is not None else (start if start is not None else end)


def _collective_flows(job: Job, shown: set[int], inside: Callable[[int, int], bool] | None
                      ) -> dict[str, dict[int, _Flow]]:
    """Per group and seq, for collectives drawn on two or more ranks: the flow id and the ranks at its ends."""
    flows: dict[str, dict[int, _Flow]] = {}
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
        by_seq = flows[uid] = {}
        for c in cols:
            if quick:
                arrive = c.arrive_ns if pick is None else pick(c.arrive_ns)
                if all(arrive) and (pick is None or all(pick(c.signatures))):
                    by_seq[c.seq] = _Flow(fid, _rank_at(min, arrive, picked), _rank_at(max, arrive, picked))
                    fid += 1
                    continue
            if everyone and inside is None:
                times = [(t, r) for t, r in zip(c.arrive_ns, ranks) if t is not None]
                if len(times) < sum(1 for s in c.signatures if s is not None):
                    times = _flow_times(c, shown, inside)  # a rank known without arrival: the slow way
            else:
                times = _flow_times(c, shown, inside)
            if len(times) > 1:
                by_seq[c.seq] = _Flow(fid, min(times)[1], max(times)[1])
                fid += 1
    return flows


def _rank_at(pick: Callable[..., Any], arrive: tuple[int, ...], ranks: tuple[int, ...]) -> int:
    """``pick(zip(arrive, ranks))[1]`` for ``pick`` min or max: C-speed scans unless arrivals tie."""
    t = pick(arrive)
    if arrive.count(t) == 1:
        return ranks[arrive.index(t)]
    return pick(r for a, r in zip(arrive, ranks) if a == t)


def _flow_times(c: Collective, shown: set[int], inside: Callable[[int, int], bool] | None) -> list[tuple[int, int]]:
    times = []
    for i, r in enumerate(c.ranks):
        if r not in shown or c.signatures[i] is None:
            continue
        end = c.end_ns[i]
        t = _event_time(c.arrive_ns[i], c.start_ns[i], end)
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


class _SiteCache:
    """Call site text per stack id (``train.py:57 step``), computed once for all ranks."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.cache: dict[int, str | None] = {}

    def __call__(self, sid: int | None) -> str | None:
        if sid is None:
            return None
        try:
            return self.cache[sid]
        except KeyError:
            frame = call_site(self.job.stack(sid))
            site = str(frame) if frame is not None else None
            self.cache[sid] = site
            return site


# --- one rank --------------------------------------------------------------------------------------------------

# An event to lay out on a track family: (begin, end | None (instant) | UNCLOSED, name, args, category,
# SharedArgs or None, (flow_start, flow_step, flow_end)).
Item = tuple[int, Any, str, Any, str, SharedArgs | None, tuple[tuple[int, ...], ...]]


class _RankWriter:
    def __init__(self, job: Job, rank: int, markers: Markers, flows: Mapping[str, Mapping[int, _Flow]],
                 p2p_flows: Mapping[tuple[str, int, int, int], tuple[int, str]], sites: _SiteCache,
                 tables: dict[str, _GroupTable], inside: Callable[[int, int], bool] | None,
                 kineto: bool, preview: bool) -> None:
        self.job, self.rank, self.markers = job, rank, markers
        self.flows, self.p2p_flows, self.sites = flows, p2p_flows, sites
        self.window = inside  # None: no window (the hot loop skips the test)
        self.inside = inside or _everything
        self.tables = tables
        self.kineto = kineto
        self.preview = preview  # collect what the preview draws (compute, comm, stalls)
        self.offset = job.clock.offset_ns.get(rank, 0)
        self.families: list[tuple[str, str | None, list[Item]]] = []  # (track name, description, items)
        self.lo: int | None = None
        self.hi: int | None = None
        self.notes: list[str] = []
        self.compute: list[tuple[int, int]] = []
        self.comm: list[tuple[int, int]] = []
        self.stalled: list[int] = []
        self.marks: list[tuple[int, str, bool]] = []  # (t, kind, gone for good) for the preview
        self.last_activity: int | None = None  # the latest event of the rank's own (not the recorder's notes)

    # The order of these calls is the order of the tracks in the rank's process.
    def write(self, sink: TraceSink, uuid: Callable[[], int]) -> tuple[int, int] | None:
        log = self.job.logs.get(self.rank)
        self._steps(log)
        group_items = self._collectives()
        for label, items in group_items:
            self.families.append((label, None, items))
        if log is not None:
            self._python_calls(log)
            self._ranges(log)
        if self.kineto:
            self._profiler()
        if log is not None:
            self._recorder_events(log)
        self._place_marks(group_items)
        pid = uuid()
        sink.process(pid, pid=self.rank + 2, name=f"rank {self.rank}", description=self._description(),
                     sort_index=self.rank + 1)
        order = 0
        for name, desc, items in self.families:
            if not items:
                continue
            if in_order(items):  # the usual case (one group's collectives): the items are the lane
                tid = uuid()
                sink.track(tid, parent=pid, name=name, sort_index=order, description=desc)
                order += 1
                _emit_items(sink, tid, items)
                continue
            for k, lane in enumerate(layout(items)):
                tid = uuid()
                sink.track(tid, parent=pid, name=name if k == 0 else f"{name} ({k + 1})", sort_index=order,
                           description=desc)
                order += 1
                _emit(sink, tid, lane)
        if self.lo is None or self.hi is None:
            return None
        return self.lo, self.hi

    def _description(self) -> str:
        info = self.job.ranks.get(self.rank)
        if info is None:
            return "no data from this rank"
        parts = [f"host {info.host}" if info.host else None, f"pid {info.pid}" if info.pid else None,
                 info.backend]
        method = self.job.clock.method.get(self.rank)
        if method:
            parts.append(f"clock {method} ({self.offset / 1000:+.1f} us)")
        if info.closed_cleanly is False:
            parts.append("log not closed cleanly: the rank died or was killed")
        return ", ".join(p for p in parts if p)

    def _seen(self, begin: int, end: int | None) -> None:
        stop = end if end is not None else begin
        self.lo = begin if self.lo is None or begin < self.lo else self.lo
        self.hi = stop if self.hi is None or stop > self.hi else self.hi

    # --- collectives and p2p ---------------------------------------------------------------------------------

    def _collectives(self) -> list[tuple[str, list[Item]]]:
        out = []
        for uid, group in _ordered_groups(self.job):
            if self.rank not in group.ranks:
                continue
            items: list[Item] = []
            cols = self.job.collectives.get(uid, ())
            if cols:
                self._group_collectives(uid, cols, cols[0].ranks.index(self.rank), items)
            for tr in self.job.p2p.get(uid, ()):
                if tr.src == self.rank and tr.send is not None:
                    self._p2p(tr, "send", tr.send, tr.dst, uid, items)
                if tr.dst == self.rank and tr.recv is not None:
                    self._p2p(tr, "recv", tr.recv, tr.src, uid, items)
            out.append((group.label, items))
        return out

    def _group_collectives(self, uid: str, cols: tuple[Collective, ...], i: int, items: list[Item]) -> None:
        """This rank's slice of every collective of one group: the hot part of a big merge (2M slices).

        Built a column at a time at C speed (every collective's value for this rank at once, see _GroupTable).
        The collectives that need a closer look (missing or different here, stalled, mismatched, without an
        end time; all of them with a window) go one by one through _collective_slice, in their place.
        """
        table = self.tables.get(uid)
        if table is None:
            table = self.tables[uid] = _GroupTable(cols, self.flows.get(uid, {}), self.sites)
        rank = self.rank
        stalled = {seq: waits[rank] for (u, seq), waits in self.markers.stalled.items()
                   if u == uid and rank in waits}
        mismatched = {seq: kind for (u, seq), kind in self.markers.mismatched.items() if u == uid}
        get = itemgetter(i)
        arrive, ends = list(map(get, table.arrive)), list(map(get, table.ends))
        if self.window is not None:
            odd = range(len(arrive))
        else:
            odd = table.odd_positions(list(map(get, table.signatures)), arrive, ends)
            marked = {table.position[seq] for seq in (*stalled, *mismatched) if seq in table.position}
            if marked:
                odd = sorted(marked.union(odd))
        # The plain slices: all of them, built column by column; the odd ones are replaced below. Where
        # they sit, begins and ends are +-inf so that min, max and the lateness column take them as they are.
        begins, stops = arrive, ends
        if odd:
            begins, stops = arrive.copy(), ends.copy()
            for k in odd:
                begins[k], stops[k] = UNCLOSED, -UNCLOSED
        # {"lateness_ns": arrival - the first rank's}, made at C speed
        lateness = map(dict.fromkeys, itertools.repeat(("lateness_ns",)), map(sub, begins, table.firsts))
        slices: list[Item | None] = list(zip(arrive, ends, table.ops, lateness, itertools.repeat("collective"),
                                             table.shared_of(get, rank), itertools.repeat(NO_FLOWS)))
        if len(odd) < len(slices):
            self._seen(min(begins), max(stops))
            if self.preview:
                self.comm += [(begin, end) for begin, end in zip(begins, stops) if end > begin]
        for k in odd:
            slices[k] = self._collective_slice(table.rows[k], i, stalled, mismatched)
        items += filter(None, slices) if odd else slices

    def _collective_slice(self, row: _Row, i: int, stalled: Mapping[int, Any], mismatched: Mapping[int, str]
                          ) -> Item | None:
        """This rank's slice of one collective, the careful way (see _group_collectives); None: none here."""
        c, common, flow = row
        sig = c.signatures[i]
        if sig is None:
            return None
        arrive, end = c.arrive_ns[i], c.end_ns[i]
        begin = arrive if arrive is not None else (c.start_ns[i] if c.start_ns[i] is not None else end)
        if begin is None or not self.inside(begin, end if end is not None else begin):
            return None
        if common.sig is not sig:  # the loader interns signatures: this rank disagrees with the first
            common = common.variant(c, sig)
        state = c.states[i]
        waits = stalled.get(c.seq)
        role = None if flow is None else flow.role(self.rank)
        shared = common["stalled" if waits is not None else state, c.stack_ids[i], c.sources[i], role]
        state = state or "unknown"
        first = common.first
        args: dict[str, Any] = {"lateness_ns": arrive - first} if arrive is not None and first is not None else {}
        stop: Any = end
        if waits is not None:
            args["waiting_for"] = list(waits)
            args["state_at_dump"] = state
            stop = UNCLOSED
            self.stalled.append(begin)
        elif end is None:
            # Gloo's Flight Recorder records no end time: an instant where the collective was issued.
            args["duration"] = ("unknown (not completed when the data was taken)" if state in NOT_DONE_STATES
                                else "unknown (no end time recorded)")
        elif end < begin:
            stop = begin
        kind = mismatched.get(c.seq)
        if kind:
            args["mismatch"] = kind
        self._seen(begin, end)
        if self.preview and end is not None and end > begin:
            self.comm.append((begin, end))
        return (begin, stop, sig.op, args, "collective", shared, NO_FLOWS)

    def _p2p(self, tr, kind: str, op, peer: int, uid: str, items: list[Item]) -> None:
        begin, end = op.t_arrive_ns, op.t_end_ns
        if begin is None or not self.inside(begin, end if end is not None else begin):
            return
        sig: Signature = op.signature
        args = {"peer": peer, "process_group": self.job.groups[uid].label, "index": tr.index,
                **_signature_args(sig), "state": op.state, "matched": tr.matched, "source": op.source}
        site = self.sites(op.stack_id)
        if site:
            args["call_site"] = site
        flows = NO_FLOWS
        flow = self.p2p_flows.get((uid, tr.src, tr.dst, tr.index))
        if flow is not None:
            fid, first = flow
            flows = ((fid,), (), ()) if first == kind else ((), (), (fid,))
        name = "send" if kind == "send" else "recv"
        items.append((begin, end if end is not None and end >= begin else None, name, args, "p2p", None, flows))
        self._seen(begin, end)
        if end is not None and end > begin:
            self.comm.append((begin, end))

    def _place_marks(self, group_items: list[tuple[str, list[Item]]]) -> None:
        marks = [m for m in self.markers.marks if m.rank == self.rank]
        if not marks:
            return
        labels = dict(group_items)  # group label -> its items
        for m in marks:
            label = self.job.groups[m.group_uid].label
            items = labels.get(label)
            if items is None:
                items = []
                self.families.insert(1, (label, None, items))
                labels[label] = items
            t = m.t_ns if m.t_ns is not None else (self.last_activity or self.hi)
            if t is None:
                continue
            items.append((t, None, m.name, m.args, "marker", None, NO_FLOWS))
            kind = "missing" if m.name.startswith("missing") else "mismatch"
            self.marks.append((t, kind, kind == "missing" and m.t_ns is None))

    # --- the recorder's own view -----------------------------------------------------------------------------

    def _steps(self, log) -> None:
        if (log is None or not log.steps) and self.kineto:
            self._profiler_steps()
            return
        bounds = [(step, t + self.offset) for step, t, _source in (log.steps if log is not None else ())]
        items: list[Item] = []
        for (step, t), nxt in zip(bounds, bounds[1:] + [None]):
            end = nxt[1] if nxt is not None else None
            if end is None:
                end = self._log_end(log)
            if end is None or end < t or not self.inside(t, end):
                continue
            items.append((t, end, f"step {step}", {"step": step}, "step", None, NO_FLOWS))
        self.families.append(("steps", "step boundaries: optimizer steps, profiler steps or comm2perfetto.step()",
                              items))

    def _profiler_steps(self) -> None:
        """The traces' ``ProfilerStep#n`` as the CPU ran them, and the same steps on the GPU: from the first
        kernel launched in the step to the first of the next step's (``sources.kineto.steps.gpu_step_spans``)."""
        cpu: list[Item] = []
        gpu: list[Item] = []
        for trace in self.job.traces.get(self.rank, ()):
            for items, steps in ((cpu, trace.steps), (gpu, trace.gpu_steps if trace.gpu_events else ())):
                for n, begin, end in steps:
                    begin, end = begin + self.offset, end + self.offset
                    if end >= begin and self.inside(begin, end):
                        items.append((begin, end, f"step {n}", {"step": n}, "step", None, NO_FLOWS))
        self.families.append(("steps", "torch.profiler's ProfilerStep#n on the CPU", cpu))
        self.families.append(("steps (GPU)", "the GPU work each step launched: from its first kernel to the next "
                              "step's first kernel", gpu))

    def _log_end(self, log) -> int | None:
        times = [c.t_return_ns or c.t_call_ns for c in log.calls[-1:]]
        times += [r.t_end_ns or r.t_begin_ns for r in log.ranges[-1:]]
        return max(times) + self.offset if times else None

    def _python_calls(self, log) -> None:
        by_thread: dict[int, list[Item]] = defaultdict(list)
        log_end = self._log_end(log)
        for call in log.calls:
            begin = call.t_call_ns + self.offset
            end = call.t_return_ns + self.offset if call.t_return_ns is not None else None
            args: dict[str, Any] = {"seq": call.seq if call.seq is not None else -1, "async": call.is_async,
                                    "step": call.step}
            if call.site:
                args["call_site"] = call.site
            if call.module:
                args["module"] = call.module
            if call.pass_:
                args["pass"] = call.pass_
            if call.nvtx:
                args["nvtx"] = " > ".join(call.nvtx)
            if call.shapes:
                args["shapes"] = _sizes(call.shapes)
                args["dtypes"] = ",".join(map(str, call.dtypes or ()))
            if call.nbytes is not None:
                args["bytes"] = call.nbytes
            if call.peer is not None:
                args["peer"] = str(call.peer)
            if call.t_done_ns is not None:
                args["completed_after_ns"] = call.t_done_ns + self.offset - begin
            if call.error:
                args["error"] = call.error
            if end is None:
                # Never returned: stalled there if diagnose says this rank is stuck, else its data ends here.
                if self._stuck_in(call):
                    args["state"] = "stalled"
                    end = UNCLOSED
                else:
                    args["state"] = "never returned (the rank's data ends here)"
                    end = max(log_end or begin, begin)
            if not self.inside(begin, begin if end is UNCLOSED else end):
                continue
            by_thread[call.tid].append((begin, end, call.op, args, "python", None, NO_FLOWS))
            self._seen(begin, None if end is UNCLOSED else end)
        for tid, items in sorted(by_thread.items(), key=lambda kv: kv[1][0][0]):
            self.families.append((_thread_name("python calls", tid, log.thread_names),
                                  "torch.distributed calls as the patch layer saw them: from call to return", items))

    def _stuck_in(self, call) -> bool:
        groups = self.job.logs[self.rank].groups
        g = groups.get(call.gid)
        for (uid, seq), waits in self.markers.stalled.items():
            if self.rank in waits and g is not None and self.job.groups[uid].name == g.name and (
                    call.seq is None or call.seq <= seq <= (call.seq_last or call.seq)):
                return True
        return False

    def _ranges(self, log) -> None:
        by_thread: dict[int, list[Item]] = defaultdict(list)
        log_end = self._log_end(log)
        for rng in log.ranges:
            begin = rng.t_begin_ns + self.offset
            args: dict[str, Any] = {"source": rng.source}
            if rng.t_end_ns is not None:
                end = rng.t_end_ns + self.offset
            else:
                args["state"] = "not closed (the rank's data ends here)"
                end = max(log_end or begin, begin)
            if not self.inside(begin, end):
                continue
            by_thread[rng.tid].append((begin, end, rng.name, args, "range", None, NO_FLOWS))
            self._seen(begin, end)
            self.compute.append((begin, end))
        for tid, items in sorted(by_thread.items(), key=lambda kv: kv[1][0][0]):
            self.families.append((_thread_name("ranges", tid, log.thread_names),
                                  "NVTX and comm2perfetto.range() ranges", items))

    def _recorder_events(self, log) -> None:
        items: list[Item] = []
        for s in log.stalls:
            t = s.t_ns + self.offset
            args = {"reason": s.reason}
            if s.trigger_rank is not None:
                args["trigger_rank"] = s.trigger_rank
            if s.stacks_file:
                args["stacks_file"] = s.stacks_file
            items.append((t, None, "stall detected", args, "recorder", None, NO_FLOWS))
        for t, path, reason in log.fr_dumps:
            items.append((t + self.offset, None, "Flight Recorder dump", {"file": path, "reason": reason},
                          "recorder", None, NO_FLOWS))
        for t, message in log.warnings:
            items.append((t + self.offset, None, "recorder warning", {"message": message}, "recorder", None,
                          NO_FLOWS))
        for t, name, tid, source in log.marks:
            items.append((t + self.offset, None, name, {"source": source, "thread": str(tid)}, "mark", None,
                          NO_FLOWS))
        items = [it for it in items if self.inside(it[0], it[0])]
        activity = self.hi  # the recorder's own events are not the rank's activity (marks go there)
        for t, *_ in items:  # a stall detected, a dump taken: the data reaches at least this far
            self._seen(t, None)
        self.last_activity = activity
        self.families.append(("recorder", "what the recorder noticed: stalls, Flight Recorder dumps, warnings",
                              items))

    # --- profiler traces -------------------------------------------------------------------------------------

    def _profiler(self) -> None:
        cpu: dict[str, list[Item]] = {}  # by lane, in the reader's order (threads, then GPU streams)
        gpu: dict[str, list[Item]] = {}
        names: dict[str, str] = {}
        for trace in self.job.traces.get(self.rank, ()):
            names.update(trace.lane_names)
            for ev in trace.cpu_ops:
                self._kineto_item(ev, cpu.setdefault(ev.lane, []), compute=True)
            for ev in trace.gpu_events:
                self._kineto_item(ev, gpu.setdefault(ev.lane, []), compute=ev.klass == "compute")
        for lane, items in cpu.items():
            self.families.append((f"cpu ops ({names.get(lane, lane)})", "torch.profiler CPU ops", items))
        for lane, items in gpu.items():
            self.families.append((names.get(lane, lane),
                                  "kernels, memcpy and memset: class compute, comm or memory", items))

    def _kineto_item(self, ev, items: list[Item], compute: bool) -> None:
        begin = ev.t_begin_ns + self.offset
        end = begin + max(ev.duration_ns, 0)
        if not self.inside(begin, end):
            return
        args = dict(ev.args) if ev.args else {}
        klass = ev.klass
        if klass:
            args["class"] = klass
        items.append((begin, end, ev.name, args, klass or ev.kind, None, NO_FLOWS))
        self._seen(begin, end)
        if klass == "comm":
            self.comm.append((begin, end))
        elif compute and klass != "memory":
            self.compute.append((begin, end))

    def preview_row(self) -> PreviewRow:
        spans = [(b, e, "compute") for b, e in self.compute] + [(b, e, "comm") for b, e in self.comm]
        spans += [(b, 2**62, "stalled") for b in self.stalled]  # to the end of the picture
        # A rank that never came back: missing from its last activity on (the renderer clips at the end).
        spans += [(t, 2**62, "missing") for t, _, gone in self.marks if gone]
        return PreviewRow(label=f"rank {self.rank}", spans=spans, marks=[(t, kind) for t, kind, _ in self.marks])


# --- helpers -----------------------------------------------------------------------------------------------------


def _emit_items(sink: TraceSink, track: int, items: list[Item]) -> None:
    """Items that ``lanes.in_order`` accepted, one event each: a slice drawn to the end of the trace comes last."""
    last = items[-1]
    if last[1] != UNCLOSED:
        sink.events(track, items)
        return
    sink.events(track, items[:-1])
    begin, _, name, args, category, shared, (fs, fm, fe) = last
    sink.begin(track, begin, name, args, category=category, shared=shared, flow_start=fs, flow_step=fm, flow_end=fe)


def _emit(sink: TraceSink, track: int, lane: list[tuple[str, int, Any]]) -> None:
    n = len(lane)
    i = 0
    while i < n:
        kind, ts, item = lane[i]
        i += 1
        if kind == "E":
            sink.end(track, ts)
            continue
        _, _, name, args, category, shared, (fs, fm, fe) = item
        if kind == "B":
            if i < n and lane[i][0] == "E":  # no children: one complete slice (the writers' fast path)
                sink.complete(track, ts, lane[i][1] - ts, name, args, category=category, shared=shared,
                              flow_start=fs, flow_step=fm, flow_end=fe)
                i += 1
            else:
                sink.begin(track, ts, name, args, category=category, shared=shared, flow_start=fs, flow_step=fm,
                           flow_end=fe)
        else:
            sink.instant(track, ts, name, args, category=category, shared=shared, flow_start=fs, flow_step=fm,
                         flow_end=fe)


class _Common(dict):  # type: ignore[type-arg]
    """What every rank's slice of one collective (with one signature) shares, built once.

    ``args`` and ``first`` (the first rank's arrival); as a dict, ``(state, stack id, source)`` -> those args
    with these three, as one ``SharedArgs`` that the writer encodes once for every rank that has them.
    """

    __slots__ = ("args", "first", "flow", "others", "sig", "sites")

    def __init__(self, c: Collective, sig: Signature, sites: _SiteCache, flow: _Flow | None) -> None:
        super().__init__()
        self.sig, self.sites, self.flow = sig, sites, flow
        self.args = _collective_args(c, sig)
        arrivals = _known(c.arrive_ns)
        self.first = min(arrivals) if arrivals else None
        self.others: list[_Common] = []  # of ranks whose signature differs

    def __missing__(self, key: tuple[str | None, int | None, str | None, int | None]) -> SharedArgs:
        state, stack_id, source, role = key
        args = dict(self.args, state=state or "unknown")
        site = self.sites(stack_id)
        if site:
            args["call_site"] = site
        if source:
            args["source"] = source
        flows: list[tuple[int, ...]] = [(), (), ()]
        if role is not None and self.flow is not None:
            flows[role] = (self.flow.fid,)
        shared = self[key] = SharedArgs(args, flow_start=flows[0], flow_step=flows[1], flow_end=flows[2])
        return shared

    def variant(self, c: Collective, sig: Signature) -> _Common:
        """The shared part for ranks that issued ``c`` with another signature than this one's."""
        for other in self.others:
            if other.sig is sig:
                return other
        self.others.append(_Common(c, sig, self.sites, self.flow))
        return self.others[-1]


# Per collective of a group: the collective, the shared part of its slices, its flow.
_Row = tuple[Collective, _Common, _Flow | None]


class _GroupTable:
    """One group's collectives laid out for the rank-by-rank walk; built once, read by every rank.

    ``rows``: per collective some rank issued, the collective, what its slices share and its flow. Per-rank
    fields are columns, one per-rank tuple per collective: ``map(itemgetter(i), table.arrive)`` reads rank
    ``i``'s arrival in every collective at C speed. The other lists hold one value per collective.
    """

    def __init__(self, cols: tuple[Collective, ...], flows: Mapping[int, _Flow], sites: _SiteCache) -> None:
        self.rows: list[_Row] = []
        for c in cols:
            sig = next((s for s in c.signatures if s is not None), None)
            if sig is not None:
                flow = flows.get(c.seq)
                self.rows.append((c, _Common(c, sig, sites, flow), flow))
        issued = [c for c, _, _ in self.rows]
        self.position = {c.seq: k for k, c in enumerate(issued)}
        self.signatures = [c.signatures for c in issued]
        self.arrive = [c.arrive_ns for c in issued]
        self.ends = [c.end_ns for c in issued]
        self.states = [c.states for c in issued]
        self.stack_ids = [c.stack_ids for c in issued]
        self.sources = [c.sources for c in issued]
        self.commons = [common for _, common, _ in self.rows]
        self.common_sigs = [common.sig for common in self.commons]
        self.ops = [sig.op for sig in self.common_sigs]
        self.firsts = [common.first or 0 for common in self.commons]  # 0: no arrival, the careful way
        # Flow roles: the middle one (shared_of puts the first and last rank's in their place).
        self.roles = [None if flow is None else _STEP for _, _, flow in self.rows]
        self.flow_starts: dict[int, list[int]] = defaultdict(list)  # rank -> positions of the flows it starts
        self.flow_ends: dict[int, list[int]] = defaultdict(list)
        for k, (_, _, flow) in enumerate(self.rows):
            if flow is not None:
                self.flow_starts[flow.first].append(k)
                self.flow_ends[flow.last].append(k)
        # The (state, stack id, source) of the first rank with a slice, and its SharedArgs: what most ranks have.
        usual = [c.signatures.index(common.sig) for c, common, _ in self.rows]
        self.usual_states = [c.states[j] for c, j in zip(issued, usual)]
        self.usual_stack_ids = [c.stack_ids[j] for c, j in zip(issued, usual)]
        self.usual_sources = [c.sources[j] for c, j in zip(issued, usual)]
        self.usual_shared = list(map(getitem, self.commons, zip(self.usual_states, self.usual_stack_ids,
                                                                self.usual_sources, self.roles)))

    def shared_of(self, get: itemgetter, rank: int) -> list[SharedArgs]:
        """The SharedArgs of ``rank``'s slice of each collective (``get`` reads its column), at C speed."""
        states = list(map(get, self.states))
        stack_ids = list(map(get, self.stack_ids))
        sources = list(map(get, self.sources))
        if states == self.usual_states and stack_ids == self.usual_stack_ids and sources == self.usual_sources:
            shared = self.usual_shared.copy()
        else:  # _Common.__missing__ makes the ones not seen yet
            shared = list(map(getitem, self.commons, zip(states, stack_ids, sources, self.roles)))
        for role, positions in ((_END, self.flow_ends.get(rank, ())), (_START, self.flow_starts.get(rank, ()))):
            for k in positions:
                shared[k] = self.commons[k][states[k], stack_ids[k], sources[k], role]
        return shared

    def odd_positions(self, sigs: list[Signature | None], arrive: list[int | None], ends: list[int | None]
                      ) -> list[int]:
        """Collectives the columns cannot make this rank's slice of: missing or with another signature here,
        no arrival or end time (or 0), an end before the arrival. Found at C speed: usually few or none."""
        positions = range(len(sigs))
        odd = set(itertools.compress(positions, map(is_not, sigs, self.common_sigs)))
        if not (all(arrive) and all(ends)):
            missing = {k for column in (arrive, ends) for k in itertools.compress(positions, map(not_, column))}
            odd |= missing
            arrive, ends = arrive.copy(), ends.copy()
            for k in missing:
                arrive[k] = ends[k] = 0
        odd.update(itertools.compress(positions, map(gt, arrive, ends)))
        return sorted(odd)


def _collective_args(c: Collective, sig: Signature) -> dict[str, Any]:
    args: dict[str, Any] = {"process_group": c.group.label, "seq": c.seq, "group_size": len(c.group.ranks),
                            **_signature_args(sig)}
    last = _rank_at(max, c.arrive_ns, c.ranks) if c.ranks and all(c.arrive_ns) else c.last_arrival_rank
    if last is not None:
        args["last_arrival_rank"] = last
    return args


@functools.lru_cache(maxsize=1024)  # a job has few distinct signatures, each on thousands of collectives
def _signature_args(sig: Signature) -> Mapping[str, Any]:
    """shapes, dtypes, output_shapes (when they differ) and bytes (when the dtypes are known)."""
    args: dict[str, Any] = {"shapes": _sizes(sig.input_sizes), "dtypes": ",".join(sig.input_dtypes or ())}
    if sig.output_sizes is not None and sig.output_sizes != sig.input_sizes:
        args["output_shapes"] = _sizes(sig.output_sizes)
    nbytes = _nbytes(sig)
    if nbytes is not None:
        args["bytes"] = nbytes
    return MappingProxyType(args)


def _sizes(sizes) -> str:
    """``[[4, 8], [2]]``; ``?`` when unknown."""
    return "?" if sizes is None else str(arg_text(sizes))


def _nbytes(sig: Signature) -> int | None:
    return tensor_bytes(sig.input_sizes, sig.input_dtypes)


def _thread_name(what: str, tid: Any, names: dict[int, str]) -> str:
    """``python calls (MainThread)`` where the recorder wrote the thread's name (the id too when another thread
    of the rank has the same name), ``python calls (thread 139624980982656)`` where not."""
    name = names.get(tid)
    if name is None:
        return f"{what} (thread {tid})"
    if sum(1 for other in names.values() if other == name) > 1:
        return f"{what} ({name}, thread {tid})"
    return f"{what} ({name})"


def _ordered_groups(job: Job) -> list[tuple[str, Any]]:
    def key(item: tuple[str, Any]) -> tuple:
        g = item[1]
        return (0 if g.name == "0" else 1, len(g.ranks) * -1, g.name)

    return sorted(job.groups.items(), key=key)
