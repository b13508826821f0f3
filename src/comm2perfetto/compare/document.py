"""The comparison of two runs as one plain dict (the JSON contract of docs/compare.md).

``build`` is compare's entry point: it takes the two sides (``sides.Side``: a report document each, and the
steps compared; ``sides.load_side`` reads one) and returns::

    {"version": 1, "base": {...}, "new": {...}, "min_change_pct": 10.0, "confidence": 0.95,
     "layout": [...], "groups": [...], "lines": [...], "steps": [...], "summary": {...}, "notes": [...],
     "gate": {"fail_on": ["busbw<-10%"], "failed": [{"expression": "busbw<-10%", "lines": [3]}]}}

(``gate`` only with ``--fail-on``.)

Every figure it shows comes from a report document; compare adds only the statistics of the change.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from comm2perfetto.compare.gate import Expression, gate_failures
from comm2perfetto.compare.keys import Bucket, GroupMatch, match_groups, step_pairs
from comm2perfetto.compare.samples import (
    ALL_SIZES,
    BREAKDOWN_KEYS,
    CollectiveSamples,
    breakdown_samples,
    collective_samples,
    module_counts,
    module_steps,
    step_figures,
    steps_covered,
    straggler_counts,
    wait_caused_samples,
)
from comm2perfetto.compare.sides import Side, layout_notes
from comm2perfetto.compare.statistics import CONFIDENCE, median, shift
from comm2perfetto.compare.verdicts import (
    METRICS,
    VERDICTS,
    Line,
    cause,
    judge_exact,
    judge_sampled,
    presence_line,
    unknown_line,
)
from comm2perfetto.report.bandwidth import percentile
from comm2perfetto.report.document import steps_text
from comm2perfetto.report_doc import FigureKey

VERSION = 1
MIN_CHANGE = 0.10
# Communication times that a slower rank (less CPU, a busier machine) stretches by its compute's slowdown.
LOAD_SCALED = frozenset({"comm", "exposed_comm", "duration"})
# Bus bandwidth is compared from this message size up: below it a collective's time is mostly its latency,
# which its duration already shows (nccl-tests' bandwidth curves flatten from about 1 MiB on GPUs).
MIN_BANDWIDTH_BYTES = 1 << 20
STEP_FIGURES: tuple[FigureKey, ...] = ("span_s", "compute_s", "comm_s", "exposed_comm_s", "idle_s", "overlap_pct")


@dataclass(frozen=True, slots=True)
class CompareOptions:
    """How two runs are compared: ``min_change``, the smallest change that counts (0.10: 10 %, or 10 points for
    a percentage; ``--min-change``); ``steps_by_position``: pair the steps of the two ranges by position, not by
    number (``--steps A-B:C-D``); ``gate``: the ``--fail-on`` expressions (``gate.parse_gate``);
    ``beyond_load``: judge a communication time that moved with compute on what moved beyond compute's
    shift (``verdicts.judge_sampled``'s ``slack``); False is the rule before it, which
    benchmarks/compare_noise.py measures beside it."""

    min_change: float = MIN_CHANGE
    confidence: float = CONFIDENCE
    steps_by_position: bool = False
    gate: tuple[Expression, ...] = ()
    beyond_load: bool = True


def build(base: Side, new: Side, options: CompareOptions) -> dict[str, Any]:
    """Compare NEW with BASE, and say which ``--fail-on`` expressions fire on which lines (``gate``)."""
    doc = _comparison(base, new, options)
    if options.gate:
        doc["gate"] = {"fail_on": [str(e) for e in options.gate], "failed": gate_failures(options.gate, doc["lines"])}
    return doc


def _comparison(base: Side, new: Side, options: CompareOptions) -> dict[str, Any]:
    min_change, confidence = options.min_change, options.confidence
    per_step = bool(base.steps) and bool(new.steps)
    groups = match_groups(base.doc, new.doc)
    base_job = breakdown_samples(base, per_step=per_step)
    step_time = median(base_job["step_time"]) if base_job["step_time"] else None
    new_job = breakdown_samples(new, per_step=per_step)
    judge = _Judge(min_change, confidence, _slack(base, new, base_job, new_job, per_step)
                   if options.beyond_load else None)
    lines = judge.breakdowns("job", {}, base_job, new_job)
    lines += _rank_lines(judge, base, new, per_step)
    lines += _collective_lines(judge, base, new, groups, step_time if per_step else None)
    lines += _straggler_lines(judge, base, new, per_step, step_time)
    lines += _module_lines(base, new)
    notes = layout_notes(base, new) + _group_notes(groups) + _sample_notes(base, new)
    return {
        "version": VERSION,
        "base": _summary(base),
        "new": _summary(new),
        "min_change_pct": 100 * min_change,
        "confidence": confidence,
        "layout": notes,
        "groups": [{"label": g.label, "base_ranks": _list(g.base_ranks), "new_ranks": _list(g.new_ranks),
                    "matched_by": g.how} for g in groups],
        "lines": [line.as_dict() for line in lines],
        "steps": _step_table(base, new, options.steps_by_position),
        "summary": {v: sum(1 for line in lines if line.verdict == v) for v in VERDICTS},
        "cause": cause([line.as_dict() for line in lines]),
        "notes": [f"{side.role}: {note}" for side in (base, new) for note in side.doc["notes"]],
    }


class _Judge:
    """The verdict functions with this comparison's margin and confidence."""

    def __init__(self, margin: float, confidence: float, slack: tuple[float, float] | None) -> None:
        self.margin = margin
        self.confidence = confidence
        self.slack = slack

    def sampled(self, section: str, key: dict[str, Any], metric: str, base: list[float], new: list[float],
                step_time: float | None = None) -> Line | None:
        return judge_sampled(section, key, METRICS[metric], base, new, self.margin, step_time, self.confidence,
                             self.slack if metric in LOAD_SCALED else None)

    def breakdowns(self, section: str, key: dict[str, Any], base: Mapping[str, list[float]],
                   new: Mapping[str, list[float]]) -> list[Line]:
        """The breakdown metrics of the job or one rank; times as a share of BASE's median step time. A metric
        no step measured on either side is ``unknown``: its samples hold only the steps that measured it."""
        step_time = median(base["step_time"]) if base["step_time"] else None
        return [self.sampled(section, key, name, base[name], new[name], step_time)
                or unknown_line(section, key, METRICS[name]) for name in BREAKDOWN_KEYS]


def _slack(base: Side, new: Side, base_job: Mapping[str, list[float]], new_job: Mapping[str, list[float]],
           per_step: bool) -> tuple[float, float] | None:
    """(fall, rise): the largest shifts down and up (seconds a step, 0 for none) of the compute of the job
    and of each rank in both runs; None when no compute is measured on both sides. The slowest rank sets the
    pace: the others wait for it as long as it computed longer."""
    pairs = [(base_job["compute"], new_job["compute"])]
    for rank in set(base.ranks) & set(new.ranks):
        pairs.append((breakdown_samples(base, str(rank), per_step)["compute"],
                      breakdown_samples(new, str(rank), per_step)["compute"]))
    shifts = [shift(b, n).estimate for b, n in pairs if b and n]
    return (min(0.0, *shifts), max(0.0, *shifts)) if shifts else None


def _rank_lines(judge: _Judge, base: Side, new: Side, per_step: bool) -> list[Line]:
    lines: list[Line] = []
    for rank in sorted(set(base.ranks) | set(new.ranks)):
        key = {"rank": rank}
        if rank not in new.ranks or rank not in base.ranks:
            lines.append(presence_line("rank", key, rank in base.ranks))
            continue
        lines += judge.breakdowns("rank", key, breakdown_samples(base, str(rank), per_step),
                                  breakdown_samples(new, str(rank), per_step))
    return lines


def _collective_lines(judge: _Judge, base: Side, new: Side, groups: list[GroupMatch],
                      step_time: float | None) -> list[Line]:
    """Per matched group and op: the totals over every size when there are several sizes, then each size
    bucket's count, bytes, duration, bus bandwidth and skew (with the rank the others waited for)."""
    base_cs, new_cs = collective_samples(base), collective_samples(new)
    lines: list[Line] = []
    for g in groups:
        ops = sorted({op for uid, op in base_cs if uid == g.base_uid} | {op for uid, op in new_cs if uid == g.new_uid})
        for op in ops:
            b = base_cs.get((g.base_uid or "", op), {})
            n = new_cs.get((g.new_uid or "", op), {})
            sizes = sorted({k for k in (*b, *n) if k != ALL_SIZES}, key=_bucket_order)
            if any(not side[ALL_SIZES].sampled for side in (b, n) if ALL_SIZES in side):
                sizes = []  # a report saved without samples has totals only: compare those
            if len(sizes) != 1:
                key: dict[str, Any] = {"group": g.label, "op": op, "size": ALL_SIZES}
                lines += _count_lines(key, b.get(ALL_SIZES), n.get(ALL_SIZES), base, new)
            for size in sizes:
                key = {"group": g.label, "op": op, "size": list(size) if isinstance(size, tuple) else size}
                lines += _bucket_lines(judge, key, b.get(size), n.get(size), base, new, step_time)
    return lines


def _bucket_order(size: Bucket | str | None) -> tuple[int, int]:
    return (1, 0) if not isinstance(size, tuple) else (0, size[0])


def _per_step(side: Side, samples: CollectiveSamples, per_run: bool) -> tuple[float, float]:
    """(count, bytes) per step of the compared steps, or in the whole run (``per_run``: one-off collectives);
    a report saved without samples counts over every step it covered."""
    if per_run:
        return samples.count, samples.bytes
    if not samples.sampled:
        return samples.count / module_steps(side), samples.bytes / module_steps(side)
    if not side.steps:
        return samples.count, samples.bytes
    return samples.in_steps / steps_covered(side), samples.bytes_in_steps / steps_covered(side)


def _count_lines(key: dict[str, Any], b: CollectiveSamples | None, n: CollectiveSamples | None, base: Side,
                 new: Side) -> list[Line]:
    """Count and bytes per step; of one-off collectives (occasional in both runs, or in the one that has
    them), per run, with ``per: run`` in the key."""
    per_run = all(samples.occasional(side) for samples, side in ((b, base), (n, new))
                  if samples is not None and samples.count)
    if per_run:
        key = {**key, "per": "run"}
    b_count, b_bytes = _per_step(base, b, per_run) if b is not None and b.count else (None, None)
    n_count, n_bytes = _per_step(new, n, per_run) if n is not None and n.count else (None, None)
    if b_count is None and n_count is None:
        return []
    if not per_run and not b_count and not n_count:
        return []  # none in a compared step on either side
    base_n, new_n = (1, 1) if per_run else (len(base.steps), len(new.steps))
    if not per_run:  # none in the compared steps is none per step
        b_count, b_bytes = (None, None) if not b_count else (b_count, b_bytes)
        n_count, n_bytes = (None, None) if not n_count else (n_count, n_bytes)
    lines = [judge_exact("collective", key, METRICS["count"], b_count, n_count, base_n, new_n)]
    if b_count is not None and n_count is not None:
        lines.append(judge_exact("collective", key, METRICS["bytes"], b_bytes, n_bytes, base_n, new_n))
    return lines


def _bucket_lines(judge: _Judge, key: dict[str, Any], b: CollectiveSamples | None, n: CollectiveSamples | None,
                  base: Side, new: Side, step_time: float | None) -> list[Line]:
    lines = _count_lines(key, b, n, base, new)
    if b is None or n is None or not b.count or not n.count:
        return lines  # new or gone: nothing to compare beyond its count
    duration = judge.sampled("collective", key, "duration", b.per_step(base, "duration"),
                             n.per_step(new, "duration"), step_time)
    if duration is not None:
        duration.context = {**duration.context, "base_p50": _p50(b.durations), "new_p50": _p50(n.durations),
                            "base_p99": _p99(b.durations), "new_p99": _p99(n.durations)}
    skew = judge.sampled("collective", key, "skew", b.per_step(base, "skew"), n.per_step(new, "skew"), step_time)
    if skew is not None:
        skew.context = {"base_last": _waited_for(b.waited_for), "new_last": _waited_for(n.waited_for)}
    size = key["size"]
    busbw = judge.sampled("collective", key, "busbw", b.busbw, n.busbw) \
        if isinstance(size, list) and size[0] >= MIN_BANDWIDTH_BYTES else None
    return lines + [line for line in (duration, busbw, skew) if line is not None]


def _p50(values: list[float]) -> float | None:
    return percentile(sorted(values), 50) if values else None


def _p99(values: list[float]) -> float | None:
    return percentile(sorted(values), 99) if values else None


def _waited_for(waits: Mapping[int, float]) -> dict[str, Any] | None:
    """The rank the others waited for longest (the skews of the collectives it arrived last at, added up; the
    lowest such rank on a tie) and its share of all the waiting, in %."""
    total = sum(waits.values())
    if not waits or total <= 0:
        return None
    rank = min(waits, key=lambda r: (-waits[r], r))
    return {"rank": rank, "share_pct": 100.0 * waits[rank] / total}


def _straggler_lines(judge: _Judge, base: Side, new: Side, per_step: bool, step_time: float | None) -> list[Line]:
    """Per rank of both runs: how long the others waited for it in a step, with the report's straggler
    figures beside it."""
    b, n = wait_caused_samples(base, per_step), wait_caused_samples(new, per_step)
    b_table, n_table = straggler_counts(base), straggler_counts(new)
    lines = []
    for rank in sorted(set(b) & set(n)):
        line = judge.sampled("straggler", {"rank": rank}, "wait_caused", b[rank], n[rank], step_time)
        if line is not None:
            line.context = {"base": _straggler_context(b_table.get(rank)), "new": _straggler_context(n_table.get(rank))}
            lines.append(line)
    return lines


def _straggler_context(row: tuple[int, int, float | None] | None) -> dict[str, Any] | None:
    if row is None:
        return None
    last, matched, late = row
    return {"last_arrivals": last, "matched": matched, "mean_lateness_s": late}


def _module_lines(base: Side, new: Side) -> list[Line]:
    """Each (module, pass, op)'s collectives per step, compared exactly."""
    b, n = module_counts(base), module_counts(new)
    bs, ns = module_steps(base), module_steps(new)
    lines = []
    for path, pass_, op in sorted(set(b) | set(n), key=lambda k: (k[0], k[1] or "", k[2])):
        key = {"path": path, "pass": pass_, "op": op}
        bc, bb = b.get((path, pass_, op), (None, None))
        nc, nb = n.get((path, pass_, op), (None, None))
        lines.append(judge_exact("module", key, METRICS["count"], bc / bs if bc is not None else None,
                                 nc / ns if nc is not None else None, bs, ns))
        if bb is not None and nb is not None:
            lines.append(judge_exact("module", key, METRICS["bytes"], bb / bs, nb / ns, bs, ns))
    return lines


def _step_table(base: Side, new: Side, by_position: bool) -> list[dict[str, Any]]:
    rows = []
    for b, n in step_pairs(base.steps, new.steps, by_position):
        bf, nf = step_figures(base, b), step_figures(new, n)
        rows.append({"base_step": b, "new_step": n,
                     "base": {k: bf[k] if bf is not None else None for k in STEP_FIGURES},
                     "new": {k: nf[k] if nf is not None else None for k in STEP_FIGURES}})
    return rows


def _summary(side: Side) -> dict[str, Any]:
    return {"path": side.path, "basis": side.doc["basis"], "world_size": side.world_size,
            "ranks": list(side.ranks), "steps": list(side.steps)}


def _group_notes(groups: list[GroupMatch]) -> list[str]:
    """Groups whose ranks changed, and groups of one run only (their collectives are new or gone)."""
    notes = []
    for g in groups:
        if g.how == "description":
            notes.append(f"group {g.label}: ranks {_ranks(g.base_ranks)} in BASE, {_ranks(g.new_ranks)} in NEW "
                         "(matched by its description)")
    for role, how in (("BASE", "base only"), ("NEW", "new only")):
        alone = [g.label for g in groups if g.how == how]
        if alone:
            notes.append(f"groups only in {role}: {', '.join(alone)} (their collectives are listed as "
                         f"{'gone' if role == 'BASE' else 'new'})")
    return notes


def _ranks(ranks: tuple[int, ...] | None) -> str:
    return steps_text(list(ranks)) if ranks is not None else "unknown"


def _sample_notes(base: Side, new: Side) -> list[str]:
    notes = []
    for side in (base, new):
        rows = side.doc["collectives"]
        if rows and all(r["instances"] is None for r in rows):
            notes.append(f"{side.role} is a report saved without per-collective samples (before they were added): "
                         "its collectives are compared by count and bytes only; report it again to compare "
                         "durations, bandwidth and skew")
    return notes


def _list(values: tuple[int, ...] | None) -> list[int] | None:
    return list(values) if values is not None else None
