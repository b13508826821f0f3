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

from collections.abc import Callable, Iterable, Mapping, Sequence
from statistics import median
from types import MappingProxyType

from comm2perfetto.lateness import MAX_RTT_NS
from comm2perfetto.model import ClockAlignment, ClockMethod

MIN_SAMPLES = 5  # fewer matched ends than this: keep the measurement, do not refine


def measured_offsets(logs: Mapping[int, object], ranks: Iterable[int]) -> ClockAlignment:
    """Offsets from the ``o`` records; ranks without one, or whose round trip exceeded ``MAX_RTT_NS``, get 0
    (``assumed``)."""
    offsets: dict[int, int] = {}
    method: dict[int, ClockMethod] = {}
    uncertainty: dict[int, int] = {}
    for rank in sorted(set(ranks)):
        log = logs.get(rank)
        off = getattr(log, "clock_offset_ns", None)
        if off is not None and int(getattr(log, "clock_rtt_ns", 0) or 0) <= MAX_RTT_NS:
            offsets[rank] = int(off)
            method[rank] = ClockMethod.MEASURED
            uncertainty[rank] = int(getattr(log, "clock_rtt_ns", 0) or 0) // 2
        else:
            offsets[rank] = 0
            method[rank] = ClockMethod.ASSUMED
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
    if not ref:
        return clock

    def differences(rank: int) -> list[int]:
        return [t - ref[key] for key, t in end_times[rank].items() if key in ref]

    return refine_by_differences(clock, end_times, differences, reference, min_correction_ns, only_assumed)


def refine_by_differences(
    clock: ClockAlignment, ranks: Iterable[int], differences: Callable[[int], Sequence[int]], reference: int = 0,
    min_correction_ns: int = 0, only_assumed: bool = False,
) -> ClockAlignment:
    """``refine`` from each rank's end differences: ``differences(rank)`` lists, for collectives that rank and
    the reference both completed, the rank's local end minus the reference's (each clock its own, no offsets
    applied). Called once per rank to refine, so that only one rank's differences are alive at a time.

    >>> clock = measured_offsets({}, [0, 1])
    >>> refine_by_differences(clock, [0, 1], lambda rank: [2_000, 2_100, 1_900, 2_000, 2_050]).offset_ns[1]
    -2000
    """
    offsets = dict(clock.offset_ns)
    method = dict(clock.method)
    residuals: list[int] = []
    total = 0
    for rank in ranks:
        if rank == reference or (only_assumed and method.get(rank, ClockMethod.ASSUMED) != ClockMethod.ASSUMED):
            continue
        raw = differences(rank)
        if len(raw) < MIN_SAMPLES:
            continue
        apart = offsets.get(rank, 0) - offsets.get(reference, 0)
        diffs = [d + apart for d in raw] if apart else raw
        correction = int(median(diffs))
        if abs(correction) < min_correction_ns:
            continue
        offsets[rank] = offsets.get(rank, 0) - correction
        method[rank] = ClockMethod.REFINED
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
