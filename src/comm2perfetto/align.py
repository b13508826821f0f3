"""Clock alignment: each rank's clock put on rank 0's, by an offset and, where the run shows one, a drift. Never
imports torch.

Two sources, in order:

1. the recorder's start-up measurement, the ``o`` record of each rank's event log
   (``["o", offset_ns, rtt_ns]``: ``t_rank0 = t_local + offset_ns``, uncertain by about ``rtt_ns / 2``);
2. refinement from collectives every rank completed: a collective ends at nearly the same moment on all
   its ranks (nobody leaves before the last one's data arrived), so a rank's end times minus rank 0's, over
   many collectives, are what is left of the clock difference. Arrival times cannot be used for this: ranks
   really do arrive at different times.

Clocks drift apart (a host's or a GPU's: tens to hundreds of milliseconds an hour), and a ring of 20,000
collectives can span an hour, over which one offset leaves the ends of its first and last collectives apart by
the whole drift. So the differences are fitted with a line against the rank's own time (``fit_differences``:
an offset and a rate, robust to outliers), kept where the drift over the run exceeds the ends' scatter and is
one a clock can have (``MAX_DRIFT``); else one offset (their median), and ``ClockFit`` says which and why. Each
refined rank's residual (the median distance of its ends from the fit) is kept, and a rank whose ends stray from
the fit by more than they resolve (a tenth of them further than twice their change from one collective to the
next, and than ``UNCALIBRATED_FLOOR_NS``: a clock stepped mid-run, say) is *uncalibrated*: its times are shown,
and its lateness is evidence of nothing.

Dumps without event logs (plain Flight Recorder) carry no measurement: their offsets are assumed 0 (the
hosts' clocks are trusted, e.g. NTP), unless the collectives Flight Recorder saw complete (NCCL's watchdog
times, late by a poll) show a skew of more than ``match.FR_SKEW_NS`` somewhere over the run: then those refine
it the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import pairwise
from math import sqrt
from operator import itemgetter
from statistics import median
from types import MappingProxyType
from typing import NamedTuple

from comm2perfetto.lateness import MAX_RTT_NS
from comm2perfetto.model import ClockAlignment, ClockFit, ClockMethod

MIN_SAMPLES = 5  # fewer matched ends than this: keep the measurement, do not refine

# A drift is fitted through the medians of this many stretches of the run (at least three, of MIN_SAMPLES
# ends each): an end held up by a descheduled thread moves its stretch's median, not the line.
DRIFT_WINDOWS = 8

# Quartz oscillators and NTP-disciplined clocks stay within a few hundred ppm (NTP gives up beyond 500): a
# steeper line is not a clock's rate but something else (a clock stepped, a run of late ends), and is not used.
MAX_DRIFT = 1e-3

# A drift is kept only where it moves the run's last end against its first by more than noise could (see
# fit_differences), and than this: below it, one offset serves as well.
DRIFT_FLOOR_NS = 10_000

# Below this residual no rank is called uncalibrated: the recorder's return times jitter by that much on a busy
# host, and lateness is judged against the residual anyway (diagnose: twice it).
UNCALIBRATED_FLOOR_NS = 1_000_000


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
    """Refine the ranks' clocks from matched collective ends.

    ``end_times[rank][(group uid, seq)]`` is the local end time of a collective known to have completed on
    that rank, from a precise source (the recorder saw the call return). Returns a new ``ClockAlignment``.
    ``min_correction_ns``: leave a rank alone when its ends are within that of the reference's everywhere (a
    coarse source, Flight Recorder's completion times, is trusted only for a large skew); ``only_assumed``:
    refine only ranks with no measured offset.
    """
    ref = end_times.get(reference)
    if not ref:
        return clock

    def differences(rank: int) -> list[tuple[int, int]]:
        return [(t, t - ref[key]) for key, t in end_times[rank].items() if key in ref]

    return refine_by_differences(clock, end_times, differences, reference, min_correction_ns, only_assumed)


class DriftFit(NamedTuple):
    """A line through a rank's end differences: ``difference(t) = level + slope * (t - anchor_ns)``, ``t`` the
    rank's local time; ``slope`` 0 where one offset was fitted (``fit`` says why)."""

    level: int
    slope: float
    anchor_ns: int
    first_ns: int
    last_ns: int
    fit: ClockFit
    residual_ns: int  # the median distance of the ends from the line
    stray_ns: int  # the distance a tenth of the ends exceed (90th percentile)
    scatter_ns: int  # the 90th percentile of its change from one end to the next: what the ends resolve

    def at(self, t: int) -> int:
        return self.level + round(self.slope * (t - self.anchor_ns))

    @property
    def uncalibrated(self) -> bool:
        """A tenth of the ends stray from the line by more than they scatter: a clock the line does not describe
        (a median residual would hide a clock stepped for a third of the run)."""
        return self.stray_ns > max(UNCALIBRATED_FLOOR_NS, 2 * self.scatter_ns)


def fit_differences(points: Sequence[tuple[int, int]]) -> DriftFit:
    """Fit ``(t, difference)`` pairs (a rank's local end time; its end minus the reference's) with an offset and,
    where the run shows one, a drift: the median of the slopes between the medians of ``DRIFT_WINDOWS``
    stretches of the run (Theil-Sen on stretches), kept where it is a clock's (``MAX_DRIFT``) and moves the
    ends by more than their scatter over the run. ``points`` must not be empty.

    A clock 100 ppm fast over ten minutes, its ends 20 us apart at random (±):

    >>> pts = [(t, 5_000 + t // 10_000 + (20_000 if t // 10**9 % 2 else -20_000)) for t in range(0, 600 * 10**9, 10**9)]
    >>> fit = fit_differences(pts)
    >>> fit.fit, round(fit.slope * 1e6), fit.residual_ns, fit.uncalibrated
    (<ClockFit.DRIFT: 'offset and drift'>, 100, 20000, False)
    >>> fit_differences(pts[:10]).fit
    <ClockFit.OFFSET_ONLY: 'offset only'>
    """
    pts = sorted(points)
    n = len(pts)
    ts = [t for t, _ in pts]
    ds = [d for _, d in pts]
    anchor, span = ts[n // 2], ts[-1] - ts[0]
    level, slope = int(median(ds)), 0.0
    kind = ClockFit.OFFSET_ONLY
    windows = min(DRIFT_WINDOWS, n // MIN_SAMPLES)
    if windows >= 3 and span > 0:
        kind = ClockFit.OFFSET
        cuts = [n * k // windows for k in range(windows + 1)]
        centres = [(median(ts[a:b]), median(ds[a:b])) for a, b in pairwise(cuts)]
        slopes = [(d2 - d1) / (t2 - t1) for i, (t1, d1) in enumerate(centres) for t2, d2 in centres[i + 1:]
                  if t2 > t1]
        s = median(slopes) if slopes else 0.0
        if abs(s) <= MAX_DRIFT and abs(s) * span > DRIFT_FLOOR_NS:  # else no drift worth the two passes below
            line = int(median([d - s * (t - anchor) for t, d in pts]))
            spread = median([abs(d - line - s * (t - anchor)) for t, d in pts])
            # Noise alone tilts the line through stretches of m ends by about 2.6 spreads / sqrt(m): a drift must
            # move the run's ends apart by three times that, and by more than one end strays.
            if abs(s) * span > max(spread, 8 * spread / sqrt(n / windows)):
                level, slope, kind = line, s, ClockFit.DRIFT
    off = [d - level - round(slope * (t - anchor)) for t, d in pts] if slope else [d - level for d in ds]
    far = sorted(map(abs, off))
    residual = (far[(n - 1) // 2] + far[n // 2]) // 2  # their median
    scatter = _p90([abs(b - a) for a, b in pairwise(off)]) if n > 1 else 0
    return DriftFit(level, slope, anchor, ts[0], ts[-1], kind, residual, far[(n * 9) // 10], scatter)


_second = itemgetter(1)


def _p90(values: list[int]) -> int:
    values.sort()
    return values[(len(values) * 9) // 10]


def refine_by_differences(
    clock: ClockAlignment, ranks: Iterable[int], differences: Callable[[int], Sequence[tuple[int, int]]],
    reference: int = 0, min_correction_ns: int = 0, only_assumed: bool = False,
) -> ClockAlignment:
    """``refine`` from each rank's end differences: ``differences(rank)`` lists, for collectives that rank and
    the reference both completed, ``(the rank's local end, that minus the reference's)`` (each clock its own,
    no offsets applied). Called once per rank to refine, so that only one rank's differences are alive at a
    time.

    >>> clock = measured_offsets({}, [0, 1])
    >>> ends = [(t, d) for t, d in zip(range(5), [2_000, 2_100, 1_900, 2_000, 2_050])]
    >>> refine_by_differences(clock, [0, 1], lambda rank: ends).offset_ns[1]
    -2000
    """
    offsets = dict(clock.offset_ns)
    method = dict(clock.method)
    rate, anchor, fit = dict(clock.rate), dict(clock.anchor_ns), dict(clock.fit)
    residual, uncalibrated = dict(clock.residual_ns), dict(clock.uncalibrated)
    total = 0
    base = offsets.get(reference, 0)
    for rank in ranks:
        if rank == reference or (only_assumed and method.get(rank, ClockMethod.ASSUMED) != ClockMethod.ASSUMED):
            continue
        points = differences(rank)
        if len(points) < MIN_SAMPLES:
            continue
        apart = offsets.get(rank, 0) - base  # what the rank's clock is already moved by, against the reference's
        if min_correction_ns and 2 * max(abs(min(points, key=_second)[1] + apart),
                                         abs(max(points, key=_second)[1] + apart)) < min_correction_ns:
            continue  # every end within half of it: no fit could find as much (and a fit costs more)
        line = fit_differences(points)
        skew = max(abs(line.at(line.first_ns) + apart), abs(line.at(line.last_ns) + apart),
                   line.stray_ns if line.uncalibrated else 0)
        if skew < min_correction_ns:
            continue
        offsets[rank] = base - line.level
        method[rank] = ClockMethod.REFINED
        fit[rank], residual[rank] = line.fit, line.residual_ns
        if line.slope:
            rate[rank], anchor[rank] = -line.slope, line.anchor_ns
        else:
            rate.pop(rank, None)
            anchor.pop(rank, None)
        if line.uncalibrated:
            uncalibrated[rank] = line.stray_ns
        else:
            uncalibrated.pop(rank, None)
        total += len(points)
    if not total:
        return clock
    return ClockAlignment(
        offset_ns=MappingProxyType(offsets), method=MappingProxyType(method),
        uncertainty_ns=clock.uncertainty_ns, residual_skew_ns=max(residual.values()), samples=clock.samples + total,
        rate=MappingProxyType(rate), anchor_ns=MappingProxyType(anchor), fit=MappingProxyType(fit),
        residual_ns=MappingProxyType(residual), uncalibrated=MappingProxyType(uncalibrated),
    )
