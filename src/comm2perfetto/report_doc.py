"""The report document (the JSON contract of docs/report.md) as types, so that the type checker checks every
view of it: what ``report/`` builds (``ReportDoc``), ``render/`` draws and ``sources.report_json`` reads back
for ``compare`` (``SavedReport``: the parts compare reads, each value checked, where any may be unknown).

Times are in seconds, sizes in bytes, percentages from 0 to 100; None is unknown. Declarations only: every
layer may import it (``sources/`` too, which imports nothing above it).
"""

# No ``from __future__ import annotations`` here: with the annotations as strings, each TypedDict field is compiled
# as a forward reference when the class is made: a millisecond more of report's and merge's start-up.
from typing import Any, Literal, TypedDict

from comm2perfetto.strenum import StrEnum

__all__ = [
    "FIGURES", "INSTANCE_COLUMNS", "VERSION", "Basis", "Clock", "CollectiveRow", "ExchangeRow", "FigureKey",
    "Figures", "GroupRow", "Instances", "JobFigures", "LatenessMap", "ModuleRow", "RankFigures", "ReportDoc",
    "SavedCollective", "SavedFigures", "SavedModule", "SavedReport", "SavedStep", "SavedStraggler", "StepRow",
    "StragglerRow",
]

VERSION = 1  # changes when a key changes meaning or disappears; new keys may appear


class Basis(StrEnum):
    """Where a rank's figures come from (``report.activity``), and the document's when its ranks differ."""

    GPU = "gpu"  # its profiler traces' GPU kernels
    CPU = "cpu"  # CPU intervals: the recorder's ranges and calls, profiler CPU ops, Flight Recorder's times
    MIXED = "mixed"  # the document's: ranks of both

FigureKey = Literal["span_s", "compute_s", "comm_s", "overlapped_comm_s", "exposed_comm_s", "idle_s",
                    "comm_to_compute", "overlap_pct"]
FIGURES: tuple[FigureKey, ...] = ("span_s", "compute_s", "comm_s", "overlapped_comm_s", "exposed_comm_s", "idle_s",
                                  "comm_to_compute", "overlap_pct")
InstanceColumn = Literal["seq", "step", "bytes", "duration_s", "transfer_s", "algbw_gbps", "busbw_gbps",
                         "arrival_skew_s", "last_rank"]
INSTANCE_COLUMNS: tuple[InstanceColumn, ...] = ("seq", "step", "bytes", "duration_s", "transfer_s", "algbw_gbps",
                                                "busbw_gbps", "arrival_skew_s", "last_rank")


class Figures(TypedDict):
    """A breakdown (``report.overlap``) of a rank or a step, in ``FIGURES``' order; None: not measured there."""

    span_s: float
    compute_s: float | None
    comm_s: float | None
    overlapped_comm_s: float | None
    exposed_comm_s: float | None
    idle_s: float | None
    comm_to_compute: float | None
    overlap_pct: float | None


class JobFigures(Figures):
    """The job's breakdown: times the mean over ``ranks`` ranks, ratios from the totals."""

    ranks: int


class RankFigures(Figures):
    """A rank's breakdown, the ``basis`` its figures come from (``gpu`` or ``cpu``) and their sources."""

    basis: Basis
    sources: list[str]


class StepRow(TypedDict):
    step: int
    job: JobFigures
    ranks: dict[str, Figures]


class Instances(TypedDict):
    """A collectives row's collectives one by one, as columns of equal length (``INSTANCE_COLUMNS``)."""

    seq: list[int | None]
    step: list[int | None]
    bytes: list[int | None]
    duration_s: list[float | None]
    transfer_s: list[float | None]
    algbw_gbps: list[float | None]
    busbw_gbps: list[float | None]
    arrival_skew_s: list[float | None]
    last_rank: list[int | None]


class CollectiveRow(TypedDict):
    """One (op family, process group) of ``report.bandwidth``."""

    op: str
    process_group: str
    group_size: int | None  # None: not known (kernels of a library that names no group)
    count: int
    timed: int
    bytes: int | None  # of the instances whose size is known; None where none's is
    total_s: float | None
    mean_s: float | None
    p50_s: float | None
    p99_s: float | None
    transfer_s: float | None
    algbw_gbps: float | None
    busbw_gbps: float | None
    arrival_skew_mean_s: float | None
    queue_mean_s: float | None
    group_uid: str
    instances: Instances


class ExchangeRow(TypedDict):
    """One (op, process group) of all-to-alls (``report.exchanges``): ``sent_bytes[a][b]`` is what ``ranks[a]``
    sent ``ranks[b]`` over the ``covered`` collectives of ``count``."""

    op: str
    process_group: str
    group_uid: str
    ranks: list[int]
    count: int
    covered: int
    disagreeing: int
    sent_bytes: list[list[int]]
    received_bytes: list[int]
    imbalance: float | None
    hot_ranks: list[int]
    time_s: list[float | None]


class StragglerRow(TypedDict):
    rank: int
    matched: int
    last_arrivals: int
    mean_lateness_s: float
    p99_lateness_s: float


# "pass" is a Python keyword: the functional form
ModuleRow = TypedDict("ModuleRow", {"path": str, "pass": str | None, "op": str, "count": int, "bytes": int,
                                    "ranks": int})


class LatenessMap(TypedDict):
    """Ranks x collectives: each rank's lateness at each drawn collective (None: not in its group)."""

    ranks: list[int]
    collectives: list[str]
    lateness_s: list[list[float | None]]


class LiveGroup(TypedDict):
    """One group over the live windows (report/live_windows.py): its communication, and its compared ranks'
    mean lateness and verdict per window (None: not known)."""

    group: str
    desc: str
    ranks: list[int]
    calls: int
    bytes: int | None
    comm_s: float | None
    steps: int
    comm_per_step_s: float | None
    timed: bool
    lateness_s: list[list[float | None]]
    late: list[list[bool | None]]


class LiveWindows(TypedDict):
    every_s: float | None
    windows: list[int]
    groups: list[LiveGroup]
    stragglers: list[dict[str, Any]]  # lateness.StragglerTracker's events, with their window


class GroupRow(TypedDict):
    name: str
    desc: str
    ranks: list[int]


class Clock(TypedDict):
    method: dict[str, str]
    residual_skew_s: float | None
    samples: int
    fit: dict[str, str]  # refined ranks: "offset and drift", "offset", "offset only" (model.ClockFit)
    drift_ppm: dict[str, float]  # ranks whose drift was fitted: how fast their clock runs against rank 0's
    residual_s: dict[str, float]  # refined ranks: the median distance of their ends from rank 0's, aligned
    uncalibrated: dict[str, float]  # ranks no fit describes: how far a tenth of their ends stray from it


class _Report(TypedDict):
    version: int
    basis: Basis | None
    world_size: int | None
    job: JobFigures
    ranks: dict[str, RankFigures]
    steps: list[StepRow]
    collectives: list[CollectiveRow]
    all_to_all: list[ExchangeRow]
    stragglers: list[StragglerRow]
    modules: list[ModuleRow]
    lateness_map: LatenessMap
    groups: dict[str, GroupRow]
    notes: list[str]
    sampled: str | None
    clock: Clock | None
    scope: list[int] | None  # [first, last] step every table covers (--steps); None: the whole run


class ReportDoc(_Report, total=False):
    """What ``report`` writes: ``report.document.build_report``'s figures, and what the report is about
    (``paths``, added by ``report.document.build``)."""

    paths: list[str]
    live: LiveWindows  # only where the logs hold live windows


# --- a saved report, as compare reads it back (sources.report_json.check_report) -----------------------------


class SavedFigures(TypedDict):
    span_s: float | None
    compute_s: float | None
    comm_s: float | None
    overlapped_comm_s: float | None
    exposed_comm_s: float | None
    idle_s: float | None
    comm_to_compute: float | None
    overlap_pct: float | None


class SavedStep(TypedDict):
    step: int
    job: SavedFigures
    ranks: dict[str, SavedFigures]


class SavedCollective(TypedDict):
    op: str
    process_group: str
    group_uid: str | None  # None: a report saved before it listed its groups (named by label)
    group_size: int | None
    count: int | None
    bytes: int | None
    instances: Instances | None  # None: a report saved before it listed its collectives one by one


class SavedStraggler(TypedDict):
    rank: int
    matched: int
    last_arrivals: int
    mean_lateness_s: float | None


SavedModule = TypedDict("SavedModule", {"path": str, "pass": str | None, "op": str, "count": int,
                                        "bytes": int | None})


class SavedReport(TypedDict):
    version: int
    basis: str | None
    world_size: int | None
    job: SavedFigures
    ranks: dict[str, SavedFigures]
    steps: list[SavedStep]
    collectives: list[SavedCollective]
    groups: dict[str, GroupRow]
    stragglers: list[SavedStraggler]
    modules: list[SavedModule]
    notes: list[str]
