"""Match every rank's records into one ``Collective`` per (process group, sequence number). No torch.

Input: ``Sources`` (Flight Recorder columns and recorder event logs per rank, see ``sources.discover``).
Output: a ``Job`` (see ``model.py``) with, per process group, its collectives in seq order and its
point-to-point transfers, each rank's coverage, and the clock alignment.

How records meet:

- A process group is identified across ranks by its c10d name (FR ``process_group[0]``, the recorder's
  ``g`` record) plus its global ranks: from FR ``pg_config`` when it names them, else from the recorder's
  ``g`` record, else every rank for the default group ``"0"``, else the ranks whose dumps mention it.
- Collectives meet by ``collective_seq_id``; the recorder's ``seq`` is the same number (it discounts the
  sequence numbers gloo's p2p ops consume, see docs/log-format.md).
- On one rank, a recorder call and the FR entry with the same key become one record: the recorder's op and
  sizes, as the user called it, with what FR knows beyond them (output sizes, where FR's entry is the same
  operation; FR's name kept as ``fr_op``: ``joined_signature``), the recorder's arrival (the Python call) and
  end (the return), FR's start.
- Point-to-point ops pair per (group, sender, receiver) in issue order: the i-th send from A to B with B's
  i-th recv from A (NCCL and gloo deliver in that order). FR's batched ops are paired the same way.
- Profiler traces (``sources.kineto.collectives``) add their collectives: by the trace's ``Seq`` where it has
  one, joined to the FR entry or recorder call of the same (group, seq), which gets the kernel's GPU begin and
  end; by order in the trace otherwise, only on ranks with no other record of that group. The kernels' ends
  also refine the clock alignment (a collective's kernels end together on every rank).
"""


from __future__ import annotations

import bisect
import dataclasses
import functools
import gc
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from itertools import zip_longest
from pathlib import Path
from types import MappingProxyType
from typing import Any, cast

from comm2perfetto.align import measured_offsets, refine, refine_by_differences
from comm2perfetto.group_columns import (
    GroupCollectives,
    Rows,
    Track,
    completed_upto,
    first_last,
    rows_of,
    shift_track,
)
from comm2perfetto.group_names import GroupConflict
from comm2perfetto.group_names import conflicts as group_conflicts
from comm2perfetto.model import (
    COMPLETED,
    FAILED,
    PENDING,
    ROOTED_FAMILIES,
    UNKNOWN,
    ClockAlignment,
    Collective,
    Coverage,
    Frame,
    Job,
    P2POp,
    P2PTransfer,
    ProcessGroup,
    RankInfo,
    RankProfile,
    Signature,
    Stack,
    op_family,
)
from comm2perfetto.sources.discover import (
    PARALLEL_MIN_RANKS,
    Sources,
    adopt_traces,
    cores,
    drop_traces,
    dumps_world,
    load_sources,
)
from comm2perfetto.sources.event_log import Group, StallStacks
from comm2perfetto.sources.fr.columns import NO_VALUE, STATE_CODE, GroupTrack
from comm2perfetto.sources.fr.dump import CollectiveStacks, read_fr_dump
from comm2perfetto.sources.fr.fields import ANY_GROUP
from comm2perfetto.sources.fr.ingest import FrRankTrace
from comm2perfetto.sources.fr.tables import contiguous
from comm2perfetto.sources.kineto.collectives import SEQ, TraceCollective, collectives_of, numbered, order_numbers
from comm2perfetto.sources.limits import Ranks

LOG_P2P = {"send": "send", "isend": "send", "recv": "recv", "irecv": "recv"}
# Recorder calls that are point-to-point transfers rather than collectives.
LOG_P2P_CALLS = frozenset({"send", "isend", "recv", "irecv", "batch_isend_irecv", "send_object_list",
                           "recv_object_list"})


# What of the profiler traces a command needs (``load_job(traces=...)``).
TRACES_NONE = "none"  # left out (--no-profiler)
TRACES_COLLECTIVES = "collectives"  # their communication events only, for the matching (diagnose)
TRACES_SPANS = "spans"  # also unions of compute and communication per rank (``Job.profiles``: report)
TRACES_EVENTS = "events"  # every event (``Job.traces``: merge draws them)
TRACE_MODES = (TRACES_NONE, TRACES_COLLECTIVES, TRACES_SPANS, TRACES_EVENTS)


def load_job(
    paths: Sequence[str | Path], force: bool = False, with_stacks: bool = True,
    workers: int | None = None, progress: Callable[[int, int], None] | None = None, align: bool = True,
    read_traces: bool = True, trace_ranks: Mapping[str, int] | None = None, attempt: int | None = None, *,
    sample: bool = False, traces: str | None = None, whole_us: bool = False, hta_scope: bool = False,
    trace_progress: Callable[[int, int], None] | None = None,
) -> Job:
    """Discover, load, align and match everything under ``paths``: the one way every command loads a job.
    Raises ``SourceError`` on bad input.

    What each command needs: stacks eager (``with_stacks=True``: merge draws them all) or lazy (read on demand
    by ``Job.stack_of``: diagnose needs a handful); ``traces`` one of ``TRACE_MODES`` (default: ``events``, or
    ``none`` with ``read_traces=False``), read in worker processes except ``events``; ``whole_us`` and
    ``hta_scope``: read the spans as HTA does. ``workers``: processes reading the ranks' files (default: every
    core from 32 ranks on). ``progress(done, total)`` follows the reading of ranks' dumps, ``trace_progress``
    that of their traces. ``align=False`` keeps every rank's own clock (no offsets applied). ``trace_ranks``:
    the ranks of traces that do not say theirs (``--trace-rank``). ``attempt``: which attempt of a job torchrun
    restarted (default the last; see ``sources.discover``). ``sample``: the ranks with data are a sample of
    the job (``--sample``; see ``Job.sampled``).
    """
    mode = traces or (TRACES_EVENTS if read_traces else TRACES_NONE)
    if mode not in TRACE_MODES:
        raise ValueError(f"traces={mode!r}: one of {', '.join(TRACE_MODES)}")
    # Loading builds millions of containers that all stay alive: the cyclic GC would rescan them over and
    # over (it tripled load time at 256 ranks) and can find nothing to free. Paused, then restored.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        src = load_sources(paths, force=force, with_stacks=with_stacks,
                           workers=workers, progress=progress, read_traces=mode == TRACES_EVENTS,
                           trace_ranks=trace_ranks, attempt=attempt)
        profiles: dict[int, RankProfile] = {}
        if mode == TRACES_NONE:
            drop_traces(src)
        elif mode != TRACES_EVENTS and src.kineto:
            from comm2perfetto.sources.kineto.profile import read_profiles  # only where there are traces

            n = workers if workers is not None else _trace_workers(src.kineto)
            profiles = read_profiles(src.kineto, workers=n, progress=trace_progress, whole_us=whole_us,
                                     hta_scope=hta_scope, collectives=True)
            adopt_traces(src, {r: list(p.traces) for r, p in profiles.items()}, force=force)
        job = build_job(src, lazy_stacks=not with_stacks, align=align, sample=sample)
        if mode != TRACES_SPANS:
            return job
        return dataclasses.replace(job, profiles=MappingProxyType(profiles_on_clock(job, profiles)))
    finally:
        if was_enabled:
            gc.enable()


def profiles_on_clock(job: Job, profiles: Mapping[int, RankProfile]) -> dict[int, RankProfile]:
    """Profiles read on each rank's own clock (``sources.kineto.profile.read_profiles``), moved onto the job's."""
    return {rank: p.shifted(job.clock.offset_ns.get(rank, 0)) for rank, p in profiles.items()}


PARALLEL_TRACE_BYTES = 64 << 20  # below this much of profiler traces, starting workers costs more than it saves


def _trace_workers(kineto: Mapping[int, list[Path]]) -> int:
    """Processes to read the profiler traces in: every core for big traces (or many ranks), else this one."""
    paths = [p for ps in kineto.values() for p in ps]
    if len(kineto) < 2:
        return 1
    if len(kineto) >= PARALLEL_MIN_RANKS or sum(p.stat().st_size for p in paths if p.exists()) >= PARALLEL_TRACE_BYTES:
        return min(len(kineto), cores())
    return 1


def build_job(src: Sources, lazy_stacks: bool = False, align: bool = True, sample: bool = False) -> Job:
    """Align and match loaded sources into a ``Job`` (groups, collectives, p2p transfers, coverage, clock).
    ``sample``: the ranks with data are a sample of the job (``Job.sampled``).

    Every time the Job holds is on its clock (rank 0's, or each rank's own with ``align=False``): the readers
    give each rank's own, and this moves them once, after aligning: the Flight Recorder tracks, the logs and the
    profiler traces in place (a ``Sources`` builds one Job), the stall stacks as moved copies."""
    world = _world_size(src)
    notes = list(src.notes)
    trace_cols = {rank: collectives_of(traces) for rank, traces in src.traces.items()}
    groups, local, conflicts = _resolve_groups(src, world, notes, trace_cols)
    tracks: dict[tuple[int, str], Track] = {}
    p2p_ops: dict[str, list[P2POp]] = defaultdict(list)
    log_seen: dict[str, set[int]] = defaultdict(set)

    for rank, trace in src.fr.items():
        for key, gt in trace.groups.items():
            uid = local.get((rank, key[0]))
            if uid is None:
                continue
            if len(gt):
                tracks[(rank, uid)] = gt
            p2p_ops[uid].extend(_fr_p2p(rank, gt, groups[uid]))
    sites = _SiteInterner(src.stack_table)
    unnumbered: dict[str, dict[int, list[tuple]]] = defaultdict(dict)
    for rank, log in src.logs.items():
        _merge_log(rank, log, groups, local, tracks, p2p_ops, log_seen, sites, unnumbered)
    _number_by_order(unnumbered, groups, tracks, log_seen, notes)
    gpu_ends = _merge_traces(trace_cols, local, tracks, notes)

    if align:
        ends = _precise_ends(tracks)
        for rank, by_key in gpu_ends.items():  # a kernel's end beats a CPU return
            ends.setdefault(rank, {}).update(by_key)
        reference = 0 if 0 in ends or not ends else min(ends)
        clock = refine(measured_offsets(src.logs, src.ranks), ends, reference)
        # Plain dumps carry no measurement: their completed collectives show a skew of seconds, if any.
        fr_ends = _FrEndDifferences(tracks, src.logs, reference)
        clock = refine_by_differences(clock, fr_ends.ranks(), fr_ends, reference, min_correction_ns=FR_SKEW_NS,
                                      only_assumed=True)
    else:
        clock = ClockAlignment(method=MappingProxyType({r: "none" for r in src.ranks}))
    coverage = _coverage(src, groups, tracks)
    stacks = tuple(src.stack_table.stacks)
    collectives = {uid: _collectives(groups[uid], tracks, clock, stacks) for uid in groups}
    p2p = {uid: _pair(uid, ops, clock) for uid, ops in p2p_ops.items()}
    for rank, log in src.logs.items():
        log.shift(clock.offset_ns.get(rank, 0))
    for rank, traces in src.traces.items():
        for kineto_trace in traces:
            kineto_trace.shift(clock.offset_ns.get(rank, 0))
    return Job(
        world_size=world,
        ranks=MappingProxyType(_rank_infos(src)),
        groups=MappingProxyType(groups),
        collectives=MappingProxyType(collectives),
        p2p=MappingProxyType(p2p),
        coverage=MappingProxyType(coverage),
        stacks=stacks,
        clock=clock,
        skipped=tuple(src.skipped),
        notes=tuple(notes),
        logs=MappingProxyType(dict(src.logs)),
        stall_stacks=MappingProxyType(_stacks_at_stalls(src, clock)),
        job_info=src.job_info,
        jobs=tuple(src.jobs),
        unusable_ranks=frozenset(src.unusable_ranks - src.ranks),
        log_seqs=MappingProxyType({uid: frozenset(s) for uid, s in log_seen.items()}),
        traces=MappingProxyType({rank: tuple(traces) for rank, traces in src.traces.items()}),
        resolver=LazyStacks(src) if lazy_stacks else None,
        attempt=src.attempt,
        attempts=src.attempts,
        sampled=_sampled(src, world, sample),
        group_conflicts=tuple(conflicts),
    )


# A rank's stacks belong to a stall when written this soon after it was detected: every rank's watchdog answers
# another's stall at its next tick (a second), a few seconds late on a loaded host.
STACKS_WINDOW_NS = 5 * 10**9


def _stacks_at_stalls(src: Sources, clock: ClockAlignment) -> dict[int, StallStacks]:
    """Each rank's stacks at a stall, on the job's clock: the latest it wrote within ``STACKS_WINDOW_NS`` of a
    stall some rank detected on its own call (logs shifted already), and before its process began to end (a
    ``u`` record). A rank that could not write at the stall (frozen: its recorder's thread did not run) wrote
    later, on its way out: that is no stack at the stall, and it is left out. Without any detected stall (stacks
    without logs), each rank's latest."""
    detected = sorted(st.t_ns for log in src.logs.values() for st in log.stalls if st.reason != "remote")
    out = {}
    for rank, docs in src.stacks.items():
        moved = [d.shifted(clock.offset_ns.get(rank, 0)) for d in docs]
        if detected:
            log = src.logs.get(rank)
            ending = min((e.t_ns for e in log.endings), default=None) if log is not None else None
            moved = [d for d in moved if d.t_ns is not None and (ending is None or d.t_ns < ending) and any(
                -10**9 <= d.t_ns - t <= STACKS_WINDOW_NS for t in detected)]  # written just before its k record
        if moved:
            out[rank] = moved[-1]
    return out


# --- world and groups ------------------------------------------------------------------------------------


def _world_size(src: Sources) -> int | None:
    world = dumps_world(src)
    if world is not None:
        return world
    for traces in src.traces.values():
        for kt in traces:
            if kt.world_size:
                return kt.world_size
    ranks = src.ranks
    return max(ranks) + 1 if ranks else None


def _resolve_groups(
    src: Sources, world: int | None, notes: list[str], trace_cols: dict[int, list[TraceCollective]] | None = None,
) -> tuple[dict[str, ProcessGroup], dict[tuple[int, str], str], list[GroupConflict]]:
    """Every process group of the job, which one each rank's local name means, and the groups the ranks know by
    different names (``group_names``: created in different orders). Groups that share a description are shown
    with their name (``X (group 2)``)."""
    # (rank, name) -> (desc, ranks or None, source, backend)
    local: dict[tuple[int, str], tuple[str, Ranks | None, str, str | None]] = {}
    for rank, trace in src.fr.items():
        for name, desc in trace.groups:
            cfg = trace.pg_config.get(name)
            ranks = cfg.ranks if cfg is not None and cfg.ranks and rank in cfg.ranks else None
            local[(rank, name)] = (desc, ranks, "pg_config" if ranks else "", trace.backend or None)
        for name, cfg in trace.pg_config.items():
            if name and cfg.ranks and rank in cfg.ranks and (rank, name) not in local:
                local[(rank, name)] = (cfg.desc, cfg.ranks, "pg_config", trace.backend or None)
    for rank, log in src.logs.items():
        for g in log.groups.values():
            name = str(g.name)
            old = local.get((rank, name))
            ranks = g.ranks or None
            if old is None:
                local[(rank, name)] = (g.desc, ranks, "log" if ranks else "", g.backend)
            elif old[1] is None and ranks:
                local[(rank, name)] = (old[0] if _meaningful(old[0]) else g.desc, ranks, "log", g.backend)
            elif not _meaningful(old[0]) and _meaningful(g.desc):
                local[(rank, name)] = (g.desc, old[1], old[2], old[3] or g.backend)
    for rank, cols in (trace_cols or {}).items():  # profiler traces: "Process Group Name" / "... Ranks"
        for c in cols:
            if c.pg_name is None:
                continue
            ranks = c.pg_ranks if c.pg_ranks and rank in c.pg_ranks else None
            old = local.get((rank, c.pg_name))
            if old is None:
                local[(rank, c.pg_name)] = (c.pg_desc or "", ranks, "profiler" if ranks else "", None)
            elif old[1] is None and ranks:
                local[(rank, c.pg_name)] = (old[0] if _meaningful(old[0]) else c.pg_desc or "", ranks, "profiler",
                                            old[3])
    # Unresolved memberships: the default group is the world; others, the ranks that mention them.
    mentions: dict[str, set[int]] = defaultdict(set)
    for (rank, name), (_, ranks, _, _) in local.items():
        if ranks is None:
            mentions[name].add(rank)
    groups: dict[str, ProcessGroup] = {}
    out: dict[tuple[int, str], str] = {}
    inferred_ranks = {name: tuple(sorted(ranks)) for name, ranks in mentions.items()}
    for (rank, name), (desc, ranks, source, backend) in sorted(local.items()):
        if ranks is None:
            if name == "0" and world:
                ranks, source = range(world), "world"
            else:
                ranks, source = inferred_ranks[name], "inferred"
        uid = _uid(name, ranks)
        known = groups.get(uid)
        if known is None or (not _meaningful(known.desc) and _meaningful(desc)):
            groups[uid] = ProcessGroup(uid, name, desc, tuple(ranks), backend, source)
        out[(rank, name)] = uid
    inferred = sorted({g.label for g in groups.values() if g.ranks_source == "inferred"})
    if inferred:
        notes.append(
            "members of group(s) " + ", ".join(inferred) + " were inferred from the ranks whose dumps "
            "mention them (the dumps do not list them); a member that left no data is not counted"
        )
    named = ((rank, name, desc, groups[out[(rank, name)]].ranks) for (rank, name), (desc, *_rest) in local.items())
    conflicts = group_conflicts(named)
    # No text calls two groups by one name: a group the ranks describe differently (they created their groups
    # in different orders) goes by its c10d name and every description, others sharing one by it and the name.
    descs: dict[str, Counter[str]] = defaultdict(Counter)
    for conflict in conflicts:
        for name, ranks in conflict.names.items():
            for uid in {out[(r, name)] for r in ranks if (r, name) in out}:
                descs[uid][conflict.desc] += len(ranks)
    # Groups of one description and other members are told apart by their members (DeviceMesh's mesh_tp of
    # ranks 0, 1 and of ranks 2, 3); of one description and the same members, only their name tells them apart.
    by_label = Counter((g.label, len(g.ranks), g.ranks[0] if g.ranks else None) for g in groups.values())
    for uid, pg in groups.items():
        if uid in descs and len(descs[uid]) > 1:
            shown = f"group {pg.name} ({'/'.join(d for d, _ in descs[uid].most_common())})"
            groups[uid] = dataclasses.replace(pg, shown=shown)
        elif by_label[(pg.label, len(pg.ranks), pg.ranks[0] if pg.ranks else None)] > 1 and pg.label != pg.name:
            groups[uid] = dataclasses.replace(pg, shown=f"{pg.label} (group {pg.name})")
    return groups, out, conflicts


def _meaningful(desc: str | None) -> bool:
    return bool(desc) and desc != "undefined"


@functools.lru_cache(maxsize=4096)
def _uid(name: str, ranks: Ranks) -> str:
    # Every rank of a group asks: cached, by a key that hashes in no time where the ranks are a range.
    return f"{name}[{','.join(map(str, ranks))}]"


# --- per-rank tracks -------------------------------------------------------------------------------------


def _fr_p2p(rank: int, gt: GroupTrack, group: ProcessGroup) -> list[P2POp]:
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


def _merge_log(
    rank: int, log, groups: dict[str, ProcessGroup], local: dict[tuple[int, str], str],
    tracks: dict[tuple[int, str], Track], p2p_ops: dict[str, list[P2POp]], log_seen: dict[str, set[int]],
    sites: _SiteInterner, unnumbered: dict[str, dict[int, list[tuple]]],
) -> None:
    """Add one rank's recorder calls to its tracks (merging with FR rows of the same key) and p2p ops; the
    collectives without a sequence number go, in order, to ``unnumbered[uid][rank]`` (``_number_by_order``)."""
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
                (sig, state, call.t_call_ns, end, site, cpu and state == COMPLETED))
            continue
        first = call.seq
        last = call.seq_last if call.seq_last is not None else first
        sig = _log_signature(call)
        for key in range(first, max(first, last) + 1):
            row_sig = sig if key == first else Signature(call.op, None, None, None, None, "log")
            rows[uid][key] = (row_sig, state, call.t_call_ns, end, site, cpu and state == COMPLETED)
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


def _number_by_order(unnumbered: dict[str, dict[int, list[tuple]]], groups: dict[str, ProcessGroup],
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


def _merge_traces(trace_cols: dict[int, list[TraceCollective]], local: dict[tuple[int, str], str],
                  tracks: dict[tuple[int, str], Track], notes: list[str]) -> dict[int, dict[tuple[str, int], int]]:
    """Add each rank's profiler-trace collectives to its tracks (see the module docstring); returns the
    kernels' end times by (group uid, seq) per rank, for the clock alignment."""
    gpu_ends: dict[int, dict[tuple[str, int], int]] = defaultdict(dict)
    no_group = untied = 0  # collectives of no named group; of those, kernels no record_param_comms is tied to
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
    if no_group:
        why = [f"{untied} tied to no record_param_comms of the trace by External id (launched before the profiler "
               "started, or a trace that does not tie them)"] if untied else []
        if no_group > untied:
            why.append(f"{no_group - untied} whose record_param_comms names none either")
        notes.append(f"{no_group} collective(s) of profiler traces name no process group, so they are drawn on their "
                     f"GPU streams but not matched across ranks: {'; '.join(why)}")
    if not_joined:
        notes.append("profiler traces without sequence numbers (Seq) were not joined to the Flight Recorder or "
                     f"recorder records of group(s) {', '.join(sorted(not_joined))}")
    return gpu_ends


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
            values = (_trace_signature(c), COMPLETED, arrive, c.t_begin_ns, c.t_end_ns, None, "kineto", None)
        else:
            arrive = track.arrive[i] if track.arrive[i] is not None else c.t_call_ns
            values = (track.sigs[i], COMPLETED, arrive, c.t_begin_ns, c.t_end_ns, track.stack_ids[i],
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


def _best_state(fr_state: str, log_state: str) -> str:
    if log_state == FAILED:  # the call raised; gloo's Flight Recorder counts a failed work as completed too
        return FAILED
    if COMPLETED in (fr_state, log_state):
        return COMPLETED
    if log_state in (PENDING, FAILED):
        return log_state
    return fr_state if fr_state != UNKNOWN else log_state


def _log_state(call, cpu: bool) -> tuple[str, int | None]:
    """State and end time of a recorder call; ``cpu``: it had completed when it returned."""
    if call.error is not None:
        return FAILED, call.t_return_ns
    if call.t_done_ns is not None:
        return COMPLETED, call.t_done_ns
    if call.t_return_ns is None:
        return PENDING, None
    if cpu:
        return COMPLETED, call.t_return_ns
    return UNKNOWN, None


class _SiteInterner:
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


# --- clock, coverage -------------------------------------------------------------------------------------


FR_SKEW_NS = 50_000_000  # Flight Recorder's completion times lag by a watchdog poll: only a larger skew is fixed


# Flight Recorder's completion times are a coarse source (a watchdog poll late): a median over this many
# collectives of a group, spread evenly over the ring, finds a skew of FR_SKEW_NS as well as all of them would,
# and keeps the cost per rank flat (every collective compared one by one took 1.1 s at 2,048 ranks x 2,000).
FR_END_SAMPLES = 256


class _FrEndDifferences:
    """When each rank's Flight Recorder saw its collectives complete (NCCL's watchdog: a late bound) against
    when the reference rank's did, for the ranks without an event log: what ``align.refine_by_differences``
    reads. gloo's entries never complete, so none there. A rank's differences are computed when asked, from
    its columns, and not kept."""

    def __init__(self, tracks: dict[tuple[int, str], Track], logs: Mapping[int, object], reference: int) -> None:
        self._tracks: dict[int, list[tuple[str, Track]]] = {}
        for (rank, uid), tr in tracks.items():
            if rank not in logs and (isinstance(tr, GroupTrack) or tr.sources is None):
                self._tracks.setdefault(rank, []).append((uid, tr))
        self._reference = dict(self._tracks.get(reference, ()))

    def ranks(self) -> list[int]:
        """The ranks to refine: none without the reference's completions."""
        return list(self._tracks) if self._reference else []

    def __call__(self, rank: int) -> list[int]:
        out: list[int] = []
        for uid, tr in self._tracks[rank]:
            ref = self._reference.get(uid)
            if ref is not None:
                out.extend(_end_differences(tr, ref))
        return out


def _end_differences(tr: Track, ref: Track) -> list[int]:
    """``tr``'s completion time minus ``ref``'s for collectives both completed, over at most ``FR_END_SAMPLES``
    seqs evenly spaced: slices of the columns where both tracks hold one row per seq (the common case)."""
    if isinstance(tr, GroupTrack) and isinstance(ref, GroupTrack) and contiguous(tr.seq_col) \
            and contiguous(ref.seq_col):
        lo, hi = max(tr.seq_col[0], ref.seq_col[0]), min(tr.seq_col[-1], ref.seq_col[-1])
        if hi < lo:
            return []
        n = hi - lo + 1
        step = -(-n // FR_END_SAMPLES)
        i, j = lo - tr.seq_col[0], lo - ref.seq_col[0]
        return [a - b for a, b, sa, sb in zip(tr.completed_col[i:i + n:step], ref.completed_col[j:j + n:step],
                                              tr.state_col[i:i + n:step], ref.state_col[j:j + n:step])
                if sa == sb == _DONE and a != NO_VALUE and b != NO_VALUE]
    ref_ends = _completed_ends(ref)
    pairs = [(seq, end) for seq, end in _completed_ends(tr).items() if seq in ref_ends]
    return [end - ref_ends[seq] for seq, end in pairs[::-(-len(pairs) // FR_END_SAMPLES) or 1]]


_DONE = STATE_CODE[COMPLETED]


def _completed_ends(tr: Track) -> dict[int, int]:
    """seq -> completion time of a track's collectives known completed."""
    if isinstance(tr, GroupTrack):
        return {seq: end for seq, code, end in zip(tr.seq_col, tr.state_col, tr.completed_col)
                if code == _DONE and end != NO_VALUE}
    return {seq: t for seq, state, t in zip(tr.seqs, tr.states, tr.end) if state == COMPLETED and t is not None}


def _precise_ends(tracks: dict[tuple[int, str], Track]) -> dict[int, dict[tuple[str, int], int]]:
    out: dict[int, dict[tuple[str, int], int]] = defaultdict(dict)
    for (rank, uid), tr in tracks.items():
        if not isinstance(tr, Rows):
            continue  # Flight Recorder alone: no precise end
        for seq, t in tr.log_ends.items():
            out[rank][(uid, seq)] = t
    return out


def _coverage(
    src: Sources, groups: dict[str, ProcessGroup], tracks: dict[tuple[int, str], Track]
) -> dict[tuple[int, str], Coverage]:
    out: dict[tuple[int, str], Coverage] = {}
    for uid, group in groups.items():
        for rank in group.ranks:
            fr = src.fr.get(rank)
            has_log = rank in src.logs
            if fr is None and not has_log:
                continue
            tr = tracks.get((rank, uid))
            wrapped = fr is not None and _wrapped(fr) and not has_log
            if tr is None or not len(tr):
                first, last = (1 << 62 if wrapped else 0), -1
            else:
                low, last = first_last(tr)
                first = low if wrapped else 0
            upto = completed_upto(tr) if tr is not None and len(tr) else -1
            unread = (fr.unread.get(group.name, ()) + fr.unread.get(ANY_GROUP, ())) if fr is not None else ()
            unread_p2p = fr is not None and not fr.unread_p2p.isdisjoint((group.name, ANY_GROUP))
            out[(rank, uid)] = Coverage(rank, uid, first, last, fr is not None, has_log, upto, unread, unread_p2p)
    return out


def _sampled(src: Sources, world: int | None, sample: bool) -> str | None:
    """What the coverage of ranks without data means (``Job.sampled``): a job larger than its ranks with data
    is a sample when the data are profiler traces alone, or when the user says so."""
    if world is None or world <= len(src.ranks):
        return None
    if src.traces and not src.fr and not src.logs:
        return "traces"
    return "data" if sample else None


def _wrapped(trace: FrRankTrace) -> bool:
    """True when the ring buffer overwrote the rank's first records (its oldest record id is not 0)."""
    ids = [gt.first_record_id for gt in trace.groups.values()]
    ids += [min((row[8] for row in gt.p2p if row[8] != NO_VALUE), default=NO_VALUE) for gt in trace.groups.values()]
    ids = [i for i in ids if i != NO_VALUE]  # NO_VALUE: none, or none readable
    return bool(ids) and min(ids) > 0


# --- transposition into collectives ----------------------------------------------------------------------


def _collectives(
    group: ProcessGroup, tracks: dict[tuple[int, str], Track], clock: ClockAlignment, stacks: tuple
) -> GroupCollectives:
    """The group's collectives as views over its members' tracks, moved onto the job's clock here, once."""
    members = [tracks.get((r, group.uid)) for r in group.ranks]
    for rank, tr in zip(group.ranks, members):
        if tr is not None:
            shift_track(tr, clock.offset_ns.get(rank, 0))
    return GroupCollectives(group, members, stacks)


def _pair(uid: str, ops: list[P2POp], clock: ClockAlignment) -> tuple[P2PTransfer, ...]:
    sends: dict[tuple[int, int], list[P2POp]] = defaultdict(list)
    recvs: dict[tuple[int, int], list[P2POp]] = defaultdict(list)
    for op in ops:
        off = clock.offset_ns.get(op.rank, 0)
        if off:
            op = P2POp(op.rank, op.group_uid, op.kind, op.peer, op.index, op.signature, op.state,
                       op.t_arrive_ns + off if op.t_arrive_ns is not None else None,
                       op.t_end_ns + off if op.t_end_ns is not None else None, op.stack_id, op.source, op.seq)
        if op.kind == "send":
            sends[(op.rank, op.peer)].append(op)
        else:
            recvs[(op.peer, op.rank)].append(op)
    out = []
    for pair in sorted(set(sends) | set(recvs)):
        for i, (s, r) in enumerate(zip_longest(sends.get(pair, ()), recvs.get(pair, ()))):
            out.append(P2PTransfer(uid, pair[0], pair[1], i, s, r))
    return tuple(out)


def _rank_infos(src: Sources) -> dict[int, RankInfo]:
    """Each rank's files and what its log says of its life (the logs already on the job's clock)."""
    out = {}
    for rank in sorted(src.ranks):
        log = src.logs.get(rank)
        fr = src.fr.get(rank)
        header = log.header if log is not None else {}
        stall = (header.get("config") or {}).get("stall_after_s") if isinstance(header.get("config"), dict) else None
        out[rank] = RankInfo(
            rank=rank, host=header.get("host"), pid=header.get("pid"),
            fr_files=tuple(fr.files) if fr else (), log_file=str(log.path) if log else None,
            stacks_files=tuple(d.path for d in src.stacks.get(rank, ())),
            kineto_files=tuple(str(p) for p in src.kineto.get(rank, ())),
            closed_cleanly=log.closed_cleanly if log is not None else None,
            backend=header.get("backend") or (fr.backend if fr else None),
            first_ns=log.first_ns if log is not None else None,
            last_ns=log.last_ns if log is not None else None,
            closed_reason=log.closed_reason if log is not None else None,
            endings=tuple((e.t_ns, e.cause, e.detail) for e in log.endings) if log is not None else (),
            heartbeats=bool(log is not None and log.heartbeats),
            alive=None if rank not in src.alive else src.alive[rank] != "gone",
            stopped=src.alive.get(rank) == "stopped",
            stall_after_ns=int(stall * 1e9) if isinstance(stall, (int, float)) and stall > 0 else None,
        )
    return out


class LazyStacks:
    """Call stacks read on demand from a rank's Flight Recorder files (see ``load_job(with_stacks=False)``).

    A report asks for a handful (the culprits' and a few others'): the first question about a rank reads its
    dumps once and keeps what finds its stacks (``CollectiveStacks``: four columns of its entries); the latest
    ranks asked about are kept, not every rank's.
    """

    KEPT_RANKS = 16

    def __init__(self, src: Sources) -> None:
        self._files = {rank: list(trace.files) for rank, trace in src.fr.items()}
        self._table = src.stack_table
        self._by_rank: dict[tuple[int, bool], CollectiveStacks] = {}

    def __call__(self, rank: int, pg_name: str, seq: int, p2p: bool = False) -> Stack:
        known = self._by_rank.get((rank, p2p))
        if known is None:
            dumps = []
            for path in self._files.get(rank, ()):
                try:
                    dumps.append(read_fr_dump(path))  # bounded and gunzipped as at load
                except ValueError:
                    continue  # it was readable a moment ago; without it there is just no stack
            if len(self._by_rank) >= self.KEPT_RANKS:
                del self._by_rank[next(iter(self._by_rank))]
            known = self._by_rank[(rank, p2p)] = CollectiveStacks(dumps, self._table, p2p)
        return known.get((pg_name, seq), ())


def find_collective(cols: Sequence[Collective], seq: int) -> Collective | None:
    """The collective with this seq in a group's seq-ordered collectives."""
    if isinstance(cols, GroupCollectives):
        return cols.find(seq)
    i = bisect.bisect_left(cols, seq, key=lambda c: c.seq)
    return cols[i] if i < len(cols) and cols[i].seq == seq else None
