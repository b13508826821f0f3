"""The report document: every analysis over a job, as one plain dict (the JSON contract in docs/report.md).

``build`` is report's entry point: the document of a loaded job (``load_options.REPORT``), with the notes on
how it was read. ``build_report`` takes the job (or None when only profiler traces were given) and each rank's
profiler traces already reduced to unions (``Job.profiles``), and returns::

    {"version": 1, "basis": "gpu", "world_size": 8, "job": {...}, "ranks": {"0": {...}}, "steps": [...],
     "collectives": [...], "all_to_all": [...], "stragglers": [...], "modules": [...], "lateness_map": {...},
     "groups": {...}, "notes": [...], "sampled": null, "clock": {"method": {"0": "measured", "1": "refined"},
     "residual_skew_s": 1.5e-05, "samples": 6}, "scope": [5, 8]}
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NamedTuple, cast

from comm2perfetto.diagnose.other_attempts import attempts_note
from comm2perfetto.errors import Comm2PerfettoError
from comm2perfetto.job import Job
from comm2perfetto.model import Collective
from comm2perfetto.report.activity import FlightRecorderSpans, RankActivity, rank_activity
from comm2perfetto.report.bandwidth import CollectiveTable
from comm2perfetto.report.exchanges import ExchangeTable
from comm2perfetto.report.live_windows import live_windows
from comm2perfetto.report.modules import ModuleTable
from comm2perfetto.report.overlap import Breakdown, breakdown, job_breakdown, total
from comm2perfetto.report.stragglers import LatenessTable, Stragglers
from comm2perfetto.report_doc import VERSION, Basis, Clock, CollectiveRow, RankFigures, ReportDoc
from comm2perfetto.sources.kineto.profile import RankProfile
from comm2perfetto.words import ranks_text

__all__ = ["ReportOptions", "StepsError", "build", "build_report", "steps_text"]

class StepsError(Comm2PerfettoError, ValueError):
    """The steps asked for are none of those the job recorded: a report of them would be all zeros."""


class ReportOptions(NamedTuple):
    """What a report covers: ``steps`` A..B only (inclusive; ``--steps``), module paths cut to ``depth``
    components (``--depth``)."""

    steps: tuple[int, int] | None = None
    depth: int | None = None


def build(job: Job, options: ReportOptions) -> ReportDoc:
    """The report of ``job`` (loaded with profiles: ``load_options.REPORT``), what ``report`` prints and
    ``compare`` compares: its figures (``build_report``), what it is about (``paths``), and notes on how it was
    read (HTA's rounding or scope), on the job's other attempts, and from the loading (skipped files ...)."""
    profiles = dict(job.profiles)
    # With neither dumps, logs nor collectives in the traces there is nothing matched to report on.
    matched = any(info.fr_files or info.log_file for info in job.ranks.values()) or any(job.traces.values())
    doc = build_report(job if matched else None, profiles, steps=options.steps, depth=options.depth)
    doc["paths"] = list(job.paths)  # what the report is about, for its page's header
    live = live_windows(job.logs)
    if live is not None:
        doc["live"] = live
    if job.options.hta_scope and profiles:
        doc["notes"].append("HTA's scope (--hta-scope): kernels launched inside a profiler step other than the "
                            "last, NCCL/RCCL kernels as communication, times rounded inward to whole microseconds")
    elif job.options.hta_rounding and profiles:
        doc["notes"].append("profiler events rounded inward to whole microseconds, as HTA does (--hta-rounding)")
    attempts = attempts_note(job, "this report")
    if attempts is not None:
        doc["notes"].insert(0, attempts)
    doc["notes"].extend(job.notes)
    doc["notes"].extend(f"skipped {s.path}: {s.reason}" for s in job.skipped)
    return doc


def build_report(job: Job | None, profiles: Mapping[int, RankProfile], steps: tuple[int, int] | None = None,
                 depth: int | None = None) -> ReportDoc:
    """Everything ``comm2perfetto report`` prints. ``steps``: only steps A..B (inclusive).

    Memory follows the answer: each rank's unions are measured and dropped before the next rank's are made,
    and each collective is read once for every table, then dropped (``_collective_tables``)."""
    ranks = sorted(set(job.ranks if job is not None else ()) | set(profiles))
    fr_spans = FlightRecorderSpans(job) if job is not None else None
    facts: dict[int, _RankFacts] = {}
    per_rank: dict[str, RankFigures] = {}
    parts: list[Breakdown] = []
    by_step: dict[int, dict[int, Breakdown]] = {}
    for rank in ranks:
        activity = rank_activity(job, rank, profiles.get(rank), fr_spans(rank) if fr_spans is not None else [],
                                 fr_spans.untimed(rank) if fr_spans is not None else ())
        selected = [(n, b, e) for n, b, e in activity.steps if steps is None or steps[0] <= n <= steps[1]]
        in_steps = [(n, breakdown(activity, (begin, end))) for n, begin, end in selected]
        b = total(part for _, part in in_steps) if steps is not None else breakdown(activity)
        parts.append(b)
        per_rank[str(rank)] = {**b.as_dict(), "basis": activity.basis, "sources": list(activity.sources)}
        for n, part in in_steps:
            by_step.setdefault(n, {})[rank] = part
        facts[rank] = _RankFacts.of(activity)
    notes = [n for p in profiles.values() for n in p.notes]
    if steps is not None and not by_step:
        recorded = sorted({n for f in facts.values() for n, _, _ in f.steps})
        asked = f"{steps[0]}-{steps[1]}" if steps[1] > steps[0] else str(steps[0])
        raise StepsError(f"--steps {asked}: no rank recorded these steps "
                         f"({'the job recorded steps ' + steps_text(recorded) if recorded else 'no steps recorded'})")

    bases = {f.basis for f in facts.values()}
    tables = _collective_tables(job, depth, steps, _step_finder(facts)) if job is not None else None
    collectives = tables.collectives.rows() if tables is not None else []
    untimed = tables.collectives.untimed() if tables is not None else {}
    return {
        "version": VERSION,
        "basis": bases.pop() if len(bases) == 1 else (Basis.MIXED if bases else None),
        "world_size": job.world_size if job is not None else None,
        "job": job_breakdown(parts),
        "ranks": per_rank,
        "steps": [{"step": n, "job": job_breakdown(list(step_parts.values())),
                   "ranks": {str(r): b.as_dict() for r, b in sorted(step_parts.items())}}
                  for n, step_parts in sorted(by_step.items())],
        "collectives": collectives,
        "all_to_all": tables.exchanges.rows() if tables is not None else [],
        "stragglers": tables.stragglers.rows() if tables is not None else [],
        "modules": tables.modules.rows() if tables is not None else [],
        "lateness_map": tables.lateness.result() if tables is not None else {"ranks": [], "collectives": [],
                                                                              "lateness_s": []},
        "groups": {uid: {"name": g.name, "desc": g.desc, "ranks": list(g.ranks)}
                   for uid, g in sorted(job.groups.items())} if job is not None else {},
        "notes": notes + _profiled_note(facts, steps) + _basis_notes(facts) + _untimed_note(collectives, untimed, bases)
        + _one_rank_note(collectives) + (_captured_note(job) if job is not None else [])
        + (tables.exchanges.notes() if tables is not None else []),
        "sampled": job.sampled if job is not None else None,
        "clock": _clock(job) if job is not None else None,
        "scope": list(steps) if steps is not None else None,
    }


@dataclass(frozen=True, slots=True)
class _RankFacts:
    """What the report keeps of a rank's activity once its figures are taken (its unions are dropped)."""

    basis: Basis
    steps: tuple[tuple[int, int, int], ...]  # (step, begin, end) on the job's clock
    profiled_steps: list[int] | None  # RankActivity.profiled_steps
    has_span: bool  # some timed compute or communication
    has_compute: bool

    @classmethod
    def of(cls, activity: RankActivity) -> _RankFacts:
        return cls(activity.basis, activity.steps, activity.profiled_steps(), activity.span is not None,
                   bool(activity.compute))


@dataclass
class _Tables:
    collectives: CollectiveTable
    stragglers: Stragglers
    lateness: LatenessTable
    modules: ModuleTable
    exchanges: ExchangeTable


def _collective_tables(job: Job, depth: int | None, steps: tuple[int, int] | None,
                       step_of: Callable[[Collective], int | None]) -> _Tables:
    """Every table over the job's collectives, from one pass: a collective's per-rank tuples are decoded once
    for all the tables and dropped with it. With ``steps``, only the collectives in those steps (by
    ``step_of``, so that every table counts a collective in the same step), and no send/recv (p2p has no
    step)."""
    tables = _Tables(CollectiveTable(job, with_p2p=steps is None, steps=steps), Stragglers(), LatenessTable(job),
                     ModuleTable(job, depth, steps), ExchangeTable(job))
    for uid, cols in job.collectives.items():
        for i, c in enumerate(cols):
            step = step_of(c)
            if steps is not None and (step is None or not steps[0] <= step <= steps[1]):
                continue
            tables.collectives.add(uid, c, step)
            tables.stragglers.add(c)
            tables.lateness.add(uid, i, c)
            tables.modules.add(uid, c)
            tables.exchanges.add(uid, c)
    return tables


def _clock(job: Job) -> Clock:
    """How the ranks' clocks were put on rank 0's (model.ClockAlignment), for the header's clock line."""
    clock = job.clock
    return {"method": {str(r): m for r, m in sorted(clock.method.items())},
            "residual_skew_s": clock.residual_skew_ns / 1e9 if clock.residual_skew_ns is not None else None,
            "samples": clock.samples, "fit": {str(r): f for r, f in sorted(clock.fit.items())},
            "drift_ppm": {str(r): ppm for r, ppm in clock.drifts_ppm().items()},
            "residual_s": {str(r): ns / 1e9 for r, ns in sorted(clock.residual_ns.items())},
            "uncalibrated": {str(r): ns / 1e9 for r, ns in sorted(clock.uncalibrated.items())}}


def _step_finder(facts: Mapping[int, _RankFacts]) -> Callable[[Collective], int | None]:
    """The step of a collective: the step window, on the rank that arrived first, holding that arrival (None
    outside every step, or when that rank has no steps). An arrival is ``Collective.ready_ns``: on the GPU
    the first kernel's begin, which falls in the GPU's step windows (the steps of the ``gpu`` basis)."""
    starts = {r: [b for _, b, _ in f.steps] for r, f in facts.items()}
    if not any(starts.values()):  # no rank has steps (Flight Recorder alone): nothing to look for
        return lambda c: None

    def step_of(c: Collective) -> int | None:
        ready = c.ready_ns
        known: list[tuple[int, int]] = [(t, r) for t, r in zip(ready, c.ranks) if t is not None] \
            if None in ready else list(zip(cast(tuple[int, ...], ready), c.ranks))
        if not known:
            return None
        t, rank = min(known)
        f = facts.get(rank)
        if f is None:
            return None
        i = bisect.bisect_right(starts[rank], t) - 1
        if i < 0:
            return None
        step, _, end = f.steps[i]
        return step if t < end else None

    return step_of


def _basis_notes(facts: Mapping[int, _RankFacts]) -> list[str]:
    notes = []
    cpu = [r for r, f in facts.items() if f.basis == Basis.CPU]
    if cpu and len(cpu) < len(facts):
        notes.append(f"the profiler traces of {ranks_text(cpu)} have no GPU kernels: the figures of "
                     f"{'this rank' if len(cpu) == 1 else 'these ranks'} come from CPU intervals and do not compare "
                     "with the GPU ranks'")
    empty = [r for r, f in facts.items() if not f.has_span]
    if empty:
        notes.append(f"{ranks_text(empty)}: no timed compute or communication recorded")
    elif cpu and not any(f.has_compute for f in facts.values()):
        notes.append("no compute intervals: record with --profile-steps, or wrap compute in comm2perfetto.range() "
                     "or NVTX ranges, to see overlap")
    return notes


def _profiled_note(facts: Mapping[int, _RankFacts], steps: tuple[int, int] | None) -> list[str]:
    """Which steps the figures cover, when compute is known only where the profiler ran (the demo's
    ``--profile-steps 5-8`` of a 40-step job): elsewhere it is unknown, neither 0 nor idle."""
    known = [f.profiled_steps for f in facts.values() if f.profiled_steps is not None]
    if not known:
        return []
    profiled = set().union(*known)
    selected = sorted({n for f in facts.values() for n, _, _ in f.steps
                       if steps is None or steps[0] <= n <= steps[1]})
    if not selected:
        return []
    head = f"compute is known only in the profiled steps {steps_text(sorted(profiled)) or '(none)'}"
    outside = [n for n in selected if n not in profiled]
    if not outside:
        return [f"{head}: these figures cover steps {steps_text(selected)}, all profiled"]
    hint = f"; --steps {steps_text(sorted(profiled))} reports those alone" if profiled else ""
    where = "the run's figures count none there" if steps is None else "so are the totals over them"
    return [f"{head}: these figures cover steps {steps_text(selected)}; in the {len(outside)} unprofiled ones "
            f"compute is not measured: '-' (null) in their rows, and {where}{hint}"]


def steps_text(steps: list[int]) -> str:
    """[1, 2, 3, 7] -> '1-3,7': sorted step numbers as runs."""
    runs: list[list[int]] = []
    for n in steps:
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ",".join(f"{a}-{b}" if b > a else str(a) for a, b in runs)


def _untimed_note(collectives: list[CollectiveRow], untimed: Mapping[str, int], bases: set[Basis]) -> list[str]:
    """How many collectives have no duration, and why (``report.untimed``: each one's cause, as the data shows
    it)."""
    count = sum(r["count"] for r in collectives)
    missing = count - sum(r["timed"] for r in collectives)
    if not missing:
        return []
    where = (" and their time is not in the CPU basis's comm_s (a step where the rank arrived at one has no "
             "communication figures: '-', null)") if Basis.CPU in bases else ""
    why = "; ".join(f"{n} {reason}" for reason, n in untimed.items())
    return [f"{missing} of {count} collectives have no duration, counted in the collectives table but not in its "
            f"durations{where}: {why}"]


def _one_rank_note(collectives: list[CollectiveRow]) -> list[str]:
    """Why rows of a one-rank group have no bandwidth (``report.bandwidth``: nothing crossed a link)."""
    alone = sorted({str(r["process_group"]) for r in collectives if r["group_size"] == 1})
    if not alone:
        return []
    return [f"no algbw/busbw on {', '.join(alone)}: a group of one rank moves nothing over a link"]


def _captured_note(job: Job) -> list[str]:
    """The calls captured into a CUDA graph (the log's ``v`` records), which no table counts: a graph issues
    them at each of its replays, and no source records a replay, so how many ran is not known."""
    counts: dict[tuple[str, str], int] = {}
    ranks: dict[tuple[str, str], set[int]] = {}
    for rank, log in job.logs.items():
        for call in log.calls:
            if call.captured:
                group = log.groups.get(call.gid)
                key = (call.op, group.desc or group.name if group is not None else "?")
                counts[key] = counts.get(key, 0) + 1
                ranks.setdefault(key, set()).add(rank)
    if not counts:
        return []
    what = ", ".join(f"{n} {op} on {group} ({ranks_text(sorted(ranks[(op, group)]))})"
                     for (op, group), n in sorted(counts.items()))
    return [f"captured into a CUDA graph and not counted in any table: {what}; a graph issues them at each of its "
            "replays, and nothing recorded how many times it was replayed"]
