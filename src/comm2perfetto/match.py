"""The one door into a job: ``load_job(paths, options)`` reads everything under ``paths`` as ``options`` say
(``load_options``: a preset per product) and matches every rank's records into one ``Collective`` per (process
group, sequence number). No torch.

Input: ``Sources`` (Flight Recorder columns, recorder event logs and profiler traces per rank, see
``sources.read``). Output: a ``Job`` (``job.py``) with, per process group, its collectives in seq order and
its point-to-point transfers, each rank's coverage, and the clock alignment.

How records meet:

- A process group is identified across ranks by its c10d name (FR ``process_group[0]``, the recorder's
  ``g`` record) plus its global ranks: from FR ``pg_config`` when it names them, else from the recorder's
  ``g`` record, else every rank for the default group ``"0"``, else the ranks whose dumps mention it.
- Collectives meet by ``collective_seq_id``; the recorder's ``seq`` is the same number (it discounts the
  sequence numbers gloo's p2p ops consume, see docs/log-format.md). Each rank's records of a group, from every
  source, are first joined into one track (``tracks.py``).
- Point-to-point ops pair per (group, sender, receiver) in issue order: the i-th send from A to B with B's
  i-th recv from A (NCCL and gloo deliver in that order). FR's batched ops are paired the same way.
- The clocks are aligned (``align.py``: an offset and, over a long run, a drift per rank) on what ends together
  on every rank: the recorder's returns, the profiler traces' kernel ends, Flight Recorder's completion times (a
  watchdog poll late, so only a large skew); then every time the job holds is moved onto the job's clock, once,
  here, each rank's through one map (``ClockAlignment.of(rank)``).
"""


from __future__ import annotations

import dataclasses
import functools
import gc
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from itertools import zip_longest
from pathlib import Path
from types import MappingProxyType
from typing import Any

from comm2perfetto.align import measured_offsets, refine, refine_by_differences
from comm2perfetto.group_columns import (
    GroupCollectives,
    Rows,
    Track,
    completed_upto,
    first_last,
    shift_track,
)
from comm2perfetto.group_names import GroupConflict
from comm2perfetto.group_names import conflicts as group_conflicts
from comm2perfetto.job import Coverage, Job, RankExit, RankInfo
from comm2perfetto.load_options import MERGE, LoadOptions
from comm2perfetto.model import (
    CallState,
    ClockAlignment,
    ClockMethod,
    P2POp,
    P2PTransfer,
    ProcessGroup,
    Stack,
    gpu_backend,
)
from comm2perfetto.sources.checks import dumps_world
from comm2perfetto.sources.fr.columns import NO_VALUE, STATE_CODE, GroupTrack
from comm2perfetto.sources.fr.dump import CollectiveStacks, read_fr_dump
from comm2perfetto.sources.fr.fields import ANY_GROUP
from comm2perfetto.sources.fr.ingest import FrRankTrace, fr_job_notes
from comm2perfetto.sources.fr.tables import contiguous
from comm2perfetto.sources.kineto.collectives import TraceCollective, collectives_of, shifted
from comm2perfetto.sources.kineto.p2p import p2p_batches
from comm2perfetto.sources.limits import Ranks
from comm2perfetto.sources.read import Sources, load_sources
from comm2perfetto.sources.stacks import StallStacks
from comm2perfetto.tracks import (
    SiteInterner,
    fr_p2p,
    merge_log,
    merge_traces,
    number_by_order,
    time_by_backend_annotations,
)


def load_job(paths: Sequence[str | Path], options: LoadOptions = MERGE) -> Job:
    """Discover, load, align and match everything under ``paths`` as ``options`` say (``load_options``: a preset
    per product): the one way every command loads a job. Raises ``SourceError`` on bad input."""
    # Loading builds millions of containers that all stay alive: the cyclic GC would rescan them over and
    # over (it tripled load time at 256 ranks) and can find nothing to free. Paused, then restored.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return build_job(load_sources(paths, options), options, paths)
    finally:
        if was_enabled:
            gc.enable()


def build_job(src: Sources, options: LoadOptions = MERGE, paths: Sequence[str | Path] = ()) -> Job:
    """Align and match loaded sources into a ``Job`` (groups, collectives, p2p transfers, coverage, clock), as
    ``options`` say (lazy stacks, alignment, a sample); ``paths``: where they were read from.

    Every time the Job holds is on its clock (rank 0's, or each rank's own with ``align=False``): the readers
    give each rank's own, and this moves them once, after aligning: the Flight Recorder tracks, the logs and the
    profiler traces in place (a ``Sources`` builds one Job), the stall stacks and the profiles as moved copies."""
    world = _world_size(src)
    notes = list(src.notes)
    notes.extend(fr_job_notes(src.fr))
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
            p2p_ops[uid].extend(fr_p2p(rank, gt, groups[uid]))
    sites = SiteInterner(src.stack_table)
    unnumbered: dict[str, dict[int, list[tuple]]] = defaultdict(dict)
    for rank, log in src.logs.items():
        merge_log(rank, log, groups, local, tracks, p2p_ops, log_seen, sites, unnumbered)
    number_by_order(unnumbered, groups, tracks, log_seen, notes)
    _p2p_kernels(p2p_ops, groups, src, notes)
    ungrouped: dict[int, list[TraceCollective]] = {}
    gpu_ends = merge_traces(trace_cols, local, tracks, notes, ungrouped)
    time_by_backend_annotations(src.traces, groups, tracks)

    if options.align:
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
        clock = ClockAlignment(method=MappingProxyType({r: ClockMethod.NONE for r in src.ranks}))
    coverage = _coverage(src, groups, tracks)
    stacks = tuple(src.stack_table.stacks)
    collectives = {uid: _collectives(groups[uid], tracks, clock, stacks) for uid in groups}
    p2p = {uid: _pair(uid, ops, clock) for uid, ops in p2p_ops.items()}
    for rank, log in src.logs.items():
        log.shift(clock.of(rank))
    for rank, traces in src.traces.items():
        for kineto_trace in traces:
            kineto_trace.shift(clock.of(rank))
    return Job(
        world_size=world,
        ranks=MappingProxyType(_rank_infos(src, clock)),
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
        kernel_collectives=MappingProxyType({rank: tuple(shifted(c, clock.of(rank)) for c in cols)
                                             for rank, cols in ungrouped.items()}),
        resolver=None if options.stacks else LazyStacks(src),
        profiles=MappingProxyType({rank: p.shifted(clock.of(rank)) for rank, p in src.profiles.items()}),
        attempt=src.attempt,
        attempts=src.attempts,
        sampled=_sampled(src, world, options.sample),
        group_conflicts=tuple(conflicts),
        paths=tuple(map(str, paths)),
        options=dataclasses.replace(options, progress=None, trace_progress=None),
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
        moved = [d.shifted(clock.of(rank)) for d in docs]
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
    world = dumps_world(src.logs, src.fr)
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

    def __call__(self, rank: int) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        for uid, tr in self._tracks[rank]:
            ref = self._reference.get(uid)
            if ref is not None:
                out.extend(_end_differences(tr, ref))
        return out


def _end_differences(tr: Track, ref: Track) -> list[tuple[int, int]]:
    """``(tr's completion time, that minus ref's)`` for collectives both completed, over at most
    ``FR_END_SAMPLES`` seqs evenly spaced: slices of the columns where both tracks hold one row per seq (the
    common case)."""
    if isinstance(tr, GroupTrack) and isinstance(ref, GroupTrack) and contiguous(tr.seq_col) \
            and contiguous(ref.seq_col):
        lo, hi = max(tr.seq_col[0], ref.seq_col[0]), min(tr.seq_col[-1], ref.seq_col[-1])
        if hi < lo:
            return []
        n = hi - lo + 1
        step = -(-n // FR_END_SAMPLES)
        i, j = lo - tr.seq_col[0], lo - ref.seq_col[0]
        return [(a, a - b) for a, b, sa, sb in zip(tr.completed_col[i:i + n:step], ref.completed_col[j:j + n:step],
                                              tr.state_col[i:i + n:step], ref.state_col[j:j + n:step])
                if sa == sb == _DONE and a != NO_VALUE and b != NO_VALUE]
    ref_ends = _completed_ends(ref)
    pairs = [(seq, end) for seq, end in _completed_ends(tr).items() if seq in ref_ends]
    return [(end, end - ref_ends[seq]) for seq, end in pairs[::-(-len(pairs) // FR_END_SAMPLES) or 1]]


_DONE = STATE_CODE[CallState.COMPLETED]


def _completed_ends(tr: Track) -> dict[int, int]:
    """seq -> completion time of a track's collectives known completed."""
    if isinstance(tr, GroupTrack):
        return {seq: end for seq, code, end in zip(tr.seq_col, tr.state_col, tr.completed_col)
                if code == _DONE and end != NO_VALUE}
    return {seq: t for seq, state, t in zip(tr.seqs, tr.states, tr.end)
            if state == CallState.COMPLETED and t is not None}


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
            shift_track(tr, clock.of(rank))
    return GroupCollectives(group, members, stacks)


def _p2p_kernels(p2p_ops: dict[str, list[P2POp]], groups: Mapping[str, ProcessGroup], src: Sources,
                 notes: list[str]) -> None:
    """Give each send and recv on a GPU the time of its batch's kernel, where a profiler trace of its rank shows
    one (``sources.kineto.p2p``): the op was issued inside the batch's window. In place, on the ranks' clocks."""
    batches = {rank: b for rank, traces in src.traces.items() if (b := p2p_batches(traces))}
    if not batches:
        return
    timed = 0
    for uid, ops in p2p_ops.items():
        if not gpu_backend(groups[uid].backend):
            continue
        for i, op in enumerate(ops):
            mine = batches.get(op.rank, ())
            batch = next((b for b in mine if b.holds(op.t_arrive_ns)), None)
            if batch is not None:
                ops[i] = dataclasses.replace(op, gpu_ns=(batch.t_begin_ns, batch.t_end_ns))
                timed += 1
    if timed:
        notes.append(f"{timed} send/recv op(s) timed by their batch's SendRecv kernel in a profiler trace (joined to "
                     "the nccl:coalesced annotation it ran for, by order where the kernel carries no External id)")


def _pair(uid: str, ops: list[P2POp], clock: ClockAlignment) -> tuple[P2PTransfer, ...]:
    sends: dict[tuple[int, int], list[P2POp]] = defaultdict(list)
    recvs: dict[tuple[int, int], list[P2POp]] = defaultdict(list)
    for op in ops:
        moved = clock.of(op.rank)
        if moved:
            arrive, end = moved.times((op.t_arrive_ns, op.t_end_ns))
            op = dataclasses.replace(op, t_arrive_ns=arrive, t_end_ns=end,
                                     gpu_ns=(moved(op.gpu_ns[0]), moved(op.gpu_ns[1])) if op.gpu_ns else None)
        if op.kind == "send":
            sends[(op.rank, op.peer)].append(op)
        else:
            recvs[(op.peer, op.rank)].append(op)
    out = []
    for pair in sorted(set(sends) | set(recvs)):
        for i, (s, r) in enumerate(zip_longest(sends.get(pair, ()), recvs.get(pair, ()))):
            out.append(P2PTransfer(uid, pair[0], pair[1], i, s, r))
    return tuple(out)


def _rank_infos(src: Sources, clock: ClockAlignment) -> dict[int, RankInfo]:
    """Each rank's files and what its log says of its life (the logs already on the job's clock)."""
    out = {}
    exits = _exits_by_process(src)
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
            exit=_rank_exit(exits.get((header.get("host"), rank, header.get("pid"))), header.get("host"), rank, clock),
        )
    return out


def _exits_by_process(src: Sources) -> dict[tuple[Any, int, Any], dict[str, Any]]:
    """The job files' ``exits`` by (host, rank, pid): what the `record` of a host saw of each of its ranks'
    processes end, found for a rank by its log header's host and pid."""
    out: dict[tuple[Any, int, Any], dict[str, Any]] = {}
    for job in src.jobs:
        for e in job.get("exits") or ():
            out.setdefault((job.get("host"), e["rank"], e["pid"]), e)
    return out


def _rank_exit(e: dict[str, Any] | None, host: str | None, rank: int, clock: ClockAlignment) -> RankExit | None:
    """An entry of the job file's ``exits`` of ``host`` as a ``RankExit``, its end also on the job's clock."""
    if e is None:
        return None
    return RankExit(host, e["alive_ns"], e["t_ns"], clock.of(rank)(e["t_ns"]), e["signal"], e["status"])


class LazyStacks:
    """Call stacks read on demand from a rank's Flight Recorder files (see ``LoadOptions.stacks``).

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
