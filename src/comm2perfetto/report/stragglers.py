"""Which rank the others wait for: arrival order at every collective all of its ranks joined.

A rank's *lateness* at a collective is its arrival minus the earliest arrival of that collective's ranks (on
the aligned clock), an arrival being when the rank was ready to communicate (``Collective.ready_ns``): its
first kernel's begin where profiler traces show every rank's (the GPU runs behind the CPU: what the others'
kernels waited for is the last kernel to begin), else its call. A straggler arrives last often and late: ranked
by how many collectives it arrived last at (alone: where several ranks arrived last together, none of them
counts), then by mean lateness. Collectives with a rank missing (a hang) are diagnose's business, not counted
here.
"""

from __future__ import annotations

from array import array
from collections import defaultdict, deque
from collections.abc import Sequence
from itertools import repeat
from operator import itemgetter, sub
from typing import cast

from comm2perfetto.intervals import NS
from comm2perfetto.job import Job
from comm2perfetto.model import Collective
from comm2perfetto.report.bandwidth import percentile
from comm2perfetto.report_doc import LatenessMap, StragglerRow


def straggler_table(job: Job) -> list[StragglerRow]:
    """One row per rank that joined a fully joined collective, most last arrivals first."""
    table = Stragglers()
    for cols in job.collectives.values():
        for c in cols:
            table.add(c)
    return table.rows()


class Stragglers:
    """``straggler_table`` fed one collective at a time (``add``); each rank's lateness values are kept as
    int64 (8 bytes each, not an int object: 33 million of them at 16,384 ranks x 2,000 collectives)."""

    def __init__(self) -> None:
        # per group (its ranks' tuple, by identity: a group's collectives share it), each member's values
        self._groups: dict[int, tuple[Sequence[int], list[array]]] = {}
        self._last: dict[int, int] = defaultdict(int)

    def add(self, c: Collective) -> None:
        ready = c.ready_ns
        if len(ready) < 2 or None in ready:
            return
        arrive = cast(tuple[int, ...], ready)  # every rank's arrival known (tested above)
        first, last = min(arrive), max(arrive)
        if arrive.count(last) == 1:  # ranks that arrived last together: none of them kept the others waiting
            self._last[c.ranks[arrive.index(last)]] += 1
        group = self._groups.get(id(c.ranks))
        if group is None:
            group = self._groups[id(c.ranks)] = (c.ranks, [array("q") for _ in c.ranks])
        deque(map(array.append, group[1], map(sub, arrive, repeat(first))), maxlen=0)  # in C: every rank

    def rows(self) -> list[StragglerRow]:
        lateness: dict[int, list[array]] = defaultdict(list)
        for ranks, per_rank in self._groups.values():
            for rank, column in zip(ranks, per_rank):
                if column:
                    lateness[rank].append(column)
        rows: list[StragglerRow] = []
        for rank, parts in lateness.items():
            values = sorted(parts[0]) if len(parts) == 1 else sorted(v for part in parts for v in part)
            rows.append({"rank": rank, "matched": len(values), "last_arrivals": self._last[rank],
                         "mean_lateness_s": sum(values) / len(values) * NS,
                         "p99_lateness_s": percentile(values, 99) * NS})
        rows.sort(key=lambda r: (-r["last_arrivals"], -r["mean_lateness_s"], r["rank"]))
        return rows


def lateness_map(job: Job, columns: int = 200) -> LatenessMap:
    """Ranks x collectives lateness for a heat map: the fully joined collectives in time order, sampled
    evenly down to ``columns``; None where a rank is not in that collective's group."""
    heat = LatenessTable(job, columns)
    for uid, cols in job.collectives.items():
        for i, c in enumerate(cols):
            heat.add(uid, i, c)
    return heat.result()


class LatenessTable:
    """``lateness_map`` fed one collective at a time (``add``): it keeps each joined collective's first
    arrival and place, and reads the per-rank values of the few it draws again at the end."""

    def __init__(self, job: Job, columns: int = 200) -> None:
        self._job = job
        self._columns = columns
        self._joined: list[tuple[int, str, int]] = []  # (first arrival, group uid, index in the group)

    def add(self, uid: str, index: int, c: Collective) -> None:
        ready = c.ready_ns
        if len(ready) > 1 and None not in ready:
            self._joined.append((min(cast(tuple[int, ...], ready)), uid, index))

    def result(self) -> LatenessMap:
        joined = sorted(self._joined, key=itemgetter(0))
        if len(joined) > self._columns:
            step = len(joined) / self._columns
            joined = [joined[int(i * step)] for i in range(self._columns)]
        drawn = [(first, self._job.collectives[uid][i]) for first, uid, i in joined]
        ranks = sorted({r for _, c in drawn for r in c.ranks})
        row_of = {r: i for i, r in enumerate(ranks)}
        values: list[list[float | None]] = [[None] * len(drawn) for _ in ranks]
        for j, (first, c) in enumerate(drawn):
            for rank, t in zip(c.ranks, cast(tuple[int, ...], c.ready_ns)):
                values[row_of[rank]][j] = (t - first) * NS
        labels = [f"{c.op} {c.group.label}:{c.seq}" for _, c in drawn]
        return {"ranks": ranks, "collectives": labels, "lateness_s": values}
