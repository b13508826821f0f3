"""One rank's process in the trace: its tracks in order (steps, a track per process group, python calls, ranges,
profiler CPU ops and GPU streams, the recorder's notes), each slice with its args and flows, and what the
preview draws of the rank. ``timeline.write_timeline`` runs one ``RankWriter`` per rank shown, one after
another, so memory holds one rank's events at a time besides the job itself.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from operator import sub
from typing import Any, NamedTuple

from comm2perfetto.job import Job
from comm2perfetto.model import NOT_DONE_STATES, GroupView, P2POp, P2PTransfer, Signature, gpu_backend
from comm2perfetto.report.untimed import NOT_DONE, P2P_ON_GPU, gpu_untimed_reason
from comm2perfetto.sources.event_log import Call, RankLog
from comm2perfetto.sources.kineto.classify import CPU_KIND_SUFFIXES, cpu_class
from comm2perfetto.trace.lanes import UNCLOSED, in_order, layout
from comm2perfetto.trace.markers import Markers
from comm2perfetto.trace.preview import PreviewRow
from comm2perfetto.trace.shared_args import Flow, GroupTable, SiteCache, shapes_text, signature_args
from comm2perfetto.trace.sink import NO_FLOWS, SharedArgs, TraceSink
from comm2perfetto.words import duration

__all__ = ["KINETO_FLOW_BASE", "Item", "RankWriter", "everything"]

# Flow ids of the profiler's launch-to-kernel flows: rank r's k-th is KINETO_FLOW_BASE + r * 2**32 + k, apart
# from the collectives' and p2p transfers' (1 ... their count) and below 2**53 (exact in Chrome JSON readers).
KINETO_FLOW_BASE = 1 << 48
# A GPU collective or send/recv drawn where it was enqueued: Flight Recorder's end is when the watchdog saw it done.
GPU_UNTIMED = "unknown: its GPU work was not timed ({})"  # why: report.untimed's words

# An event to lay out on a track family: (begin, end | None (instant) | UNCLOSED, name, args, category,
# SharedArgs or None, (flow_start, flow_step, flow_end)).
Item = tuple[int, Any, str, Any, str, SharedArgs | None, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]


class _RankColumns(NamedTuple):
    """One rank's values across a group's collectives (``GroupTable.column``), for its odd slices."""

    signatures: list
    begins: list  # its work: GPU where a trace shows it, else arrival
    ends: list
    starts: list
    states: list
    stack_ids: list
    sources: list


def everything(begin: int, end: int) -> bool:
    """The window test without a window: everything is inside."""
    return True


class RankWriter:
    """Lays out one rank's tracks (``write``); ``flows``/``p2p_flows``/``sites``/``tables``: what the job's
    ranks share, built once."""

    def __init__(self, job: Job, rank: int, markers: Markers, flows: Mapping[str, Mapping[int, Flow]],
                 p2p_flows: Mapping[tuple[str, int, int, int], tuple[int, str]], sites: SiteCache,
                 tables: dict[str, GroupTable], inside: Callable[[int, int], bool] | None,
                 kineto: bool, preview: bool, flow_ids: Callable[[], int] | None = None,
                 kineto_detail: bool = True) -> None:
        self.job, self.rank, self.markers = job, rank, markers
        self.flows, self.p2p_flows, self.sites = flows, p2p_flows, sites
        self.window = inside  # None: no window (the hot loop skips the test)
        self.inside = inside or everything
        self.tables = tables
        self.kineto = kineto
        # Profiler events with their args, ids and launch flows (False, merge --lean: name, times and class)
        self.kineto_detail = kineto_detail
        self.preview = preview  # collect what the preview draws of diagnose's findings (stalls, missing ranks)
        self.families: list[tuple[str, str | None, list[Item]]] = []  # (track name, description, items)
        self.lo: int | None = None
        self.hi: int | None = None
        self.notes: list[str] = []
        self.stalled: list[int] = []
        self.marks: list[tuple[int, str, bool]] = []  # (t, kind, gone for good) for the preview
        self.last_activity: int | None = None  # the latest event of the rank's own (not the recorder's notes)
        # The enqueue flows (see _enqueues): the GPU work's begin -> the CPU op's (begin, end); the CPU op's
        # begin -> the flow id given to it once its collective's slice was drawn.
        self.flow_ids = flow_ids
        self.enqueued: dict[int, tuple[int, int]] = {}
        self.enqueue_flows: dict[int, int] = {}

    # The order of these calls is the order of the tracks in the rank's process.
    def write(self, sink: TraceSink, uuid: Callable[[], int]) -> tuple[int, int] | None:
        log = self.job.logs.get(self.rank)
        self._steps(log)
        if self.kineto and self.flow_ids is not None:
            self._enqueues()
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
            offset = self.job.clock.offset_ns.get(self.rank, 0)
            parts.append(f"clock {method} ({'+' if offset >= 0 else ''}{duration(offset)})")
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
        for group in self.job.groups_in_order():
            uid = group.uid
            if self.rank not in group.ranks:
                continue
            items: list[Item] = []
            cols = self.job.collectives.get(uid)
            if cols:
                self._group_collectives(uid, cols, cols.ranks.index(self.rank), items)
            for tr in self.job.p2p.get(uid, ()):
                if tr.src == self.rank and tr.send is not None:
                    self._p2p(tr, "send", tr.send, tr.dst, uid, items)
                if tr.dst == self.rank and tr.recv is not None:
                    self._p2p(tr, "recv", tr.recv, tr.src, uid, items)
            out.append((group.label, items))
        return out

    def _group_collectives(self, uid: str, cols: GroupView, i: int, items: list[Item]) -> None:
        """This rank's slice of every collective of one group: the hot part of a big merge (2M slices).

        Built a column at a time at C speed (every collective's value for this rank at once, see GroupTable).
        The collectives that need a closer look (missing or different here, stalled, mismatched, without an
        end time; all of them with a window) go one by one through _collective_slice, in their place.
        """
        table = self.tables.get(uid)
        if table is None:
            table = self.tables[uid] = GroupTable(cols, self.flows.get(uid, {}), self.sites)
        rank = self.rank
        stalled = {seq: waits[rank] for (u, seq), waits in self.markers.stalled.items()
                   if u == uid and rank in waits}
        mismatched = {seq: kind for (u, seq), kind in self.markers.mismatched.items() if u == uid}
        arrive, ends = table.work_columns(rank)  # its GPU work where a trace shows it, else arrival to end
        sigs = table.column("signatures", rank)
        odd: Sequence[int]
        if self.window is not None:
            odd = range(len(arrive))
        else:
            odd = table.odd_positions(sigs, arrive, ends)
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
                                             table.shared_of(rank), itertools.repeat(NO_FLOWS)))
        if len(odd) < len(slices):
            self._seen(min(begins), max(stops))
        if odd:
            mine = _RankColumns(sigs, arrive, ends, *(table.column(name, rank)
                                                      for name in ("start_ns", "states", "stack_ids", "sources")))
            for k in odd:
                slices[k] = self._collective_slice(table, k, mine, stalled, mismatched)
        if self.enqueued:
            self._flow_from_enqueue(slices)
        items += filter(None, slices) if odd else slices  # type: ignore[arg-type]  # no None without odd ones

    def _enqueues(self) -> None:
        """Where the rank's traces show a collective's CPU enqueue (``record_param_comms``, drawn on its CPU ops
        track) and the kernels it launched (the same ``External id``): the kernels' first begin, on the job's
        clock, is where its slice on the group's track begins (``Collective.work_of``)."""
        for trace in self.job.traces.get(self.rank, ()):
            first: dict[int, int] = {}
            for ev in trace.gpu_events:
                if ev.klass == "comm" and ev.external_id is not None:
                    first[ev.external_id] = min(first.get(ev.external_id, ev.t_begin_ns), ev.t_begin_ns)
            if not first:
                continue
            for ev in trace.cpu_ops:
                if ev.name == "record_param_comms" and ev.external_id in first:
                    self.enqueued[first[ev.external_id]] = (ev.t_begin_ns, ev.t_end_ns)

    def _flow_from_enqueue(self, slices: list[Item | None]) -> None:
        """A flow from the CPU enqueue to each slice that is a collective's GPU work (see ``_enqueues``)."""
        assert self.flow_ids is not None
        for k, item in enumerate(slices):
            cpu = self.enqueued.get(item[0]) if item is not None else None
            if cpu is None or not self.inside(*cpu):
                continue
            fid = self.enqueue_flows[cpu[0]] = self.flow_ids()
            slices[k] = (*item[:6], ((), (), (fid,)))  # type: ignore[index]

    def _collective_slice(self, table: GroupTable, k: int, mine: _RankColumns, stalled: Mapping[int, Any],
                          mismatched: Mapping[int, str]) -> Item | None:
        """This rank's slice of the table's ``k``-th collective, the careful way (see _group_collectives), from
        the rank's columns: a view would decode every rank's values to give this one's. None: none here."""
        sig = mine.signatures[k]
        if sig is None:
            return None
        arrive, end = mine.begins[k], mine.ends[k]  # its GPU work where a trace shows it, else arrival to end
        begin = arrive if arrive is not None else (mine.starts[k] if mine.starts[k] is not None else end)
        if begin is None or not self.inside(begin, end if end is not None else begin):
            return None
        cols, index, common, flow = table.rows[k]
        if common.sig is not sig:  # the loader interns signatures: this rank disagrees with the first
            common = common.variant(cols[index], sig)
        state = mine.states[k]
        seq = table.seqs[k]
        waits = stalled.get(seq)
        role = None if flow is None else flow.role(self.rank)
        shared = common["stalled" if waits is not None else state, mine.stack_ids[k], mine.sources[k], role]
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
            # Gloo's Flight Recorder records no end time, a GPU collective's is the watchdog's: an instant where
            # the collective was issued.
            args["duration"] = (f"unknown ({NOT_DONE})" if state in NOT_DONE_STATES
                                else GPU_UNTIMED.format(gpu_untimed_reason(self.job, table.cols, (self.rank,)))
                                if table.on_gpu else "unknown (no end time recorded)")
        elif end < begin:
            stop = begin
        kind = mismatched.get(seq)
        if kind:
            args["mismatch"] = kind
        self._seen(begin, end)
        return (begin, stop, sig.op, args, "collective", shared, NO_FLOWS)

    def _p2p(self, tr: P2PTransfer, kind: str, op: P2POp, peer: int, uid: str, items: list[Item]) -> None:
        begin, end = op.t_arrive_ns, op.t_end_ns
        if begin is None or not self.inside(begin, end if end is not None else begin):
            return
        sig: Signature = op.signature
        group = self.job.groups[uid]
        args = {"peer": peer, "process_group": group.label, "index": tr.index,
                **signature_args(sig), "state": op.state, "matched": tr.matched, "source": op.source}
        if op.gpu_ns is not None:  # its batch's kernel: the GPU work, as a collective's slice is
            begin, end = op.gpu_ns
        elif end is not None and gpu_backend(group.backend):  # its end is the watchdog's (see GPU_UNTIMED)
            end = None
            args["duration"] = GPU_UNTIMED.format(P2P_ON_GPU)
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

    def _steps(self, log: RankLog | None) -> None:
        if (log is None or not log.steps) and self.kineto:
            self._profiler_steps(cpu=True)
            return
        bounds = [(step, t) for step, t, _source in (log.steps if log is not None else ())]
        log_end = self._log_end(log) if log is not None else None
        items: list[Item] = []
        for (step, t), nxt in zip(bounds, bounds[1:] + [None]):
            end = nxt[1] if nxt is not None else None
            if end is None:
                end = log_end
            if end is None or end < t or not self.inside(t, end):
                continue
            items.append((t, end, f"step {step}", {"step": step}, "step", None, NO_FLOWS))
        self.families.append(("steps", "step boundaries: optimizer steps, profiler steps or comm2perfetto.step()",
                              items))
        if self.kineto:  # the recorder's marks are the CPU's steps; the GPU's come from the profiler's kernels
            self._profiler_steps(cpu=False)

    def _profiler_steps(self, cpu: bool) -> None:
        """The traces' ``ProfilerStep#n`` as the CPU ran them (``cpu``: where the recorder marked no steps), and
        the same steps on the GPU: from the first kernel launched in the step to the first of the next step's
        (``sources.kineto.steps.gpu_step_spans``); a track only where a trace shows GPU work."""
        cpu_items: list[Item] = []
        gpu: list[Item] = []
        for trace in self.job.traces.get(self.rank, ()):
            for items, steps in ((cpu_items, trace.steps if cpu else ()),
                                 (gpu, trace.gpu_steps if trace.gpu_events else ())):
                for n, begin, end in steps:
                    if end >= begin and self.inside(begin, end):
                        items.append((begin, end, f"step {n}", {"step": n}, "step", None, NO_FLOWS))
        if cpu:
            self.families.append(("steps", "torch.profiler's ProfilerStep#n on the CPU", cpu_items))
        if gpu or cpu:
            self.families.append(("steps (GPU)", "the GPU work each step launched: from its first kernel to the "
                                  "next step's first kernel", gpu))

    def _log_end(self, log: RankLog) -> int | None:
        times = [c.t_return_ns or c.t_call_ns for c in log.calls[-1:]]
        times += [r.t_end_ns or r.t_begin_ns for r in log.ranges[-1:]]
        return max(times) if times else None

    def _python_calls(self, log: RankLog) -> None:
        by_thread: dict[int, list[Item]] = defaultdict(list)
        log_end = self._log_end(log)
        for call in log.calls:
            begin = call.t_call_ns
            end: Any = call.t_return_ns  # or UNCLOSED
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
                args["shapes"] = shapes_text(call.shapes)
                args["dtypes"] = ",".join(map(str, call.dtypes or ()))
            if call.nbytes is not None:
                args["bytes"] = call.nbytes
            if call.peer is not None:
                args["peer"] = str(call.peer)
            if call.t_done_ns is not None:
                args["completed_after_ns"] = call.t_done_ns - begin
            if call.error:
                args["error"] = call.error
            if end is None:
                # Never returned: stalled there if diagnose says this rank is stuck, else its data ends here.
                if self._stuck_in(call, log):
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

    def _stuck_in(self, call: Call, log: RankLog) -> bool:
        g = log.groups.get(call.gid)
        for (uid, seq), waits in self.markers.stalled.items():
            if self.rank in waits and g is not None and self.job.groups[uid].name == g.name and (
                    call.seq is None or call.seq <= seq <= (call.seq_last or call.seq)):
                return True
        return False

    def _ranges(self, log: RankLog) -> None:
        by_thread: dict[int, list[Item]] = defaultdict(list)
        log_end = self._log_end(log)
        for rng in log.ranges:
            begin = rng.t_begin_ns
            args: dict[str, Any] = {"source": rng.source}
            if rng.t_end_ns is not None:
                end = rng.t_end_ns
            else:
                args["state"] = "not closed (the rank's data ends here)"
                end = max(log_end or begin, begin)
            if not self.inside(begin, end):
                continue
            by_thread[rng.tid].append((begin, end, rng.name, args, "range", None, NO_FLOWS))
            self._seen(begin, end)
        for tid, items in sorted(by_thread.items(), key=lambda kv: kv[1][0][0]):
            self.families.append((_thread_name("ranges", tid, log.thread_names),
                                  "NVTX and comm2perfetto.range() ranges", items))

    def _recorder_events(self, log: RankLog) -> None:
        items: list[Item] = []
        for s in log.stalls:
            t = s.t_ns
            args: dict[str, Any] = {"reason": s.reason}
            if s.trigger_rank is not None:
                args["trigger_rank"] = s.trigger_rank
            if s.stacks_file:
                args["stacks_file"] = s.stacks_file
            items.append((t, None, "stall detected", args, "recorder", None, NO_FLOWS))
        for t, path, reason in log.fr_dumps:
            items.append((t, None, "Flight Recorder dump", {"file": path, "reason": reason},
                          "recorder", None, NO_FLOWS))
        for t, message in log.warnings:
            items.append((t, None, "recorder warning", {"message": message}, "recorder", None,
                          NO_FLOWS))
        for t, name, tid, source in log.marks:
            items.append((t, None, name, {"source": source, "thread": str(tid)}, "mark", None,
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
        shared: dict[int, SharedArgs] = {}  # id(detail) -> its SharedArgs: encoded once
        flow_ids = itertools.count(KINETO_FLOW_BASE + (self.rank << 32))
        for trace in self.job.traces.get(self.rank, ()):
            names.update(trace.lane_names)
            launches, kernels = self._launch_flows(trace, flow_ids) if self.kineto_detail else ({}, {})
            for k, ev in enumerate(trace.gpu_events):
                fid = kernels.get(k) if kernels else None
                flows = ((), (), (fid,)) if fid is not None else NO_FLOWS
                self._kineto_item(ev, gpu.setdefault(ev.lane, []), ev.klass, shared, flows)
            for ev in trace.cpu_ops:
                fids = launches.get(ev.correlation) if launches and ev.correlation is not None \
                    and ev.kind.endswith(CPU_KIND_SUFFIXES) else None
                flows = (tuple(fids), (), ()) if fids else NO_FLOWS
                self._kineto_item(ev, cpu.setdefault(ev.lane, []), cpu_class(ev.kind, ev.name), shared, flows)
        for lane, items in cpu.items():
            self.families.append((f"cpu ops ({names.get(lane, lane)})", "torch.profiler CPU ops", items))
        for lane, items in gpu.items():
            self.families.append((names.get(lane, lane),
                                  "kernels, memcpy and memset: class compute, comm or memory", items))

    def _launch_flows(self, trace: Any, flow_ids: Iterator[int]) -> tuple[dict[int, list[int]], dict[int, int]]:
        """Flows from each runtime launch (``cudaLaunchKernel``, ``cuLaunchKernelEx``...) to the GPU work of the
        same correlation id, as Kineto's ``ac2g`` flow events link them: (correlation -> the flow ids its launch
        starts, one per GPU event; index in ``trace.gpu_events`` -> the flow id that event ends). Only where
        both ends are drawn (inside the window): a flow needs two ends."""
        launches = {ev.correlation: ev for ev in trace.cpu_ops
                    if ev.correlation is not None and ev.kind.endswith(CPU_KIND_SUFFIXES)}
        starts: dict[int, list[int]] = {}
        ends: dict[int, int] = {}
        if not launches:
            return starts, ends
        inside = self.inside
        for k, ev in enumerate(trace.gpu_events):
            launch = launches.get(ev.correlation)
            if launch is None:
                continue
            begin, at = ev.t_begin_ns, launch.t_begin_ns
            if inside(begin, begin + max(ev.duration_ns, 0)) and inside(at, at + max(launch.duration_ns, 0)):
                fid = ends[k] = next(flow_ids)
                starts.setdefault(ev.correlation, []).append(fid)
        return starts, ends

    def _kineto_item(self, ev, items: list[Item], klass: str | None, shared: dict[int, SharedArgs],
                     flows: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]) -> None:
        """``klass``: the class ``report`` counts the event in (a kernel's, or ``classify.cpu_class``'s for a CPU
        op: compute, comm, or None for what only wraps work), in its args as ``class``."""
        begin = ev.t_begin_ns
        end = begin + max(ev.duration_ns, 0)
        if self.window is not None and not self.window(begin, end):
            return
        args = dict(ev.args) if ev.args else {}
        if klass:
            args["class"] = klass
        fid = self.enqueue_flows.get(begin) if self.enqueue_flows and ev.name == "record_param_comms" else None
        if fid is not None:  # the enqueue's flow to its collective's GPU slice (see _flow_from_enqueue)
            flows = (flows[0] + (fid,), flows[1], flows[2])
        common = None
        if self.kineto_detail:
            if ev.external_id is not None:
                args["External id"] = ev.external_id
            if ev.correlation is not None:
                args["correlation"] = ev.correlation
            detail = ev.detail
            if detail:
                common = shared.get(id(detail))
                if common is None:
                    common = shared[id(detail)] = SharedArgs(dict(detail))
        items.append((begin, end, ev.name, args, ev.klass or ev.kind, common, flows))
        self._seen(begin, end)

    def preview_row(self) -> PreviewRow:
        """What the preview draws of diagnose's findings on this rank (its classes come from ``report.classes``)."""
        spans = [(b, 2**62, "stalled") for b in self.stalled]  # to the end of the picture
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



def _thread_name(what: str, tid: Any, names: dict[int, str]) -> str:
    """``python calls (MainThread)`` where the recorder wrote the thread's name (the id too when another thread
    of the rank has the same name), ``python calls (thread 139624980982656)`` where not."""
    name = names.get(tid)
    if name is None:
        return f"{what} (thread {tid})"
    if sum(1 for other in names.values() if other == name) > 1:
        return f"{what} ({name}, thread {tid})"
    return f"{what} ({name})"

