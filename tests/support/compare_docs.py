"""Report documents made by hand for compare's tests: the shape ``report --format json`` writes
(docs/report.md), with only what a test sets.

``ReportDoc`` builds one step at a time: the job's (and every rank's) figures per step, and collectives with
their per-instance samples. Numbers are whatever a test says, so expected verdicts follow from them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

FIGURES = ("span_s", "compute_s", "comm_s", "overlapped_comm_s", "exposed_comm_s", "idle_s", "comm_to_compute",
           "overlap_pct")


def figures(span: float, exposed: float = 0.0, compute: float | None = None) -> dict[str, float | None]:
    """A breakdown whose communication is all exposed: ``compute`` defaults to half the span."""
    compute = span / 2 if compute is None else compute
    return {"span_s": span, "compute_s": compute, "comm_s": exposed, "overlapped_comm_s": 0.0,
            "exposed_comm_s": exposed, "idle_s": max(span - compute - exposed, 0.0),
            "comm_to_compute": exposed / compute if compute else None, "overlap_pct": 0.0 if exposed else None}


@dataclass
class ReportDoc:
    ranks: tuple[int, ...] = (0, 1)
    world_size: int | None = 2
    groups: dict[str, dict[str, Any]] = field(default_factory=lambda: {"0[0,1]": {
        "name": "0", "desc": "default_pg", "ranks": [0, 1]}})
    steps: list[dict[str, Any]] = field(default_factory=list)
    rows: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    modules: list[dict[str, Any]] = field(default_factory=list)
    stragglers: list[dict[str, Any]] = field(default_factory=list)

    def step(self, n: int, span: float, exposed: float = 0.0, per_rank: dict[int, float] | None = None,
             compute: float | None = None) -> None:
        """Step ``n``: the job's figures, and each rank's (its exposed communication from ``per_rank``)."""
        ranks = {str(r): figures(span, (per_rank or {}).get(r, exposed), compute) for r in self.ranks}
        self.steps.append({"step": n, "job": figures(span, exposed, compute), "ranks": ranks})

    def collective(self, uid: str, op: str, step: int | None, nbytes: int, duration: float | None = None,
                   skew: float | None = None, last_rank: int | None = None, busbw: float | None = None) -> None:
        row = self.rows.setdefault((uid, op), {
            "op": op, "process_group": self.groups[uid]["desc"], "group_uid": uid,
            "group_size": len(self.groups[uid]["ranks"]), "count": 0, "bytes": 0,
            "instances": {k: [] for k in ("seq", "step", "bytes", "duration_s", "transfer_s", "algbw_gbps",
                                          "busbw_gbps", "arrival_skew_s", "last_rank")}})
        columns = row["instances"]
        values = {"seq": len(columns["seq"]) + 1, "step": step, "bytes": nbytes, "duration_s": duration,
                  "transfer_s": duration, "algbw_gbps": busbw, "busbw_gbps": busbw, "arrival_skew_s": skew,
                  "last_rank": last_rank}
        for key, value in values.items():
            columns[key].append(value)
        row["count"] += 1
        row["bytes"] += nbytes

    def build(self) -> dict[str, Any]:
        spans = [s["job"]["span_s"] for s in self.steps]
        job = figures(sum(spans) / len(spans) if spans else 0.0)
        return {"version": 1, "basis": "cpu", "world_size": self.world_size,
                "job": {**job, "ranks": len(self.ranks)},
                "ranks": {str(r): {**job, "basis": "cpu", "sources": ["recorder calls"]} for r in self.ranks},
                "steps": self.steps, "collectives": list(self.rows.values()), "stragglers": self.stragglers,
                "modules": self.modules, "lateness_map": {"ranks": [], "collectives": [], "lateness_s": []},
                "groups": self.groups, "notes": []}
