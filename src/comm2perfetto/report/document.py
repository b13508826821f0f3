"""The report document: every analysis over a job, as one plain dict (the JSON contract in docs/report.md).

``build_report`` takes the loaded job (or None when only profiler traces were given) and each rank's profiler
traces already reduced to unions (``sources.kineto.profile.read_profiles``), and returns::

    {"version": 1, "basis": "gpu", "world_size": 8, "job": {...}, "ranks": {"0": {...}}, "steps": [...],
     "collectives": [...], "stragglers": [...], "modules": [...], "lateness_map": {...}, "groups": {...},
     "notes": [...], "sampled": null, "clock": {"method": {"0": "measured", "1": "refined"},
     "residual_skew_s": 1.5e-05, "samples": 6}}
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping
from typing import cast

from comm2perfetto.errors import Comm2PerfettoError
from comm2perfetto.model import Collective, Job
from comm2perfetto.render.words import ranks_text
from comm2perfetto.report.activity import RankActivity, RankProfile, flight_recorder_comm, rank_activity
from comm2perfetto.report.bandwidth import collective_table
from comm2perfetto.report.modules import module_table
from comm2perfetto.report.overlap import Breakdown, breakdown, job_breakdown, total
from comm2perfetto.report.stragglers import lateness_map, straggler_table

__all__ = ["VERSION", "StepsError", "build_report", "steps_text"]

VERSION = 1


class StepsError(Comm2PerfettoError, ValueError):
    """The steps asked for are none of those the job recorded: a report of them would be all zeros."""


def build_report(job: Job | None, profiles: Mapping[int, RankProfile], steps: tuple[int, int] | None = None,
                 depth: int | None = None) -> dict:
    """Everything ``comm2perfetto report`` prints. ``steps``: only steps A..B (inclusive)."""
    ranks = sorted(set(job.ranks if job is not None else ()) | set(profiles))
    # Every table reads the same collectives: their views are held until the report is done, so that each
    # per-rank tuple (arrivals, durations...) is decoded from the columns once, not once per table.
    views = [list(cols) for cols in job.collectives.values()] if job is not None else []
    fr_comm = flight_recorder_comm(job) if job is not None else {}
    # each rank's Flight Recorder spans are handed over and dropped once its union is made: never held twice
    activities = {r: rank_activity(job, r, profiles.get(r), {r: fr_comm.pop(r, [])}) for r in ranks}
    notes = [n for p in profiles.values() for n in p.notes]
    windows = {r: [(b, e) for n, b, e in a.steps if steps is None or steps[0] <= n <= steps[1]]
               for r, a in activities.items()}
    if steps is not None and not any(windows.values()):
        recorded = sorted({n for a in activities.values() for n, _, _ in a.steps})
        asked = f"{steps[0]}-{steps[1]}" if steps[1] > steps[0] else str(steps[0])
        raise StepsError(f"--steps {asked}: no rank recorded these steps "
                         f"({'the job recorded steps ' + steps_text(recorded) if recorded else 'no steps recorded'})")

    per_rank: dict[str, dict] = {}
    parts: list[Breakdown] = []
    for rank, activity in activities.items():
        b = total(breakdown(activity, w) for w in windows[rank]) if steps is not None else breakdown(activity)
        parts.append(b)
        per_rank[str(rank)] = {**b.as_dict(), "basis": activity.basis, "sources": list(activity.sources)}
    step_of = _step_finder(activities)
    keep = _in_steps(step_of, steps) if steps is not None else None
    bases = {a.basis for a in activities.values()}
    collectives = collective_table(job, keep, step_of) if job is not None else []
    doc = {
        "version": VERSION,
        "basis": bases.pop() if len(bases) == 1 else ("mixed" if bases else None),
        "world_size": job.world_size if job is not None else None,
        "job": job_breakdown(parts),
        "ranks": per_rank,
        "steps": _step_rows(activities, steps),
        "collectives": collectives,
        "stragglers": straggler_table(job, keep) if job is not None else [],
        "modules": module_table(job, depth, steps, keep) if job is not None else [],
        "lateness_map": lateness_map(job, keep) if job is not None else {"ranks": [], "collectives": [],
                                                                         "lateness_s": []},
        "groups": {uid: {"name": g.name, "desc": g.desc, "ranks": list(g.ranks)}
                   for uid, g in sorted(job.groups.items())} if job is not None else {},
        "notes": notes + _profiled_note(activities, steps) + _basis_notes(activities)
        + _untimed_note(collectives, bases),
        "sampled": job.sampled if job is not None else None,
        "clock": _clock(job) if job is not None else None,
    }
    del views
    return doc


def _clock(job: Job) -> dict:
    """How the ranks' clocks were put on rank 0's (model.ClockAlignment), for the header's clock line."""
    clock = job.clock
    return {"method": {str(r): m for r, m in sorted(clock.method.items())},
            "residual_skew_s": clock.residual_skew_ns / 1e9 if clock.residual_skew_ns is not None else None,
            "samples": clock.samples}


def _step_rows(activities: Mapping[int, RankActivity], steps: tuple[int, int] | None) -> list[dict]:
    by_step: dict[int, dict[int, Breakdown]] = {}
    for rank, activity in activities.items():
        for n, begin, end in activity.steps:
            if steps is None or steps[0] <= n <= steps[1]:
                by_step.setdefault(n, {})[rank] = breakdown(activity, (begin, end))
    return [{"step": n, "job": job_breakdown(list(parts.values())),
             "ranks": {str(r): b.as_dict() for r, b in sorted(parts.items())}}
            for n, parts in sorted(by_step.items())]


def _in_steps(step_of: Callable[[Collective], int | None], steps: tuple[int, int]) -> Callable[[Collective], bool]:
    """Whether a collective belongs to one of steps A..B (``_step_finder``: where its first arrival falls), so
    that every table counts a collective in the same step."""
    first, last = steps

    def keep(c: Collective) -> bool:
        step = step_of(c)
        return step is not None and first <= step <= last

    return keep


def _step_finder(activities: Mapping[int, RankActivity]) -> Callable[[Collective], int | None]:
    """The step of a collective: the step window, on the rank that arrived first, holding that arrival (None
    outside every step, or when that rank has no steps). An arrival is ``Collective.ready_ns``: on the GPU
    the first kernel's begin, which falls in the GPU's step windows (the steps of the ``gpu`` basis)."""
    starts = {r: [b for _, b, _ in a.steps] for r, a in activities.items()}

    def step_of(c: Collective) -> int | None:
        ready = c.ready_ns
        known: list[tuple[int, int]] = [(t, r) for t, r in zip(ready, c.ranks) if t is not None] \
            if None in ready else list(zip(cast(tuple[int, ...], ready), c.ranks))
        if not known:
            return None
        t, rank = min(known)
        activity = activities.get(rank)
        if activity is None:
            return None
        i = bisect.bisect_right(starts[rank], t) - 1
        if i < 0:
            return None
        step, _, end = activity.steps[i]
        return step if t < end else None

    return step_of


def _basis_notes(activities: Mapping[int, RankActivity]) -> list[str]:
    notes = []
    cpu = [r for r, a in activities.items() if a.basis == "cpu"]
    if cpu and len(cpu) < len(activities):
        notes.append(f"the profiler traces of {ranks_text(cpu)} have no GPU kernels: the figures of "
                     f"{'this rank' if len(cpu) == 1 else 'these ranks'} come from CPU intervals and do not compare "
                     "with the GPU ranks'")
    empty = [r for r, a in activities.items() if a.span is None]
    if empty:
        notes.append(f"{ranks_text(empty)}: no timed compute or communication recorded")
    elif cpu and not any(a.compute for a in activities.values()):
        notes.append("no compute intervals: record with --profile-steps, or wrap compute in comm2perfetto.range() "
                     "or NVTX ranges, to see overlap")
    return notes


def _profiled_note(activities: Mapping[int, RankActivity], steps: tuple[int, int] | None) -> list[str]:
    """Which steps the figures cover, when compute is known only where the profiler ran (the demo's
    ``--profile-steps 5-8`` of a 40-step job): elsewhere it reads as 0, which is unknown, not idle."""
    known = [p for p in (a.profiled_steps() for a in activities.values()) if p is not None]
    if not known:
        return []
    profiled = set().union(*known)
    selected = sorted({n for a in activities.values() for n, _, _ in a.steps
                       if steps is None or steps[0] <= n <= steps[1]})
    if not selected:
        return []
    head = f"compute is known only in the profiled steps {steps_text(sorted(profiled)) or '(none)'}"
    outside = [n for n in selected if n not in profiled]
    if not outside:
        return [f"{head}: these figures cover steps {steps_text(selected)}, all profiled"]
    hint = f"; --steps {steps_text(sorted(profiled))} reports those alone" if profiled else ""
    return [f"{head}: these figures cover steps {steps_text(selected)}, and the {len(outside)} unprofiled ones "
            f"count no compute{hint}"]


def steps_text(steps: list[int]) -> str:
    """[1, 2, 3, 7] -> '1-3,7': sorted step numbers as runs."""
    runs: list[list[int]] = []
    for n in steps:
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ",".join(f"{a}-{b}" if b > a else str(a) for a, b in runs)


def _untimed_note(collectives: list[dict], bases: set[str]) -> list[str]:
    count = sum(r["count"] for r in collectives)
    untimed = count - sum(r["timed"] for r in collectives)
    if not untimed:
        return []
    where = " and their time is not in the CPU basis's comm_s" if "cpu" in bases else ""
    return [f"{untimed} of {count} collectives have no duration (Flight Recorder does not time gloo collectives, "
            f"nor NCCL ones without TORCH_NCCL_ENABLE_TIMING=1; the recorder times the calls made from Python): "
            f"they count in the collectives table but not in its durations{where}"]
