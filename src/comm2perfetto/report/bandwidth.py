"""Per collective type and process group: counts, bytes, durations and nccl-tests bandwidths.

For one collective (a process group's seq, across its ranks), its time is its GPU work where it ran on a GPU
(``Collective.timing``; NCCL, RCCL ...):

- **duration**: what the group spent in it. On a GPU, from the first rank's communication kernel begin to
  the last rank's kernel end (profiler traces), or the longest rank's GPU time (Flight Recorder's
  ``duration_ms`` with ``TORCH_NCCL_ENABLE_TIMING``, which the recorder sets): never from the CPU's enqueue,
  which counts the GPU's queue too, nor to Flight Recorder's completion times, which are when NCCL's
  watchdog noticed (it polls every 100 ms). A GPU collective with neither is counted but not timed, and so
  is a send/recv on a GPU backend (nothing times its kernel yet). On a CPU backend (gloo), from the first
  rank's arrival to the last rank's completion;
- **transfer time**: the fastest rank's own duration (its GPU time, or its arrival to its completion). Every
  other rank's duration also holds the wait for the last to arrive, which is not the network's doing;
- **queue delay** (``queue_mean_s``): per rank, from the CPU's enqueue to its first kernel's begin, where a
  profiler trace shows both: the work queued ahead of the collective on the GPU, in no other figure;
- **arrival skew**: the last rank ready minus the first (``Collective.ready_ns``: the kernels' begins where
  every rank's are known, else the arrivals);
- **size S**, as nccl-tests counts it: the per-rank message for all_reduce, broadcast, reduce and send/recv; the
  whole gathered (or scattered) buffer for all_gather, reduce_scatter, gather, scatter and all_to_all (an
  all_to_all's ranks' buffers on average: with uneven splits each rank sends its own amount).

``algbw = S / transfer time`` and ``busbw = algbw x factor`` with nccl-tests' factors for ``n`` ranks in the
group (nccl-tests doc/PERFORMANCE.md): all_reduce ``2(n-1)/n``; all_gather, reduce_scatter, all_to_all,
gather, scatter ``(n-1)/n``; broadcast, reduce, send/recv ``1``; none where ``n`` is 1: a group of one rank (or
a send/recv to itself) moves nothing over a link (``report.document`` notes why). Sums run over the collectives
with a known transfer time: gloo's Flight Recorder has no completion times, so DDP's collectives on gloo are counted
(``count``) but only the recorder's calls are timed (``timed``). The collectives of one group on one GPU
stream run one after another, so their durations on one rank never add up to more than the span they ran in.

Each row also lists its collectives one by one (``instances``, columns aligned by position, in the order of
the group's sequence numbers): ``compare`` needs those samples to tell a change from run-to-run noise, and
takes them from here so that each figure is computed once.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from comm2perfetto.intervals import NS
from comm2perfetto.job import Job
from comm2perfetto.model import (
    NOT_DONE_STATES,
    Collective,
    Signature,
    gpu_backend,
    op_family,
    span_timing,
    tensor_bytes,
)
from comm2perfetto.report.untimed import CPU_NO_END, NOT_DONE, P2P_ON_GPU, untimed_reason
from comm2perfetto.report_doc import CollectiveRow, Instances

_Number = TypeVar("_Number", int, float)
_ROOTED_TOTAL = ("all_gather", "gather")  # S is n x each rank's input
_BUS_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n, "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n, "gather": lambda n: (n - 1) / n, "scatter": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0, "reduce": lambda n: 1.0, "send/recv": lambda n: 1.0,
}


def bus_factor(op: str, n: int) -> float | None:
    """nccl-tests' busbw/algbw factor for ``op`` on ``n`` ranks; None for ops without one (barrier).

    >>> bus_factor("all_reduce", 8), bus_factor("_allgather_base", 4), bus_factor("broadcast", 8)
    (1.75, 0.75, 1.0)
    """
    rule = _BUS_FACTOR.get(op_family(op))
    return rule(n) if rule is not None and n > 0 else None


def message_bytes(sig: Signature, n: int) -> int | None:
    """S for one collective as nccl-tests counts it (see the module docstring)."""
    fam = op_family(sig.op)
    inputs = tensor_bytes(sig.input_sizes, sig.input_dtypes)
    outputs = tensor_bytes(sig.output_sizes, sig.output_dtypes)
    if fam in _ROOTED_TOTAL:
        return outputs if outputs else (inputs * n if inputs is not None else None)
    if fam == "scatter":
        return inputs if inputs else (outputs * n if outputs is not None else None)
    return inputs


def mean_input_bytes(c: Collective) -> int | None:
    """An all-to-all's S: its ranks' input buffers, on average. With uneven splits (a mixture of experts'
    dispatch) every rank sends a different amount, and no one rank's buffer is the collective's."""
    counts = Counter(s for s in c.signatures if s is not None)  # signatures are shared: a few distinct ones
    sized = [(b, k) for sig, k in counts.items() if (b := tensor_bytes(sig.input_sizes, sig.input_dtypes)) is not None]
    if not sized:
        return None
    return round(sum(b * k for b, k in sized) / sum(k for _, k in sized))


@dataclass
class _Row:
    group_size: int | None = 0  # None: not known (kernels that name no group)
    count: int = 0
    timed: int = 0
    bytes: int = 0  # of the instances whose size is known (``sized``); the report says None while none is
    sized: int = 0  # instances whose size is known
    timed_bytes: int = 0
    transfer_ns: int = 0
    durations: list[int] = field(default_factory=list)
    skews: list[int] = field(default_factory=list)
    queue_ns: int = 0  # the ranks' queue delays, where known, added up, and how many
    queued: int = 0
    instances: list[_Instance] = field(default_factory=list)


@dataclass(frozen=True)
class _Instance:
    """One collective of a row: what ``compare`` takes as a sample."""

    seq: int | None  # None for a send/recv pair
    step: int | None
    nbytes: int | None
    timing: tuple[int, int] | None  # (duration, transfer time) in ns
    skew: int | None
    last_rank: int | None


def collective_table(job: Job) -> list[CollectiveRow]:
    """One row per (op family, process group), slowest total first, of every collective (without steps: a
    report's steps come from ``report.document``)."""
    table = CollectiveTable(job)
    for uid, cols in job.collectives.items():
        for c in cols:
            table.add(uid, c, None)
    return table.rows()


class CollectiveTable:
    """``collective_table`` fed one collective at a time (``add``), so that a report reads each collective once
    for all its tables and holds none: at 16,384 ranks a collective's per-rank tuples weigh megabytes."""

    def __init__(self, job: Job, with_p2p: bool = True, steps: tuple[int, int] | None = None) -> None:
        self._job = job
        self._with_p2p = with_p2p  # p2p has no step: left out of a step range
        self._steps = steps
        self._rows: dict[tuple[str, str], _Row] = defaultdict(_Row)
        self._untimed: Counter[str] = Counter()  # why, for the instances without a duration
        self._kernel_labels: dict[str, str] | None = None  # set once ``rows`` added the p2p and kernel rows

    def add(self, uid: str, c: Collective, step: int | None) -> None:
        sig = first_signature(c)
        if sig is None:
            return
        family = op_family(sig.op)
        row = self._rows[(family, uid)]
        n = row.group_size = len(self._job.groups[uid].ranks)
        timing = c.timing()
        if timing is None:
            self._untimed[untimed_reason(self._job, c)] += 1
        nbytes = mean_input_bytes(c) if family == "all_to_all" else message_bytes(sig, n)
        _add(row, _Instance(c.seq, step, nbytes, timing, c.ready_skew_ns,
                            c.last_ready_rank if len(c.arrive_ns) > 1 else None))
        queues = c.queue_ns()
        row.queue_ns += sum(queues)
        row.queued += len(queues)

    def rows(self) -> list[CollectiveRow]:
        """The table, send/recv pairs included (unless left out); the same table each time it is asked."""
        job, rows = self._job, self._rows
        if self._kernel_labels is None:  # the first time: add the send/recv pairs and the kernels, once
            self._add_p2p_rows()
            self._kernel_labels = self._kernel_rows()
        labels = {uid: g.label for uid, g in job.groups.items()}
        labels.update(self._kernel_labels)
        table = [_render(op, uid if uid in job.groups else "", labels[uid], row) for (op, uid), row in rows.items()]
        table.sort(key=lambda r: (-(r["total_s"] or 0.0), -r["count"], r["op"], r["process_group"]))
        return table

    def _add_p2p_rows(self) -> None:
        """One ``send/recv`` row per group, each matched pair one instance."""
        job, rows = self._job, self._rows
        for uid, transfers in job.p2p.items() if self._with_p2p else ():
            on_gpu = gpu_backend(job.groups[uid].backend)
            for t in transfers:
                ops = [op for op in (t.send, t.recv) if op is not None]
                if not ops:
                    continue
                row = rows[("send/recv", uid)]
                row.group_size = max(row.group_size or 0, len({t.src, t.dst}))  # a rank sending to itself: 1
                arrive = tuple(op.t_arrive_ns for op in ops)
                known = [(a, r) for a, r in zip(arrive, (t.src, t.dst)) if a is not None]
                # an arrival skew is between two ranks: a rank's send and recv to itself have none
                skew = max(known)[0] - min(known)[0] if len(known) == 2 and t.src != t.dst else None
                last = max(known)[1] if len(known) == 2 and t.src != t.dst else None
                nbytes = tensor_bytes(ops[0].signature.input_sizes, ops[0].signature.input_dtypes)
                # On a GPU a send/recv's times are its enqueue and NCCL's watchdog noticing its end: not a duration;
                # its batch's kernel is, where a profiler trace shows it
                timing = span_timing(*zip(*(op.gpu_ns or (None, None) for op in ops))) if on_gpu \
                    else span_timing(arrive, tuple(op.t_end_ns for op in ops))
                if timing is None:
                    self._untimed[NOT_DONE if any(op.state in NOT_DONE_STATES for op in ops)
                                  else P2P_ON_GPU if on_gpu else CPU_NO_END] += 1
                _add(row, _Instance(None, None, nbytes, timing, skew, last))

    def _kernel_rows(self) -> dict[str, str]:
        """Add the kernels of libraries that name no group (``Job.kernel_collectives``: DeepEP's all-to-all) as
        rows of their own, one per operation and library, each kernel one instance timed by its GPU time (its
        group's size and its bytes unknown); returns each such row's label by its key."""
        labels = {}
        steps = self._steps
        for cols in self._job.kernel_collectives.values():
            for c in cols:
                if steps is not None and (c.step is None or not steps[0] <= c.step <= steps[1]):
                    continue
                key = f"kernels:{c.family}"
                labels[key] = f"no group ({c.family} kernels, not matched across ranks)"
                duration = c.t_end_ns - c.t_begin_ns
                row = self._rows[(op_family(c.op), key)]
                row.group_size = None
                _add(row, _Instance(None, c.step, None, (duration, duration), None, None))
        return labels

    def untimed(self) -> dict[str, int]:
        """Why the instances without a duration have none (``report.untimed``'s words): how many for each, most
        first (send/recv pairs counted once ``rows`` read them)."""
        return dict(self._untimed.most_common())


def _add(row: _Row, instance: _Instance) -> None:
    nbytes, timing, skew = instance.nbytes, instance.timing, instance.skew
    row.instances.append(instance)
    row.count += 1
    if nbytes is not None:
        row.bytes += nbytes
        row.sized += 1
    if skew is not None:
        row.skews.append(skew)
    if timing is not None:
        row.timed += 1
        row.durations.append(timing[0])
        row.transfer_ns += timing[1]
        row.timed_bytes += nbytes or 0


def _render(op: str, uid: str, group: str, row: _Row) -> CollectiveRow:
    durations = sorted(row.durations)
    total = sum(durations)
    # a group of one rank moves nothing over a link; kernels that name no group: its size is unknown
    linked = row.group_size is not None and row.group_size > 1
    algbw = row.timed_bytes / (row.transfer_ns * NS) / 1e9 if linked and row.transfer_ns and row.timed_bytes \
        else None
    factor = bus_factor(op, row.group_size) if row.group_size is not None else None
    return {
        "op": op, "process_group": group, "group_size": row.group_size, "count": row.count, "timed": row.timed,
        "bytes": row.bytes if row.sized else None,
        "total_s": total * NS if durations else None,
        "mean_s": total / len(durations) * NS if durations else None,
        "p50_s": percentile(durations, 50) * NS if durations else None,
        "p99_s": percentile(durations, 99) * NS if durations else None,
        "transfer_s": row.transfer_ns * NS if durations else None,
        "algbw_gbps": algbw,
        "busbw_gbps": algbw * factor if algbw is not None and factor is not None else None,
        "arrival_skew_mean_s": sum(row.skews) / len(row.skews) * NS if row.skews else None,
        "queue_mean_s": row.queue_ns / row.queued * NS if row.queued else None,
        "group_uid": uid,
        "instances": _instance_columns(row.instances, factor, linked),
    }


def _instance_columns(instances: list[_Instance], factor: float | None, linked: bool) -> Instances:
    """The row's collectives as columns (``report_doc.INSTANCE_COLUMNS``); a bandwidth where the transfer time
    and size are known and the group has a link (``linked``: two ranks or more)."""
    columns: Instances = {"seq": [], "step": [], "bytes": [], "duration_s": [], "transfer_s": [], "algbw_gbps": [],
                          "busbw_gbps": [], "arrival_skew_s": [], "last_rank": []}
    for i in instances:
        duration, transfer = i.timing if i.timing is not None else (None, None)
        algbw = i.nbytes / (transfer * NS) / 1e9 if linked and transfer and i.nbytes else None
        columns["seq"].append(i.seq)
        columns["step"].append(i.step)
        columns["bytes"].append(i.nbytes)
        columns["duration_s"].append(duration * NS if duration is not None else None)
        columns["transfer_s"].append(transfer * NS if transfer is not None else None)
        columns["algbw_gbps"].append(algbw)
        columns["busbw_gbps"].append(algbw * factor if algbw is not None and factor is not None else None)
        columns["arrival_skew_s"].append(i.skew * NS if i.skew is not None else None)
        columns["last_rank"].append(i.last_rank)
    return columns


def percentile(ordered: Sequence[_Number], pct: float) -> _Number:
    """Nearest-rank percentile of an ascending, non-empty list.

    >>> percentile([1, 2, 3, 4], 50), percentile(list(range(1, 101)), 99), percentile([7], 99)
    (2, 99, 7)
    """
    return ordered[max(math.ceil(pct / 100 * len(ordered)) - 1, 0)]


def first_signature(c: Collective) -> Signature | None:
    return next((s for s in c.signatures if s is not None), None)
