"""Per collective type and process group: counts, bytes, durations and nccl-tests bandwidths.

For one collective (a process group's seq, across its ranks):

- **duration**: from the first rank's arrival to the last rank's completion, what the group spent in it;
- **transfer time**: the fastest rank's own duration (its arrival to its completion). Every other rank's
  duration also holds the wait for the last to arrive, which is not the network's doing;
- **arrival skew**: last arrival minus first arrival;
- **size S**, as nccl-tests counts it: the per-rank message for all_reduce, broadcast, reduce and send/recv; the
  whole gathered (or scattered) buffer for all_gather, reduce_scatter, gather, scatter and all_to_all.

``algbw = S / transfer time`` and ``busbw = algbw x factor`` with nccl-tests' factors for ``n`` ranks in the
group (nccl-tests doc/PERFORMANCE.md): all_reduce ``2(n-1)/n``; all_gather, reduce_scatter, all_to_all,
gather, scatter ``(n-1)/n``; broadcast, reduce, send/recv ``1``. Sums run over the collectives with a known
transfer time: gloo's Flight Recorder has no completion times, so DDP's collectives on gloo are counted
(``count``) but only the recorder's calls are timed (``timed``). Where NCCL timed its work
(``TORCH_NCCL_ENABLE_TIMING``, which the recorder sets), the transfer time is the GPU time Flight Recorder
reports (``duration_ms``): its completion times are when NCCL's watchdog noticed.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from comm2perfetto.model import Collective, Job, Signature, op_family, tensor_bytes
from comm2perfetto.report.intervals import NS

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


@dataclass
class _Row:
    group_size: int = 0
    count: int = 0
    timed: int = 0
    bytes: int = 0
    timed_bytes: int = 0
    transfer_ns: int = 0
    durations: list[int] = field(default_factory=list)
    skews: list[int] = field(default_factory=list)


def collective_table(job: Job, keep: Callable[[Collective], bool] | None = None) -> list[dict]:
    """One row per (op family, process group), slowest total first; only collectives ``keep`` accepts."""
    rows: dict[tuple[str, str], _Row] = defaultdict(_Row)
    for uid, cols in job.collectives.items():
        group = job.groups[uid]
        n = len(group.ranks)
        for c in cols:
            sig = first_signature(c)
            if sig is None or (keep is not None and not keep(c)):
                continue
            row = rows[(op_family(sig.op), uid)]
            row.group_size = n
            _add(row, message_bytes(sig, n), _timing(c.arrive_ns, c.end_ns, c.duration_ns), c.arrival_skew_ns)
    for uid, transfers in job.p2p.items() if keep is None else ():  # p2p has no step: left out of a step range
        for t in transfers:
            ops = [op for op in (t.send, t.recv) if op is not None]
            if not ops:
                continue
            row = rows[("send/recv", uid)]
            row.group_size = 2
            arrive = tuple(op.t_arrive_ns for op in ops)
            known = [t for t in arrive if t is not None]
            skew = max(known) - min(known) if len(known) == 2 else None
            _add(row, tensor_bytes(ops[0].signature.input_sizes, ops[0].signature.input_dtypes),
                 _timing(arrive, tuple(op.t_end_ns for op in ops)), skew)
    table = [_render(op, job.groups[uid].label, row) for (op, uid), row in rows.items()]
    table.sort(key=lambda r: (-(r["total_s"] or 0.0), -r["count"], r["op"], r["process_group"]))
    return table


def _timing(arrive: Iterable[int | None], end: Iterable[int | None],
            gpu: Iterable[int | None] = ()) -> tuple[int, int] | None:
    """(duration, transfer time) from per-rank arrivals and completions; None when no rank has both.

    ``gpu``: each rank's GPU time of the collective where NCCL timed it (Flight Recorder's ``duration_ms``).
    Then the transfer time is the shortest of those: NCCL's completion times are when its watchdog noticed
    (it polls every 100 ms), so arrival-to-completion would hold that delay too.
    """
    pairs = [(a, e) for a, e in zip(arrive, end) if a is not None and e is not None and e >= a]
    timed = [d for d in gpu if d is not None]
    if timed:
        span = max(e for _, e in pairs) - min(a for a, _ in pairs) if pairs else max(timed)
        return max(span, min(timed)), min(timed)
    if not pairs:
        return None
    return max(e for _, e in pairs) - min(a for a, _ in pairs), min(e - a for a, e in pairs)


def _add(row: _Row, nbytes: int | None, timing: tuple[int, int] | None, skew: int | None) -> None:
    row.count += 1
    row.bytes += nbytes or 0
    if skew is not None:
        row.skews.append(skew)
    if timing is not None:
        row.timed += 1
        row.durations.append(timing[0])
        row.transfer_ns += timing[1]
        row.timed_bytes += nbytes or 0


def _render(op: str, group: str, row: _Row) -> dict:
    durations = sorted(row.durations)
    total = sum(durations)
    algbw = row.timed_bytes / (row.transfer_ns * NS) / 1e9 if row.transfer_ns and row.timed_bytes else None
    factor = bus_factor(op, row.group_size)
    return {
        "op": op, "process_group": group, "group_size": row.group_size, "count": row.count, "timed": row.timed,
        "bytes": row.bytes,
        "total_s": total * NS if durations else None,
        "mean_s": total / len(durations) * NS if durations else None,
        "p50_s": percentile(durations, 50) * NS if durations else None,
        "p99_s": percentile(durations, 99) * NS if durations else None,
        "transfer_s": row.transfer_ns * NS if durations else None,
        "algbw_gbps": algbw,
        "busbw_gbps": algbw * factor if algbw is not None and factor is not None else None,
        "arrival_skew_mean_s": sum(row.skews) / len(row.skews) * NS if row.skews else None,
    }


def percentile(ordered: list[int], pct: float) -> int:
    """Nearest-rank percentile of an ascending, non-empty list.

    >>> percentile([1, 2, 3, 4], 50), percentile(list(range(1, 101)), 99), percentile([7], 99)
    (2, 99, 7)
    """
    return ordered[max(math.ceil(pct / 100 * len(ordered)) - 1, 0)]


def first_signature(c: Collective) -> Signature | None:
    return next((s for s in c.signatures if s is not None), None)
