"""The samples of each side that the statistics compare, taken from its report document as they are.

- **Breakdowns** (step time, compute, communication, exposed communication, idle, overlap, comm/compute):
  one sample per compared step, from the report's per-step rows (the job's, or one rank's); a side with no
  step compared gives its whole-run figures, one sample.
- **Collectives**, per (group, op) and message-size bucket, from the report's ``instances``: the time its
  collectives take (their durations added up) and their arrival skews added up, one sample per compared step
  (0 for a step without one), or one per collective when the runs have no steps; each collective's bus
  bandwidth; the rank that arrived last; counts and bytes are totals.
- **Stragglers**: per compared step, how long the others waited for each rank: the arrival skew of every
  collective it arrived last at (the report's ``instances``), summed; the report's straggler table (last
  arrivals, mean lateness) is shown beside it.
- **Modules**: each (module, pass, op)'s count and bytes (the report's module table).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from comm2perfetto.compare.keys import Bucket, size_bucket
from comm2perfetto.compare.sides import Side
from comm2perfetto.report_doc import FigureKey, Instances, SavedFigures

# The report's breakdown keys, by the name compare gives them (the --fail-on metric names).
BREAKDOWN_KEYS: dict[str, FigureKey] = {
    "step_time": "span_s", "compute": "compute_s", "comm": "comm_s", "exposed_comm": "exposed_comm_s", "idle": "idle_s",
    "overlap": "overlap_pct", "comm_to_compute": "comm_to_compute"}
ALL_SIZES = "all"  # the bucket key of a (group, op)'s totals over every size


@dataclass
class CollectiveSamples:
    """The collectives of one (group, op, size bucket) on one side, over the compared steps."""

    count: int = 0
    bytes: int = 0
    in_steps: int = 0  # of count, those in a compared step, and their bytes
    bytes_in_steps: int = 0
    steps_seen: set[int] = field(default_factory=set)  # the compared steps with one of them
    durations: list[float] = field(default_factory=list)  # one per collective (for p50 and p99)
    busbw: list[float] = field(default_factory=list)
    skews: list[float] = field(default_factory=list)
    waited_for: dict[int, float] = field(default_factory=dict)  # rank that arrived last -> the skews it caused
    duration_by_step: dict[int | None, float] = field(default_factory=dict)
    skew_by_step: dict[int | None, float] = field(default_factory=dict)
    sampled: bool = True  # False: a report saved without per-collective samples (only its totals are known)

    def occasional(self, side: Side) -> bool:
        """Whether these are one-off collectives rather than per-step ones: in fewer than half the compared
        steps (DDP's start-up broadcasts, a barrier at the end, a metric reduced once an epoch). Their count
        is compared per run, so runs of different length compare; per step it would be divided by the
        steps."""
        return bool(side.steps) and self.sampled and 2 * len(self.steps_seen) < len(side.steps)

    def per_step(self, side: Side, what: str) -> list[float]:
        """``duration`` or ``skew``: added up per compared step (0 where none ran), or one sample per
        collective when the side has no step compared; empty when none of them has that figure."""
        by_step = self.duration_by_step if what == "duration" else self.skew_by_step
        if not by_step:
            return []
        if not side.steps:
            return list(self.durations if what == "duration" else self.skews)
        return [by_step.get(step, 0.0) for step in side.steps]


def breakdown_samples(side: Side, rank: str | None = None, per_step: bool = True) -> dict[str, list[float]]:
    """Metric name -> its value at each compared step (``rank``: that rank's, else the job's); with
    ``per_step`` False, or no step compared, the whole run's value."""
    rows = [s["ranks"].get(rank) if rank is not None else s["job"] for s in side.step_rows]
    if not per_step or not side.steps:
        rows = [side.doc["ranks"].get(rank) if rank is not None else side.doc["job"]]
    out: dict[str, list[float]] = {}
    for name, key in BREAKDOWN_KEYS.items():
        out[name] = [value for row in rows if row is not None and (value := row[key]) is not None]
    return out


def collective_samples(side: Side) -> dict[tuple[str, str], dict[Bucket | str | None, CollectiveSamples]]:
    """(group uid, op) -> size bucket -> samples; the bucket :data:`ALL_SIZES` holds the (group, op)'s totals.
    A group's uid is its ``group_uid``, or its label in a report saved before groups were listed."""
    out: dict[tuple[str, str], dict[Bucket | str | None, CollectiveSamples]] = {}
    for row in side.doc["collectives"]:
        uid = row["group_uid"] or row["process_group"]
        buckets = out.setdefault((uid, row["op"]), {})
        total = buckets.setdefault(ALL_SIZES, CollectiveSamples())
        instances = row["instances"]
        if instances is None:
            total.count += row["count"] or 0
            total.bytes += row["bytes"] or 0
            total.sampled = False
            continue
        _add_instances(side, instances, buckets, total)
    return out


def _add_instances(side: Side, columns: Instances, buckets: dict, total: CollectiveSamples) -> None:
    compared_steps = set(side.steps)
    for step, nbytes, duration, busbw, skew, last in zip(
            columns["step"], columns["bytes"], columns["duration_s"], columns["busbw_gbps"],
            columns["arrival_skew_s"], columns["last_rank"]):
        if not side.keeps(step):
            continue
        bucket = buckets.setdefault(size_bucket(nbytes), CollectiveSamples())
        compared = step in compared_steps
        for samples in (bucket, total):
            samples.count += 1
            samples.bytes += nbytes or 0
            if compared:
                samples.in_steps += 1
                samples.bytes_in_steps += nbytes or 0
                samples.steps_seen.add(step)
        if duration is not None:
            bucket.durations.append(duration)
            bucket.duration_by_step[step] = bucket.duration_by_step.get(step, 0.0) + duration
        if busbw is not None:
            bucket.busbw.append(busbw)
        if skew is not None:
            bucket.skews.append(skew)
            bucket.skew_by_step[step] = bucket.skew_by_step.get(step, 0.0) + skew
            if last is not None:
                bucket.waited_for[last] = bucket.waited_for.get(last, 0.0) + skew


def wait_caused_samples(side: Side, per_step: bool = True) -> dict[int, list[float]]:
    """rank -> the seconds the others waited for it at each compared step (the skew of each collective it
    arrived last at, summed); with ``per_step`` False, or no step compared, one whole-run sum. Every rank of
    the side has a sample for every step (0 where it was never last)."""
    steps = side.steps if per_step else ()
    index: dict[int | None, int] = {step: i for i, step in enumerate(steps)}
    out = {rank: [0.0] * max(len(steps), 1) for rank in side.ranks}
    for row in side.doc["collectives"]:
        columns = row["instances"]
        if columns is None:
            continue
        for step, skew, last in zip(columns["step"], columns["arrival_skew_s"], columns["last_rank"]):
            if skew is None or last is None or not side.keeps(step):
                continue
            i = index.get(step) if steps else 0
            if i is not None:
                out.setdefault(last, [0.0] * max(len(steps), 1))[i] += skew
    return out


def straggler_counts(side: Side) -> dict[int, tuple[int, int, float | None]]:
    """rank -> (last arrivals, collectives joined, mean lateness in s)."""
    return {s["rank"]: (s["last_arrivals"], s["matched"], s["mean_lateness_s"]) for s in side.doc["stragglers"]}


def module_counts(side: Side) -> dict[tuple[str, str | None, str], tuple[int, int | None]]:
    """(module path, pass, op) -> (count, bytes), over what the report covered."""
    return {(m["path"], m["pass"], m["op"]): (m["count"], m["bytes"]) for m in side.doc["modules"]}


def steps_covered(side: Side) -> int:
    """How many steps a side's totals are divided by to give per-step figures (1: per run)."""
    return len(side.steps) or 1


def module_steps(side: Side) -> int:
    """The steps the report's module table covers: all of the document's (a report built for the compared
    steps holds only those)."""
    return len(side.doc["steps"]) or 1


def step_figures(side: Side, step: int) -> SavedFigures | None:
    """The job's figures at one step, for the side-by-side steps table."""
    return next((s["job"] for s in side.doc["steps"] if s["step"] == step), None)
