"""One line of the comparison: a metric of one thing (the job, a rank, a collective...) in both runs, its
change with a confidence interval, and the verdict.

Each metric has a *kind*, which says how noise is told apart:

- ``sampled`` (times, bandwidth, ratios): the rank-based shift of ``statistics.shift`` over the samples of
  each side (per step, or per collective);
- ``exact`` (counts and bytes per step): a program issues the same collectives whatever the noise, so any
  difference is a change;

and a *scale*, the size a change is measured against: ``step`` (a time inside the step, as a share of BASE's
median step time: exposed communication that grew by 2 ms in a 40 ms step grew by 5 %), ``base`` (its own
BASE value: a bus bandwidth 20 % lower, a count per step that doubled) or ``absolute`` (a percentage or a
ratio, whose change is read as it is: overlap in percentage points, comm/compute in its own units).

Verdicts, with ``margin`` the smallest change that counts (``--min-change``: 10 % by default; 10 points for a
percentage, 0.1 for a ratio):

- ``regressed`` / ``improved``: the whole interval lies beyond the margin, on the worse / better side;
- ``unchanged``: it does not (the change is within noise, or smaller than the margin);
- ``inconclusive``: there is no interval (too few samples on a side, or none) and the change seen is beyond
  the margin: the samples cannot tell it from noise;
- ``new`` / ``gone``: what exists in one run only (a collective, a module's collectives, a rank);
- ``unknown``: measured in no compared step of either run (compute outside the profiled steps, gloo's
  communication where nothing timed it): not a figure of 0, and never ``unchanged``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from comm2perfetto.compare.statistics import CONFIDENCE, median, shift
from comm2perfetto.strenum import StrEnum


class Verdict(StrEnum):
    """A line's verdict (see the module docstring)."""

    REGRESSED = "regressed"
    IMPROVED = "improved"
    UNCHANGED = "unchanged"
    INCONCLUSIVE = "inconclusive"
    NEW = "new"
    GONE = "gone"
    UNKNOWN = "unknown"


class Kind(StrEnum):
    """How a metric's noise is told apart."""

    SAMPLED = "sampled"
    EXACT = "exact"


class Scale(StrEnum):
    """What a metric's change is measured against."""

    STEP = "step"
    BASE = "base"
    ABSOLUTE = "absolute"


# The order the summary counts the verdicts in.
VERDICTS = (Verdict.REGRESSED, Verdict.IMPROVED, Verdict.NEW, Verdict.GONE, Verdict.INCONCLUSIVE, Verdict.UNKNOWN,
            Verdict.UNCHANGED)


@dataclass(frozen=True)
class Metric:
    """How one metric is compared. ``worse``: +1 when a higher value is worse, -1 when it is better."""

    name: str
    unit: str  # "s", "B", "GB/s", "%" (a percentage), "" (a count or ratio)
    worse: int
    kind: Kind
    scale: Scale
    meaning: str


METRICS = {m.name: m for m in (
    Metric("step_time", "s", 1, Kind.SAMPLED, Scale.STEP, "step time (a step's window; mean over ranks)"),
    Metric("compute", "s", 1, Kind.SAMPLED, Scale.STEP, "compute time in a step"),
    Metric("comm", "s", 1, Kind.SAMPLED, Scale.STEP, "communication time in a step"),
    Metric("exposed_comm", "s", 1, Kind.SAMPLED, Scale.STEP, "communication no compute hides, in a step"),
    Metric("idle", "s", 1, Kind.SAMPLED, Scale.STEP, "time neither computing nor communicating, in a step"),
    Metric("overlap", "%", -1, Kind.SAMPLED, Scale.ABSOLUTE, "share of communication overlapped with compute"),
    Metric("comm_to_compute", "", 1, Kind.SAMPLED, Scale.ABSOLUTE, "communication time / compute time"),
    Metric("count", "", 1, Kind.EXACT, Scale.BASE, "collectives per step"),
    Metric("bytes", "B", 1, Kind.EXACT, Scale.BASE, "bytes per step"),
    Metric("duration", "s", 1, Kind.SAMPLED, Scale.STEP,
           "the time a step spends in these collectives: their durations (first arrival to last completion)"),
    Metric("busbw", "GB/s", -1, Kind.SAMPLED, Scale.BASE,
           "a collective's bus bandwidth (nccl-tests), from 1 MiB messages"),
    Metric("skew", "s", 1, Kind.SAMPLED, Scale.STEP,
           "these collectives' arrival skews (last arrival - first) in a step"),
    Metric("wait_caused", "s", 1, Kind.SAMPLED, Scale.STEP,
           "how long the others waited for this rank in a step: the skew of each collective it arrived last at"),
)}


@dataclass
class Line:
    """One metric of one thing, in both runs. ``base``/``new``: the value each run shows (the median of its
    samples, a per-step figure, a share in %); ``change``, ``low``, ``high``: the change and its interval in
    the metric's unit (points for a percentage); ``relative*``: the same divided by the scale (None for
    ``absolute``, or when the scale is 0); ``n``: samples on each side."""

    section: str
    key: dict[str, Any]
    metric: str
    base: float | None
    new: float | None
    base_n: int
    new_n: int
    change: float | None
    low: float | None
    high: float | None
    relative: float | None
    relative_low: float | None
    relative_high: float | None
    verdict: Verdict
    scale: Scale
    context: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """The JSON line: the key's fields (group, op, size, rank, path, pass) flattened in."""
        out = asdict(self)
        key = out.pop("key")
        metric = METRICS.get(self.metric)
        return {"section": out.pop("section"), **key, "metric": out.pop("metric"),
                "unit": metric.unit if metric is not None else "", **out}


def judge_sampled(section: str, key: dict[str, Any], metric: Metric, base: Sequence[float], new: Sequence[float],
                  margin: float, step_time: float | None = None, confidence: float = CONFIDENCE,
                  slack: tuple[float, float] | None = None) -> Line | None:
    """A sampled metric's line (None when neither side has a sample). ``step_time``: BASE's median step time,
    the scale of ``step`` metrics (without it they are measured against their own BASE value). ``slack``:
    (fall, rise), the largest shifts of compute (seconds a step) down and up, of the job or any rank; a
    communication time that moved the same way is judged on what moved beyond it (NEW's samples less that
    shift), with ``context["beyond_compute_s"]``."""
    if not base and not new:
        return None
    shown_base = median(base) if base else None
    shown_new = median(new) if new else None
    if not base or not new:
        return Line(section, key, metric.name, shown_base, shown_new, len(base), len(new), None, None, None, None,
                    None, None, Verdict.INCONCLUSIVE, metric.scale)
    est = shift(base, new, confidence)
    context: dict[str, Any] = {}
    explained = (min(slack[1], est.estimate) if est.estimate > 0 else max(slack[0], est.estimate)) \
        if slack is not None else 0.0
    if explained and (est.estimate > 0) == (explained > 0):  # never beyond the change itself
        # A rank that computed slower (less CPU, a busier machine) keeps the others waiting as long, and on a
        # CPU backend its communication slows with it: what moved beyond that is communication's own.
        est = shift(base, [y - explained for y in new], confidence)
        context["beyond_compute_s"] = explained
    change, low, high = est.estimate, est.low, est.high
    scale_value = None if metric.scale == Scale.ABSOLUTE else (
        step_time if metric.scale == Scale.STEP and step_time else shown_base)
    rel, rel_low, rel_high = _relative((change, low, high), scale_value)
    if metric.scale == Scale.ABSOLUTE:
        verdict = _verdict(metric, (change, low, high), absolute_margin(metric, margin))
    else:  # a scale of 0 (nothing in BASE): any change the interval shows
        verdict = _verdict(metric, (rel, rel_low, rel_high) if scale_value else (change, low, high),
                           margin if scale_value else 0.0)
    return Line(section, key, metric.name, shown_base, shown_new, len(base), len(new), change, low, high, rel,
                rel_low, rel_high, verdict,
                metric.scale if metric.scale != Scale.STEP or step_time else Scale.BASE, context)


def judge_exact(section: str, key: dict[str, Any], metric: Metric, base: float | None, new: float | None,
                base_n: int = 1, new_n: int = 1) -> Line:
    """An exact metric's line: ``new``/``gone`` when one side has none of the thing."""
    if base is None or new is None:
        verdict = Verdict.NEW if base is None else Verdict.GONE
        return Line(section, key, metric.name, base, new, base_n if base is not None else 0,
                    new_n if new is not None else 0, None, None, None, None, None, None, verdict, metric.scale)
    d = new - base
    rel = d / base if base else None
    same = math.isclose(new, base, rel_tol=1e-9, abs_tol=1e-12)
    verdict = Verdict.UNCHANGED if same else (Verdict.REGRESSED if d * metric.worse > 0 else Verdict.IMPROVED)
    return Line(section, key, metric.name, base, new, base_n, new_n, d, d, d, rel, rel, rel, verdict, metric.scale)


def absolute_margin(metric: Metric, margin: float) -> float:
    """The margin of an ``absolute`` metric in its own unit: points for a percentage, else the number itself."""
    return margin * 100 if metric.unit == "%" else margin


def _relative(values: tuple[float | None, ...], scale: float | None) -> tuple[float | None, ...]:
    if not scale:
        return (None,) * len(values)
    return tuple(v / scale if v is not None else None for v in values)


def _verdict(metric: Metric, change: tuple[float | None, ...], margin: float) -> Verdict:
    """regressed / improved when the interval lies wholly beyond ``margin``; see the module docstring."""
    estimate, low, high = change
    if estimate is None:
        return Verdict.INCONCLUSIVE
    if low is None or high is None:
        return Verdict.UNCHANGED if abs(estimate) <= margin else Verdict.INCONCLUSIVE
    if low > margin:
        return Verdict.REGRESSED if metric.worse > 0 else Verdict.IMPROVED
    if high < -margin:
        return Verdict.IMPROVED if metric.worse > 0 else Verdict.REGRESSED
    return Verdict.UNCHANGED


def unknown_line(section: str, key: dict[str, Any], metric: Metric) -> Line:
    """A metric measured in no compared step of either run."""
    return Line(section, key, metric.name, None, None, 0, 0, None, None, None, None, None, None, Verdict.UNKNOWN,
                metric.scale)


def presence_line(section: str, key: dict[str, Any], base: bool) -> Line:
    """A thing present in one run only, with no figure to compare (a rank with data in one run)."""
    return Line(section, key, "present", None, None, int(base), int(not base), None, None, None, None, None, None,
                Verdict.GONE if base else Verdict.NEW, Scale.BASE)


def cause(lines: Sequence[Mapping[str, Any]]) -> str | None:
    """What moved the step, in words, for the headline, from the document's lines (after the gate's say): the
    step time beside compute and communication (job lines), and the collective or straggler line that moved
    the most; None when the step time did not move.

    - compute moved with the step and no communication beyond it: the step got slower (faster) overall, a
      load or machine difference;
    - communication moved beyond compute: communication, and where;
    - compute alone: compute;
    - the job's communication held while one rank's moved: that rank, too."""
    job = {line["metric"]: line for line in lines if line["section"] == "job"}
    step = job.get("step_time")
    if step is None or step["verdict"] not in (Verdict.REGRESSED, Verdict.IMPROVED):
        return None
    way = "slower" if step["verdict"] == Verdict.REGRESSED else "faster"
    moved = [job[m] for m in ("exposed_comm", "comm") if m in job and job[m]["verdict"] == step["verdict"]]
    compute = job.get("compute")
    with_compute = compute is not None and compute["verdict"] == step["verdict"]
    if moved:
        where = max((line for line in lines if line["metric"] in ("duration", "skew", "wait_caused")
                     and line["verdict"] == step["verdict"] and line["relative"] is not None),
                    key=lambda line: abs(line["relative"]), default=None)
        beyond = " beyond compute's change" if with_compute else ""
        text = f"communication: {_moved(moved[0])}{beyond}"
        if where is not None:
            what = (f"rank {where['rank']} kept the others waiting" if where["section"] == "straggler"
                    else f"{where['group']} {where['op']} {where['metric']}")
            text += f", most in {what} ({_moved(where)})"
        return text
    # the job's communication held, one rank's moved (a gate line on it can trip): name that rank
    ranks_moved = [line for line in lines if line["section"] == "rank" and line["metric"] in ("exposed_comm", "comm")
                   and line["verdict"] == step["verdict"] and line["relative"] is not None]
    rank = max(ranks_moved, key=lambda line: (line["metric"] == "exposed_comm", abs(line["relative"])), default=None)
    on_rank = f"; rank {rank['rank']}'s communication did: {_moved(rank)}" if rank is not None else ""
    if with_compute and compute is not None:
        return (f"the step got {way} overall: {_moved(compute)}, the job's communication no more than that: a load "
                f"or machine difference, not communication{on_rank}")
    return (f"the step got {way} ({_moved(step)}), neither the job's compute nor its communication alone beyond "
            f"noise{on_rank}")


def _moved(line: Mapping[str, Any]) -> str:
    """``exposed_comm +12.5% of the step``: a line's change in words."""
    if line["relative"] is None:
        return f"{line['metric']} {line['change']:+.3g}" if line["change"] is not None else line["metric"]
    scale = " of the step" if line["scale"] == Scale.STEP and line["metric"] != "step_time" else ""
    return f"{line['metric']} {100 * line['relative']:+.1f}%{scale}"
