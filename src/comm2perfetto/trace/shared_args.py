"""What every rank's slice of a collective shares, built once for the whole job and read by each rank's writer
(``rank_writer``): the flow that links the ranks' slices, the call-site text of each stack, the args of each
collective (``SharedArgs``, encoded once by the trace writer for every rank that has them) and, per process
group, its collectives laid out as per-rank columns for the rank-by-rank walk.
"""

from __future__ import annotations

import functools
import itertools
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from operator import getitem, gt, is_not, not_
from types import MappingProxyType
from typing import Any

from comm2perfetto.job import Job
from comm2perfetto.model import (
    Collective,
    GroupView,
    Signature,
    call_site,
    known_values,
    peer_bytes,
    tensor_bytes,
    work_span,
)
from comm2perfetto.trace.sink import SharedArgs, arg_text

__all__ = ["END", "START", "STEP", "Flow", "GroupTable", "SiteCache", "rank_at", "shapes_text",
           "signature_args"]


@dataclass(frozen=True, slots=True)
class Flow:
    """The flow linking one collective's slices across ranks (or a send to its recv): its id and the ranks whose
    slices start and end it (the first and last to arrive)."""

    fid: int
    first: int  # rank whose event starts the flow
    last: int

    def role(self, rank: int) -> int:
        """Where ``rank``'s event puts the flow: START, STEP or END (its index in SharedArgs.flows)."""
        return START if rank == self.first else END if rank == self.last else STEP


START, STEP, END = 0, 1, 2


def rank_at(pick: Callable[..., Any], arrive: Sequence[int | None], ranks: Sequence[int]) -> int:
    """``pick(zip(arrive, ranks))[1]`` for ``pick`` min or max: C-speed scans unless arrivals tie."""
    t = pick(arrive)
    if arrive.count(t) == 1:
        return ranks[arrive.index(t)]
    return pick(r for a, r in zip(arrive, ranks) if a == t)


class SiteCache:
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


class _Common(dict[tuple[str | None, int | None, str | None, int | None], SharedArgs]):
    """What every rank's slice of one collective (with one signature) shares, built once.

    ``args`` and ``first`` (the first rank's arrival); as a dict, ``(state, stack id, source)`` -> those args
    with these three, as one ``SharedArgs`` that the writer encodes once for every rank that has them.
    """

    __slots__ = ("args", "first", "flow", "others", "sig", "sites")

    def __init__(self, c: Collective, sig: Signature, sites: SiteCache, flow: Flow | None) -> None:
        super().__init__()
        self.sig, self.sites, self.flow = sig, sites, flow
        self.args = _collective_args(c, sig)
        arrivals = known_values(c.ready_ns)
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


# Per collective of a group: where to read the collective (its group's collectives, its position), the shared
# part of its slices, its flow. Not the view itself: a view keeps the per-rank tuples it has built.
Row = tuple[GroupView, int, _Common, Flow | None]


class GroupTable:
    """One group's collectives laid out for the rank-by-rank walk; built once, read by every rank.

    ``rows``: per collective, where to read it, what its slices share and its flow. Per-rank fields are read
    as one rank's column across the group's collectives (``column``: C-level slices of that rank's track,
    see ``group_columns``), so no per-rank tuple of every collective is held: the table costs a few values per
    collective whatever the group's size. The other lists hold one value per collective.
    """

    def __init__(self, cols: GroupView, flows: Mapping[int, Flow], sites: SiteCache) -> None:
        self.cols = cols
        self.rows: list[Row] = []
        usual_states: list[str | None] = []
        usual_stack_ids: list[int | None] = []
        usual_sources: list[str | None] = []
        # The first member's values, as its columns (C-level slices): a collective's every rank is read only
        # where that member has no record of it, not four fields of every rank of every collective.
        firsts = None
        if cols.ranks:
            firsts = [cols.member_column(name, cols.ranks[0]) for name in ("signatures", "states", "stack_ids",
                                                                           "sources")]
        for k, c in enumerate(cols):  # each view is dropped after this: its tuples are not kept
            if firsts is not None and firsts[0][k] is not None:
                sig, state, stack_id, source = (column[k] for column in firsts)
            else:
                sigs = c.signatures
                j, found = next(((j, s) for j, s in enumerate(sigs) if s is not None), (None, None))
                if found is None or j is None:
                    continue
                sig, state, stack_id, source = found, c.states[j], c.stack_ids[j], c.sources[j]
            flow = flows.get(c.seq)
            self.rows.append((cols, k, _Common(c, sig, sites, flow), flow))
            usual_states.append(state)
            usual_stack_ids.append(stack_id)
            usual_sources.append(source)
        self.indices = [k for _, k, _, _ in self.rows]
        self.seqs = [cols[k].seq for k in self.indices] if len(self.indices) != len(cols) else \
            [c.seq for c in cols]
        self.position = {seq: k for k, seq in enumerate(self.seqs)}
        self.commons = [common for _, _, common, _ in self.rows]
        self.common_sigs = [common.sig for common in self.commons]
        self.ops = [sig.op for sig in self.common_sigs]
        self.firsts = [common.first or 0 for common in self.commons]  # 0: no arrival, the careful way
        # Flow roles: the middle one (shared_of puts the first and last rank's in their place).
        self.roles = [None if flow is None else STEP for _, _, _, flow in self.rows]
        self.flow_starts: dict[int, list[int]] = defaultdict(list)  # rank -> positions of the flows it starts
        self.flow_ends: dict[int, list[int]] = defaultdict(list)
        for k, (_, _, _, flow) in enumerate(self.rows):
            if flow is not None:
                self.flow_starts[flow.first].append(k)
                self.flow_ends[flow.last].append(k)
        # The (state, stack id, source) of the first rank with a slice, and its SharedArgs: what most ranks have.
        self.usual_states, self.usual_stack_ids, self.usual_sources = usual_states, usual_stack_ids, usual_sources
        self.usual_shared = list(map(getitem, self.commons, zip(self.usual_states, self.usual_stack_ids,
                                                                self.usual_sources, self.roles)))

    def column(self, name: str, rank: int) -> list:
        """``rank``'s value of a per-rank field (``signatures``, ``arrive_ns``, ``end_ns``, ``states`` ...) in
        each collective of the table, in order."""
        values = self.cols.member_column(name, rank)
        if len(self.indices) == len(values):
            return values
        return [values[k] for k in self.indices]

    @property
    def on_gpu(self) -> bool:
        """The group's collectives run on a GPU (``Collective.on_gpu``)."""
        return self.cols.on_gpu

    def work_columns(self, rank: int) -> tuple[list, list]:
        """``rank``'s slice of each collective as (begins, ends), as ``Collective.work_of`` has it
        (``model.work_span``), read as columns."""
        arrive, ends = self.column("arrive_ns", rank), self.column("end_ns", rank)
        on_gpu = self.on_gpu
        gpu_begins = self.column("gpu_begin_ns", rank)
        if not on_gpu and not any(b is not None for b in gpu_begins):
            return arrive, ends
        spans = map(work_span, arrive, ends, gpu_begins, self.column("duration_ns", rank),
                    itertools.repeat(on_gpu))
        begins, stops = (list(column) for column in zip(*spans)) if arrive else ([], [])
        return begins, stops

    def shared_of(self, rank: int) -> list[SharedArgs]:
        """The SharedArgs of ``rank``'s slice of each collective, at C speed."""
        states = self.column("states", rank)
        stack_ids = self.column("stack_ids", rank)
        sources = self.column("sources", rank)
        if states == self.usual_states and stack_ids == self.usual_stack_ids and sources == self.usual_sources:
            shared = self.usual_shared.copy()
        else:  # _Common.__missing__ makes the ones not seen yet
            shared = list(map(getitem, self.commons, zip(states, stack_ids, sources, self.roles)))
        for role, positions in ((END, self.flow_ends.get(rank, ())), (START, self.flow_starts.get(rank, ()))):
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
        # no None left: all() was true, or they were set to 0 above
        odd.update(itertools.compress(positions, map(gt, arrive, ends)))  # type: ignore[arg-type]
        return sorted(odd)


def _collective_args(c: Collective, sig: Signature) -> dict[str, Any]:
    args: dict[str, Any] = {"process_group": c.group.label, "seq": c.seq, "group_size": len(c.group.ranks),
                            **signature_args(sig)}
    # An all-to-all's bytes to and from each member, in group-rank order: the rank's row of report's matrix
    sent, expected = peer_bytes(sig, len(c.group.ranks))
    if sent is not None:
        args["bytes_to_each"] = arg_text(sent)
    if expected is not None:
        args["bytes_from_each"] = arg_text(expected)
    last = c.last_ready_rank  # None where several ranks arrived last together
    if last is not None:
        args["last_arrival_rank"] = last
    return args


@functools.lru_cache(maxsize=1024)  # a job has few distinct signatures, each on thousands of collectives
def signature_args(sig: Signature) -> Mapping[str, Any]:
    """shapes, dtypes, output_shapes (when they differ) and bytes (when the dtypes are known)."""
    args: dict[str, Any] = {"shapes": shapes_text(sig.input_sizes), "dtypes": ",".join(sig.input_dtypes or ())}
    if sig.output_sizes is not None and sig.output_sizes != sig.input_sizes:
        args["output_shapes"] = shapes_text(sig.output_sizes)
    nbytes = _nbytes(sig)
    if nbytes is not None:
        args["bytes"] = nbytes
    return MappingProxyType(args)


def shapes_text(sizes: Any) -> str:
    """``[[4, 8], [2]]``; ``?`` when unknown."""
    return "?" if sizes is None else str(arg_text(sizes))


def _nbytes(sig: Signature) -> int | None:
    return tensor_bytes(sig.input_sizes, sig.input_dtypes)

