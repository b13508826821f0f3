"""Clock alignment: per-rank offsets to rank 0's clock. Never imports torch.

Two sources, in order:

1. the recorder's start-up measurement, the ``o`` record of each rank's event log
   (``["o", offset_ns, rtt_ns]``: ``t_rank0 = t_local + offset_ns``, uncertain by about ``rtt_ns / 2``);
2. refinement from collectives every rank completed: a collective ends at nearly the same moment on all
   its ranks (nobody leaves before the last one's data arrived), so the median difference between a rank's
   end times and rank 0's, over many collectives, is what is left of the clock offset. Arrival times cannot
   be used for this: ranks really do arrive at different times.

Dumps without event logs (plain Flight Recorder) carry no measurement: their offsets are assumed 0 (the
hosts' clocks are trusted, e.g. NTP), unless the collectives Flight Recorder saw complete (NCCL's watchdog
times, late by a poll) show a skew of more than ``match.FR_SKEW_NS``: then those refine it the same way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from statistics import median
from types import MappingProxyType

from comm2perfetto.model import ClockAlignment

MIN_SAMPLES = 5  # fewer matched ends than this: keep the measurement, do not refine


def measured_offsets(logs: Mapping[int, object], ranks: Iterable[int]) -> ClockAlignment:
    """Offsets from the ``o`` records; ranks without one get 0 (``assumed``)."""
    offsets: dict[int, int] = {}
    method: dict[int, str] = {}
    uncertainty: dict[int, int] = {}
    for rank in sorted(set(ranks)):
        log = logs.get(rank)
        off = getattr(log, "clock_offset_ns", None)
        if off is not None:
            offsets[rank] = int(off)
            method[rank] = "measured"
            uncertainty[rank] = int(getattr(log, "clock_rtt_ns", 0) or 0) // 2
        else:
            offsets[rank] = 0
            method[rank] = "assumed"
    return ClockAlignment(
        offset_ns=MappingProxyType(offsets), method=MappingProxyType(method),
        uncertainty_ns=MappingProxyType(uncertainty),
    )


def refine(
    clock: ClockAlignment, end_times: Mapping[int, Mapping[tuple[str, int], int]], reference: int = 0,
    min_correction_ns: int = 0, only_assumed: bool = False,
) -> ClockAlignment:
    """Refine offsets from matched collective ends.

    ``end_times[rank][(group uid, seq)]`` is the local end time of a collective known to have completed on
    that rank, from a precise source (the recorder saw the call return). Returns a new ``ClockAlignment``.
    ``min_correction_ns``: leave a rank alone when its ends are within that of the reference's (a coarse
    source, Flight Recorder's completion times, is trusted only for a large skew); ``only_assumed``: refine
    only ranks with no measured offset.
    """
    ref = end_times.get(reference)
    offsets = dict(clock.offset_ns)
    method = dict(clock.method)
    if not ref:
        return clock
    residuals: list[int] = []
    total = 0
    for rank, ends in end_times.items():
        if rank == reference or (only_assumed and method.get(rank, "assumed") != "assumed"):
            continue
        diffs = [
            (t + offsets.get(rank, 0)) - (ref[key] + offsets.get(reference, 0))
            for key, t in ends.items() if key in ref
        ]
        if len(diffs) < MIN_SAMPLES:
            continue
        correction = int(median(diffs))
        if abs(correction) < min_correction_ns:
            continue
        offsets[rank] = offsets.get(rank, 0) - correction
        method[rank] = "refined"
        total += len(diffs)
        residuals.append(int(median(abs(d - correction) for d in diffs)))
    if not residuals:
        return clock
    if clock.residual_skew_ns is not None:  # a second refinement (another source) adds to the first
        residuals.append(clock.residual_skew_ns)
    return ClockAlignment(
        offset_ns=MappingProxyType(offsets), method=MappingProxyType(method),
        uncertainty_ns=clock.uncertainty_ns, residual_skew_ns=max(residuals), samples=clock.samples + total,
    )


def shift(values: list[int | None], offset: int) -> list[int | None]:
    """Apply one rank's offset to a column of its local times."""
    if not offset:
        return values
    return [v + offset if v is not None else None for v in values]
