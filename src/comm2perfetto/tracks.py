"""Each rank's records of each process group as one track (``group_columns.Track``): its Flight Recorder columns,
its recorder calls and its profiler traces' collectives, joined by (group, seq), and its point-to-point ops.
``match.build_job`` runs these per rank, then aligns the clocks and makes the group views. No torch.

- On one rank, a recorder call and the FR entry with the same key become one row: the recorder's op and sizes,
  as the user called it, with what FR knows beyond them (output sizes, where FR's entry is the same operation;
  FR's name kept as ``fr_op``: ``joined_signature``), the recorder's arrival (the Python call) and end (the
  return), FR's start; the best-known state of the two.
- A group whose backend numbers no collective (the recorder's calls carry no seq) is numbered by the order of
  each rank's calls, where no rank has a seq on it (``number_by_order``).
- Profiler traces' collectives (``sources.kineto.collectives``) join the row of the same (group, seq), which
  gets the kernel's GPU begin and time; on a trace without ``Seq``, by order, only on ranks with no other record
  of that group (``merge_traces``).
- A CPU backend's collectives that no source timed (gloo's Flight Recorder times none, and the patch layer does
  not see DDP's) take the times of the backend's own annotation of their run in the rank's profiler traces
  (``gloo:all_reduce`` on a gloo worker thread), found through the ``c10d::`` op that enqueued them
  (``time_by_backend_annotations``).
- Send and recv ops (``P2POp``) come from Flight Recorder where it recorded the rank's, else from the recorder.
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

from comm2perfetto.group_columns import Rows, Track, rows_of
from comm2perfetto.model import (
    ROOTED_FAMILIES,
    CallState,
    Frame,
    P2POp,
    ProcessGroup,
    Signature,
    gpu_backend,
    op_family,
)
from comm2perfetto.sources.event_log import Group
from comm2perfetto.sources.fr.columns import GroupTrack
from comm2perfetto.sources.kineto.classify import BACKEND_ANNOTATION
from comm2perfetto.sources.kineto.collectives import SEQ, TraceCollective, numbered, order_numbers
from comm2perfetto.sources.kineto.comm_kernels import family_op
from comm2perfetto.sources.kineto.events import KinetoCommEvent, KinetoTrace

__all__ = ["LOG_P2P_CALLS", "SiteInterner", "fr_p2p", "joined_signature", "merge_log", "merge_traces",
           "number_by_order", "parse_site", "time_by_backend_annotations"]

LOG_P2P = {"send": "send", "isend": "send", "recv": "recv", "irecv": "recv"}
# Recorder calls that are point-to-point transfers rather than collectives.
LOG_P2P_CALLS = frozenset({"send", "isend", "recv", "irecv", "batch_isend_irecv", "send_object_list",
                           "recv_object_list"})


def fr_p2p(rank: int, gt: GroupTrack, group: ProcessGroup) -> list[P2POp]:
    out = []
    counters: dict[tuple[str, int], int] = defaultdict(int)
    for kind, peer_local, p2p_seq, sig, state, created, completed, sid, _rid in gt.p2p:
        if kind not in ("send", "recv") or peer_local is None:
            continue
        peer = group.global_rank(peer_local)
        if peer is None:
            continue
        # FR's send sizes are inputs, a recv's are outputs: compare what travels.
        sizes = sig.input_sizes if kind == "send" else sig.output_sizes
        dtypes = sig.input_dtypes if kind == "send" else sig.output_dtypes
        psig = Signature(kind, sizes, dtypes, None, None, "fr")
        i = counters[(kind, peer)]
        counters[(kind, peer)] += 1
        out.append(P2POp(rank, group.uid, kind, peer, i, psig, state, created, completed, sid, "fr", p2p_seq))
    return out


def merge_log(
    rank: int, log, groups: dict[str, ProcessGroup], local: dict[tuple[int, str], str],
    tracks: dict[tuple[int, str], Track], p2p_ops: dict[str, list[P2POp]], log_seen: dict[str, set[int]],
    sites: SiteInterner, unnumbered: dict[str, dict[int, list[tuple]]],
) -> None:
    """Add one rank's recorder calls to its tracks (merging with FR rows of the same key) and p2p ops; the
    collectives without a sequence number go, in order, to ``unnumbered[uid][rank]`` (``number_by_order``)."""
    rows: dict[str, dict[int, tuple]] = defaultdict(dict)  # uid -> key -> row
    p2p_counters: dict[tuple[str, str, int], int] = defaultdict(int)
    log_groups: dict[int, Group] = {}  # groups whose `g` record names no backend, with the job's
    # Where FR recorded this rank's p2p ops on a group, they are the source; the recorder's are not added.
    have_fr_p2p = {uid for uid, ops in p2p_ops.items() if ops and any(op.rank == rank for op in ops)} \
        if p2p_ops else set()
    for call in log.calls:
        g = log.groups.get(call.gid)
        if g is None or call.captured:  # a CUDA graph capture issues nothing then; its replays are unseen
            continue
        uid = local.get((rank, str(g.name)))
        if uid is None:
            continue
        if not g.backend and not g.devices:  # the log does not say which backend: the group's (FR's)
            if call.gid not in log_groups:
                log_groups[call.gid] = dataclasses.replace(g, backend=groups[uid].backend or "")
            g = log_groups[call.gid]
        cpu = g.completes_on_return(call)  # return is completion (a synchronous call on the CPU)
        state, end = _log_state(call, cpu)
        site = sites(call.site)
        if call.op in LOG_P2P_CALLS:
            if uid in have_fr_p2p:
                continue
            for kind, peer, sizes, dtypes in _log_p2p_ops(call):
                i = p2p_counters[(uid, kind, peer)]
                p2p_counters[(uid, kind, peer)] += 1
                sig = Signature(kind, sizes, dtypes, None, None, "log")
                p2p_ops[uid].append(P2POp(rank, uid, kind, peer, i, sig, state, call.t_call_ns, end, site, "log"))
            continue
        if call.seq is None:
            sig = _log_signature(call)
            unnumbered[uid].setdefault(rank, []).append(
                (sig, state, call.t_call_ns, end, site, cpu and state == CallState.COMPLETED))
            continue
        first = call.seq
        last = call.seq_last if call.seq_last is not None else first
        sig = _log_signature(call)
        for key in range(first, max(first, last) + 1):
            row_sig = sig if key == first else Signature(call.op, None, None, None, None, "log")
            rows[uid][key] = (row_sig, state, call.t_call_ns, end, site, cpu and state == CallState.COMPLETED)
            log_seen[uid].add(key)
    for uid, by_key in rows.items():
        tracks[(rank, uid)] = _merge_rows(tracks.get((rank, uid)), by_key)


def _log_signature(call) -> Signature:
    """What a recorder call asked of a collective: its op, input shapes and dtypes, root, and the sizes gloo
    checks only by aborting a rank (an all-to-all's per-peer counts, an object collective's list length)."""
    root = call.peer if isinstance(call.peer, int) and op_family(call.op) in ROOTED_FAMILIES else None
    return Signature(call.op, _tuple_sizes(call.shapes), _tuple_names(call.dtypes), None, None, "log", root=root,
                     exchange=call.exchange, objects=call.objects)


def joined_signature(fr: Signature, log: Signature) -> Signature:
    """One rank's signature of a collective both Flight Recorder (``fr``) and the recorder (``log``) saw: the
    recorder's op and sizes, as the user called it, and FR's name as ``fr_op`` (the same name mostly; gloo's
    Flight Recorder names ``reduce_scatter_tensor`` ``all_reduce``, ``all_gather_into_tensor`` ``all_gather``,
    ``all_to_all_single`` ``all_to_all``, and an object collective after the collectives it is made of).
    FR's output sizes and dtypes stay where its entry is the same operation (same op family); where the
    backend implements the call by another collective they describe that one, and are left out. An object
    collective (no tensors of the user's) keeps FR's sizes: those of the tensors torch made of the objects.
    ``source`` stays ``fr``: the FR fields kept are exact, and Flight Recorder's own name is in ``fr_op``.

    >>> fr = Signature("all_reduce", ((4,),), ("Float",), ((4,),), ("Float",))
    >>> s = joined_signature(fr, Signature("reduce_scatter_tensor", ((4,),), ("Float",), None, None, "log"))
    >>> s.op, s.fr_op, s.input_sizes, s.output_sizes, s.source
    ('reduce_scatter_tensor', 'all_reduce', ((4,),), None, 'fr')
    """
    if fr.parts:  # a coalesced group: FR knows its members, the recorder one call
        return dataclasses.replace(fr, fr_op=fr.op)
    tensors = bool(log.input_sizes)  # an object collective's call has none, a later row of a multi-call no sizes
    if not tensors or op_family(fr.op) == op_family(log.op):
        inputs, dtypes = (log.input_sizes, log.input_dtypes) if tensors else (fr.input_sizes, fr.input_dtypes)
        outputs, out_dtypes = fr.output_sizes, fr.output_dtypes
    else:
        inputs, dtypes, outputs, out_dtypes = log.input_sizes, log.input_dtypes, None, None
    return Signature(log.op, inputs, dtypes, outputs, out_dtypes, "fr", root=log.root if log.root is not None
                     else fr.root, exchange=log.exchange, objects=log.objects, fr_op=fr.op)


def number_by_order(unnumbered: dict[str, dict[int, list[tuple]]], groups: dict[str, ProcessGroup],
                     tracks: dict[tuple[int, str], Track], log_seen: dict[str, set[int]], notes: list[str]) -> None:
    """Number the recorder's collectives that carry no sequence number (a group whose backend keeps no counter)
    by their order on each rank: the i-th collective a rank issued on a group meets every other rank's i-th.
    Only on a group where no rank has a sequence number for any collective (Flight Recorder's or the
    recorder's): order numbers cannot be placed among those."""
    ranks_of: dict[str, set[int]] = defaultdict(set)
    for rank, uid in tracks:
        ranks_of[uid].add(rank)
    for uid, by_rank in sorted(unnumbered.items()):
        label = groups[uid].label
        if ranks_of.get(uid):
            notes.append(f"{sum(map(len, by_rank.values()))} collective(s) on {label} carry no sequence number "
                         f"while others do: left out of matching")
            continue
        for rank, rows in by_rank.items():
            tracks[(rank, uid)] = _merge_rows(None, {i: row for i, row in enumerate(rows, 1)})
            log_seen[uid].update(range(1, len(rows) + 1))
        notes.append(f"collectives on {label} carry no sequence number (its backend keeps none): matched across "
                     f"ranks by their order on each rank")


def _merge_rows(track: Track | None, rows: dict[int, tuple]) -> Rows:
    """Fold recorder rows (by key) into the FR track of the same rank and group (or make a new one)."""
    fr = rows_of(track) if track is not None else None
    index = {s: i for i, s in enumerate(fr.seqs)} if fr is not None else {}
    out = Rows([], [], [], [], [], [], [], [], [], {})
    # every column of the new rows (sources and log_sigs are lists here, not None)
    columns: tuple[list[Any], ...] = (out.sigs, out.states, out.arrive, out.start, out.end, out.stack_ids,
                                      _listed(out.sources), _listed(out.log_sigs))
    durations = fr.durations if fr is not None else None
    if durations is not None:
        out.durations = [durations[index[key]] if key in index else None for key in sorted(set(index) | set(rows))]
    values: tuple[Any, ...]
    joins: dict[tuple[Signature, Signature], Signature] = {}  # equal pairs share one joined signature
    for key in sorted(set(index) | set(rows)):
        i = index.get(key)
        row = rows.get(key)
        if i is None:  # the recorder only
            assert row is not None
            sig, state, t_call, t_end, site, precise = row
            values = (sig, state, t_call, None, t_end, site, "log", sig)
        elif row is None:  # Flight Recorder only
            assert fr is not None
            values = (fr.sigs[i], fr.states[i], fr.arrive[i], fr.start[i], fr.end[i], fr.stack_ids[i], "fr", None)
            precise = False
        else:  # both: the joined signature, FR's start, the recorder's arrival and end
            assert fr is not None and row is not None
            sig, state, t_call, t_end, site, precise = row
            joined = (fr.sigs[i], sig)
            both = joins.get(joined)
            if both is None:
                both = joins[joined] = joined_signature(*joined)
            values = (
                both, _best_state(fr.states[i], state), t_call if t_call is not None else fr.arrive[i],
                fr.start[i], t_end if t_end is not None else fr.end[i],
                fr.stack_ids[i] if fr.stack_ids[i] is not None else site, "fr+log", sig,
            )
        for column, value in zip(columns, values):
            column.append(value)
        out.seqs.append(key)
        if precise and values[4] is not None:
            out.log_ends[key] = values[4]
    return out


def merge_traces(trace_cols: dict[int, list[TraceCollective]], local: dict[tuple[int, str], str],
                  tracks: dict[tuple[int, str], Track], notes: list[str],
                  ungrouped: dict[int, list[TraceCollective]] | None = None) -> dict[int, dict[tuple[str, int], int]]:
    """Add each rank's profiler-trace collectives to its tracks (see the module docstring); returns the
    kernels' end times by (group uid, seq) per rank, for the clock alignment. The kernels of a library that
    never names a group (``comm_kernels.family_op``: DeepEP's all-to-all) go to ``ungrouped``, per rank: what they
    did is known (their family's operation), with whom is not."""
    gpu_ends: dict[int, dict[tuple[str, int], int]] = defaultdict(dict)
    no_group = untied = 0  # collectives of no named group; of those, kernels no record_param_comms is tied to
    library: Counter[str] = Counter()  # of those, kernels of a library that launches no record_param_comms
    not_joined: set[str] = set()
    # groups some rank knows from FR or the recorder: numbers by order in a trace would not be their seqs
    recorded = {uid for (_rank, uid), track in tracks.items() if len(track)}
    numbered_cols: list[tuple[int, str, str, list, list[TraceCollective]]] = []
    places: dict[str, list[tuple[int, int]]] = defaultdict(list)  # uid -> every rank's order places
    for rank, cols in sorted(trace_cols.items()):
        by_uid: dict[str, list[TraceCollective]] = defaultdict(list)
        for c in cols:
            uid = local.get((rank, c.pg_name)) if c.pg_name is not None else None
            if uid is None:
                if c.pg_name is None and c.t_call_ns is None and family_op(c.family) is not None:
                    library[c.family or ""] += 1
                    if ungrouped is not None:
                        ungrouped.setdefault(rank, []).append(c)
                    continue
                no_group += 1
                untied += c.on_gpu and c.t_call_ns is None
                continue
            by_uid[uid].append(c)
        for uid, group_cols in by_uid.items():
            numbering, keys = numbered(group_cols)
            if numbering != SEQ:
                if uid in recorded:
                    not_joined.add(uid)  # numbered by order: cannot be placed among FR's or the recorder's seqs
                    continue
                places[uid].extend(cast(list[tuple[int, int]], keys))
            numbered_cols.append((rank, uid, numbering, keys, group_cols))
    numbers = {uid: order_numbers(p) for uid, p in places.items()}
    for rank, uid, numbering, keys, group_cols in numbered_cols:
        seqs = cast(list[int], keys) if numbering == SEQ else [numbers[uid][k]
                                                                for k in cast(list[tuple[int, int]], keys)]
        rows: dict[int, TraceCollective] = {}
        for seq, c in zip(seqs, group_cols):
            rows[seq] = c
            if c.on_gpu:
                gpu_ends[rank][(uid, seq)] = c.t_end_ns
        tracks[(rank, uid)] = _join_trace_rows(tracks.get((rank, uid)), rows)
    only = Counter(c.pg_desc or f"group {c.pg_name}" for cols in trace_cols.values() for c in cols if c.only_group)
    for label, count in sorted(only.items()):
        notes.append(f"{count} collective(s) of profiler traces name no process group (no CPU op ties one to its "
                     f"kernel): read as collectives of {label}, the only group their traces' distributedInfo lists")
    if no_group:
        why = [f"{untied} tied to no record_param_comms of the trace by External id (launched before the profiler "
               "started, or a trace that does not tie them)"] if untied else []
        if no_group > untied:
            why.append(f"{no_group - untied} whose record_param_comms names none either")
        notes.append(f"{no_group} collective(s) of profiler traces name no process group, so they are drawn on their "
                     f"GPU streams but not matched across ranks: {'; '.join(why)}")
    if library:
        notes.append(f"{sum(library.values())} kernel(s) of {', '.join(sorted(library))} (a library that launches "
                     "no record_param_comms: its kernels name no process group and carry no sizes) are counted as "
                     "its operation in the collectives table, each rank's on its own: not matched across ranks, and "
                     "no per-peer sizes")
    if not_joined:
        notes.append("profiler traces without sequence numbers (Seq) were not joined to the Flight Recorder or "
                     f"recorder records of group(s) {', '.join(sorted(not_joined))}")
    return gpu_ends


def time_by_backend_annotations(traces: Mapping[int, Sequence[KinetoTrace]], groups: Mapping[str, ProcessGroup],
                                tracks: dict[tuple[int, str], Track]) -> int:
    """Time the collectives of CPU backends that no source timed from the rank's profiler traces; returns how
    many were timed. gloo runs each collective on a worker thread of its group, where the profiler records its
    run (``gloo:all_reduce``, no args); the training thread records the ``c10d::allreduce_`` op that enqueued
    it, inside which Flight Recorder created its entry (``time_created``). So an entry whose creation falls
    inside a ``c10d::`` op of its op family is that op's collective, and it ran as the first annotation of the
    family not yet taken that began after the op began, on a worker thread of no other group (each group has
    its own workers, and runs its queue in order). The row keeps its arrival (Flight Recorder's creation) and
    takes the annotation's begin and end as its start and end.

    Seen on torch 2.13 with DDP on gloo, one training step::

        {"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "tid": 14018, "ts": 968118.4, "dur": 80.0}
        {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "tid": 14129, "ts": 968244.6,
         "dur": 1189.4}

    with the rank's Flight Recorder entry of that all_reduce created at 968157.4 (us, on the trace's clock)."""
    timed = 0
    for rank, rank_traces in traces.items():
        rows = {uid: rows_of(track) for (r, uid), track in tracks.items()
                if r == rank and not gpu_backend(groups[uid].backend)}
        untimed = sorted((arrive, uid, i) for uid, track in rows.items()
                         for i, (arrive, end) in enumerate(zip(track.arrive, track.end))
                         if arrive is not None and end is None and track.sigs[i] is not None)
        if not untimed:
            continue
        events = [e for t in rank_traces for e in t.comm_events if not e.on_gpu]
        ops = sorted((e for e in events if e.name.startswith("c10d::")), key=_begin)
        runs = _BackendRuns(e for e in events if BACKEND_ANNOTATION.match(e.name))
        found: dict[str, dict[int, KinetoCommEvent]] = defaultdict(dict)
        for (_, uid, i), op in zip(untimed, _enclosing(ops, [arrive for arrive, _, _ in untimed])):
            sig = rows[uid].sigs[i]
            family = op_family(sig.fr_op or sig.op)
            if op is not None and op_family(op.name.removeprefix("c10d::").rstrip("_")) == family:
                run = runs.take(family, op.t_begin_ns, uid)
                if run is not None:
                    found[uid][i] = run
        for uid, by_row in found.items():
            tracks[(rank, uid)] = _with_run_times(rows[uid], by_row)
            timed += len(by_row)
    return timed


def _begin(e: KinetoCommEvent) -> int:
    return e.t_begin_ns


def _enclosing(ops: list[KinetoCommEvent], times: list[int]) -> list[KinetoCommEvent | None]:
    """For each of ``times`` (ascending), the latest-begun op (``ops`` sorted by begin) whose span holds it, or
    None: one sweep, with the ops begun so far in a heap by their end."""
    out: list[KinetoCommEvent | None] = []
    open_ops: list[tuple[int, int]] = []  # (end, index)
    j = 0
    for t in times:
        while j < len(ops) and ops[j].t_begin_ns <= t:
            heapq.heappush(open_ops, (ops[j].t_end_ns, j))
            j += 1
        while open_ops and open_ops[0][0] < t:
            heapq.heappop(open_ops)
        holding = [k for end, k in open_ops if end >= t]
        out.append(ops[max(holding)] if holding else None)
    return out


class _BackendRuns:
    """A rank's backend annotations (``gloo:all_reduce``) by op family, in begin order, each taken once, each
    worker thread serving one group."""

    def __init__(self, events: Iterable[KinetoCommEvent]) -> None:
        self.runs: dict[str, list[KinetoCommEvent]] = defaultdict(list)
        for e in events:
            self.runs[op_family(e.name.partition(":")[2])].append(e)
        self.begins: dict[str, list[int]] = {}
        for family, runs in self.runs.items():
            runs.sort(key=_begin)
            self.begins[family] = [r.t_begin_ns for r in runs]
        self.taken: set[int] = set()
        self.worker_group: dict[Any, str] = {}

    def take(self, family: str, after: int, uid: str) -> KinetoCommEvent | None:
        """The first annotation of ``family`` begun at ``after`` or later, not taken, on a worker thread of no
        other group than ``uid``; None when there is none."""
        runs = self.runs.get(family, [])
        for k in range(bisect.bisect_left(self.begins.get(family, []), after), len(runs)):
            run = runs[k]
            if id(run) in self.taken or self.worker_group.setdefault(run.tid, uid) != uid:
                continue
            self.taken.add(id(run))
            return run
        return None


def _with_run_times(rows: Rows, runs: Mapping[int, KinetoCommEvent]) -> Rows:
    """The rows with each of ``runs``' row started and ended as its annotation; ``+kineto`` added to its source."""
    sources = list(rows.sources) if rows.sources is not None else ["fr"] * len(rows.seqs)
    start, end = list(rows.start), list(rows.end)
    for i, run in runs.items():
        start[i], end[i] = run.t_begin_ns, run.t_end_ns
        sources[i] = f"{sources[i]}+kineto"
    return dataclasses.replace(rows, start=start, end=end, sources=sources)


def _listed(column: list | None) -> list:
    """A column that ``Rows`` types as optional, which this caller made a list."""
    assert column is not None
    return column


def _trace_signature(c: TraceCollective) -> Signature:
    sizes = ((c.in_nelems,),) if c.in_nelems is not None else None
    out = ((c.out_nelems,),) if c.out_nelems is not None else None
    dtypes = (c.dtype,) if c.dtype else None
    return Signature(c.op, sizes, dtypes, out, dtypes if out is not None else None, "kineto")


def _join_trace_rows(fr: Track | None, rows: dict[int, TraceCollective]) -> Rows:
    """Fold trace collectives (by seq) into a rank's track: a row of the same seq keeps its signature, state
    and call site and takes the kernel's begin and end (the recorder's return stays the arrival's partner).
    The kernels are the row's GPU time: their begin and first-begin-to-last-end (over Flight Recorder's
    duration_ms, which times the same work with CUDA events but says nothing of when it began)."""
    track = rows_of(fr) if fr is not None else None
    if track is None:
        track = Rows([], [], [], [], [], [], [], [], [], {})
    index = {s: i for i, s in enumerate(track.seqs)}
    out = Rows([], [], [], [], [], [], [], [], [], dict(track.log_ends))
    # every column of the new rows (sources and log_sigs are lists here, not None)
    columns: tuple[list[Any], ...] = (out.sigs, out.states, out.arrive, out.start, out.end, out.stack_ids,
                                      _listed(out.sources), _listed(out.log_sigs))
    keys = sorted(set(index) | set(rows))
    if track.durations is not None or any(c.on_gpu for c in rows.values()):
        kernels = {key: c for key, c in rows.items() if c.on_gpu}
        fr_gpu = track.durations or []
        out.durations = [kernels[key].t_end_ns - kernels[key].t_begin_ns if key in kernels
                         else fr_gpu[index[key]] if fr_gpu and key in index else None for key in keys]
        out.gpu_begins = [kernels[key].t_begin_ns if key in kernels else None for key in keys]
    sources = track.sources if track.sources is not None else ["fr"] * len(track.seqs)
    log_sigs = track.log_sigs if track.log_sigs is not None else [None] * len(track.seqs)
    values: tuple[Any, ...]
    for key in keys:
        i, c = index.get(key), rows.get(key)
        if c is None:
            assert i is not None
            values = (track.sigs[i], track.states[i], track.arrive[i], track.start[i], track.end[i],
                      track.stack_ids[i], sources[i], log_sigs[i])
        elif i is None:
            arrive: int | None = c.t_call_ns if c.t_call_ns is not None else c.t_begin_ns
            values = (_trace_signature(c), CallState.COMPLETED, arrive, c.t_begin_ns, c.t_end_ns, None, "kineto", None)
        else:
            arrive = track.arrive[i] if track.arrive[i] is not None else c.t_call_ns
            values = (track.sigs[i], CallState.COMPLETED, arrive, c.t_begin_ns, c.t_end_ns, track.stack_ids[i],
                      f"{sources[i]}+kineto", log_sigs[i])
        for column, value in zip(columns, values):
            column.append(value)
        out.seqs.append(key)
    return out


def _log_p2p_ops(call) -> list[tuple[str, int, tuple | None, tuple | None]]:
    """(kind, peer, sizes, dtypes) of each transfer a recorder p2p call made.

    ``batch_isend_irecv`` lists ``[op, peer]`` pairs in ``peer`` and one shape per op; object sends are
    not paired (their sizes are pickled objects).
    """
    if call.op == "batch_isend_irecv":
        pairs = call.peer if isinstance(call.peer, list) else []
        shapes = call.shapes if isinstance(call.shapes, list) and len(call.shapes) == len(pairs) else None
        dtypes = call.dtypes if isinstance(call.dtypes, list) and len(call.dtypes) == len(pairs) else None
        out = []
        for i, pair in enumerate(pairs):
            if not isinstance(pair, (list, tuple)) or len(pair) != 2 or not isinstance(pair[1], int):
                continue
            kind = LOG_P2P.get(str(pair[0]))
            if kind is None:
                continue
            out.append((kind, pair[1], _tuple_sizes([shapes[i]]) if shapes else None,
                        (dtypes[i],) if dtypes else None))
        return out
    kind = LOG_P2P.get(call.op)
    if kind is None or not isinstance(call.peer, int):
        return []
    return [(kind, call.peer, _tuple_sizes(call.shapes), _tuple_names(call.dtypes))]


def _best_state(fr_state: CallState, log_state: CallState) -> CallState:
    if log_state == CallState.FAILED:  # the call raised; gloo's Flight Recorder counts a failed work as completed too
        return CallState.FAILED
    if CallState.COMPLETED in (fr_state, log_state):
        return CallState.COMPLETED
    if log_state in (CallState.PENDING, CallState.FAILED):
        return log_state
    return fr_state if fr_state != CallState.UNKNOWN else log_state


def _log_state(call, cpu: bool) -> tuple[CallState, int | None]:
    """State and end time of a recorder call; ``cpu``: it had completed when it returned."""
    if call.error is not None:
        return CallState.FAILED, call.t_return_ns
    if call.t_done_ns is not None:
        return CallState.COMPLETED, call.t_done_ns
    if call.t_return_ns is None:
        return CallState.PENDING, None
    if cpu:
        return CallState.COMPLETED, call.t_return_ns
    return CallState.UNKNOWN, None


class SiteInterner:
    """The recorder's call sites (``train.py:57 main``) as one-frame stacks in the job's stack table."""

    def __init__(self, table) -> None:
        self.table = table
        self.cache: dict[str, int] = {}

    def __call__(self, site: str | None) -> int | None:
        if not site:
            return None
        sid = self.cache.get(site)
        if sid is None:
            f = parse_site(site)
            sid = self.cache[site] = self.table.intern((self.table.frame(f.file, f.line, f.func),))
        return sid


def _tuple_sizes(raw) -> tuple[tuple[int, ...], ...] | None:
    try:
        return tuple(tuple(s) for s in raw) if raw is not None else None
    except TypeError:
        return None


def _tuple_names(raw) -> tuple[str, ...] | None:
    return tuple(raw) if isinstance(raw, (list, tuple)) else None


def parse_site(site: str) -> Frame:
    """``train.py:57 main`` -> Frame("train.py", 57, "main")."""
    loc, _, func = site.partition(" ")
    file, _, line = loc.rpartition(":")
    if not file or not line.isdigit():
        return Frame(loc, 0, func)
    return Frame(file, int(line), func)
