"""Which rank the others wait for: arrival order at every collective all of its ranks joined.

A rank's *lateness* at a collective is its arrival minus the earliest arrival of that collective's ranks (on
the aligned clock), an arrival being when the rank was ready to communicate (``Collective.ready_ns``): its
first kernel's begin where profiler traces show every rank's (the GPU runs behind the CPU: what the others'
kernels waited for is the last kernel to begin), else its call. A straggler arrives last often and late: ranked
by how many collectives it arrived last at, then by mean lateness. Collectives with a rank missing (a hang) are
diagnose's business, not counted here.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable
from itertools import repeat
from operator import sub
from typing import cast

from comm2perfetto.model import Collective, Job
from comm2perfetto.report.bandwidth import percentile
from comm2perfetto.report.intervals import NS


def straggler_table(job: Job, keep: Callable[[Collective], bool] | None = None) -> list[dict]:
    """One row per rank that joined a fully joined collective (that ``keep`` accepts), most last arrivals
    first."""
    lateness: dict[int, list[int]] = defaultdict(list)
    last: dict[int, int] = defaultdict(int)
    for cols in job.collectives.values():
        if not cols:
            continue
        per_rank: list[list[int]] = [[] for _ in cols[0].ranks]  # a group's collectives share its ranks
        for c in cols:
            if len(c.ready_ns) < 2 or None in c.ready_ns or (keep is not None and not keep(c)):
                continue
            arrive = cast(list[int], c.ready_ns)  # every rank's arrival known (tested above)
            first = min(arrive)
            latest = max(arrive)
            last[c.ranks[arrive.index(latest)]] += 1
            deque(map(list.append, per_rank, map(sub, arrive, repeat(first))), maxlen=0)  # in C: every rank
        for rank, values in zip(cols[0].ranks, per_rank):
            if values:
                lateness[rank].extend(values)
    rows = []
    for rank, values in lateness.items():
        values.sort()
        rows.append({"rank": rank, "matched": len(values), "last_arrivals": last[rank],
                     "mean_lateness_s": sum(values) / len(values) * NS,
                     "p99_lateness_s": percentile(values, 99) * NS})
    rows.sort(key=lambda r: (-r["last_arrivals"], -r["mean_lateness_s"], r["rank"]))
    return rows


def lateness_map(job: Job, keep: Callable[[Collective], bool] | None = None, columns: int = 200) -> dict:
    """Ranks x collectives lateness for a heat map: the fully joined collectives in time order, sampled
    evenly down to ``columns``; None where a rank is not in that collective's group."""
    joined = [(min(ready), c, ready) for cols in job.collectives.values() for c in cols
              if len(c.ready_ns) > 1 and None not in c.ready_ns and (keep is None or keep(c))
              for ready in (cast(list[int], c.ready_ns),)]
    joined.sort(key=lambda j: j[0])
    if len(joined) > columns:
        step = len(joined) / columns
        joined = [joined[int(i * step)] for i in range(columns)]
    ranks = sorted({r for _, c, _ in joined for r in c.ranks})
    row_of = {r: i for i, r in enumerate(ranks)}
    values: list[list[float | None]] = [[None] * len(joined) for _ in ranks]
    for j, (first, c, ready) in enumerate(joined):
        for rank, t in zip(c.ranks, ready):
            values[row_of[rank]][j] = (t - first) * NS
    labels = [f"{c.op} {c.group.label}:{c.seq}" for _, c, _ in joined]
    return {"ranks": ranks, "collectives": labels, "lateness_s": values}
