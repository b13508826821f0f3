"""How every view words the same facts: rank lists, durations and sizes.

diagnose's findings and the live verdict, merge's summary, the report's text, CSV, HTML and PNG, the trace's
annotations and the preview all call these, so one fact reads the same wherever it is shown::

    rank_list([0, 1, 2, 3, 5, 8, 9])   -> "0-3, 5, 8, 9"     every rank, runs of three or more folded
    ranks_text([2])                    -> "rank 2"           in a sentence
    ranks_text([0, 1, 2, 3, 5])        -> "ranks 0-3, 5"
    duration(12_500_000)               -> "12.5 ms"          nanoseconds in, as the model keeps times
    size(54_477)                       -> "53.2 KiB"         binary multiples, named as such
    sample_text("traces", [0, 1], 128) -> "traces of 2 of 128 ranks (0, 1)"   a sample of a larger job
    clock_text({0: "measured", 1: "refined"}, 14_600, 5)
        -> "clocks aligned to rank 0; residual skew 14.6 us (5 collective ends)"

The order of process groups is a fact of the job: :meth:`comm2perfetto.job.Job.groups_in_order`.
Standard library only and no import of comm2perfetto when it runs (``report_doc``'s types for the type
checker), so every layer may word things with it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from comm2perfetto.report_doc import Clock

__all__ = ["MAX_RANK_PARTS", "clock_text", "duration", "rank_list", "ranks_text", "sample_text", "size",
           "three_digits"]

# A sentence names at most this many runs or single ranks ("ranks 0-3, 5, 9, ..."); the full list is the JSON's.
MAX_RANK_PARTS = 6

# Largest first. ASCII "us": the preview's font and every terminal have it.
_TIME_UNITS = ((1e9, "s"), (1e6, "ms"), (1e3, "us"), (1.0, "ns"))
# IEC binary multiples (1 KiB = 1024 B): tensors are sized in powers of two, and the names keep them apart from
# the decimal GB/s of the report's bandwidths.
_SIZE_UNITS = ((1024.0**4, "TiB"), (1024.0**3, "GiB"), (1024.0**2, "MiB"), (1024.0, "KiB"))


def _rank_parts(ranks: Iterable[int | str]) -> tuple[list[str], int]:
    """(``["0-3", "5", "8", "9"]``, how many distinct ranks). Ranks may be numbers or their text (the report's
    keys); anything that is not a number goes last, as written."""
    numbers: set[int] = set()
    others: set[str] = set()
    for r in ranks:
        if isinstance(r, int) or r.isdigit():
            numbers.add(int(r))
        else:
            others.add(r)
    ordered = sorted(numbers)
    parts: list[str] = []
    start = 0
    for i, n in enumerate(ordered):
        if i + 1 < len(ordered) and ordered[i + 1] == n + 1:
            continue  # the run goes on
        run = ordered[start:i + 1]
        parts.extend([f"{run[0]}-{run[-1]}"] if len(run) >= 3 else map(str, run))
        start = i + 1
    return parts + sorted(others), len(numbers) + len(others)


def rank_list(ranks: Iterable[int | str]) -> str:
    """Every rank, sorted, runs of three or more consecutive ranks folded: ``0-3, 5, 8, 9``; ``none``."""
    parts, _ = _rank_parts(ranks)
    return ", ".join(parts) if parts else "none"


def ranks_text(ranks: Iterable[int | str]) -> str:
    """Ranks in a sentence: ``rank 2``, ``ranks 0-3, 5``; past :data:`MAX_RANK_PARTS` runs and single ranks,
    the count and the first ones: ``512 ranks (0, 2, 4, 6, 8, ...)``; ``no rank``."""
    parts, count = _rank_parts(ranks)
    if not parts:
        return "no rank"
    if count == 1:
        return f"rank {parts[0]}"
    if len(parts) > MAX_RANK_PARTS:
        return f"{count} ranks ({', '.join(parts[:MAX_RANK_PARTS - 1])}, ...)"
    return "ranks " + ", ".join(parts)


def three_digits(x: float) -> str:
    """``x`` (>= 0) with 3 significant digits and never an exponent: 0.0512, 1.00, 12.3, 123, 1234."""
    if x == 0:
        return "0"
    text = f"{x:#.3g}"  # "#" keeps trailing zeros: 1.00, not 1
    if "e" not in text:
        return text.rstrip(".")
    return f"{x:.0f}" if x >= 1 else f"{x:.{2 - math.floor(math.log10(x))}f}"


def _scaled(value: float, units: Sequence[tuple[float, str]]) -> str:
    """``value`` in the first unit (largest first) in which it rounds to at least 1, 3 digits, a space."""
    magnitude = abs(value)
    sign = "-" if value < 0 else ""
    for i, (scale, unit) in enumerate(units):
        scaled = magnitude / scale
        if scaled >= 0.9995 or i == len(units) - 1:  # 0.9996 s rounds to "1.00 s", not "1000 ms"
            return f"{sign}{three_digits(scaled)} {unit}"
    raise ValueError("no units given")


def duration(ns: float) -> str:
    """A duration in nanoseconds, in SI units with 3 significant digits: ``850 us``, ``12.5 ms``, ``3.20 s``,
    ``4500 s``; ``0 s``; a negative one keeps its sign. Times in seconds (the report's) go in as ``s * 1e9``."""
    if ns == 0:
        return "0 s"
    return _scaled(ns, _TIME_UNITS)


def size(n_bytes: float) -> str:
    """A size in IEC binary multiples (1 KiB = 1024 B, 1 MiB = 1024 KiB ...), 3 significant digits:
    ``512 B``, ``53.2 KiB``, ``1.50 MiB``."""
    if abs(n_bytes) < 1024:
        return f"{n_bytes:.0f} B"
    return _scaled(n_bytes, _SIZE_UNITS)


def sample_text(what: str, ranks: Sequence[int], world: int | None) -> str:
    """What a sample of a job's ranks covers (``Job.sampled``: ``traces`` or ``data``):
    ``traces of 2 of 128 ranks (0, 1)``."""
    return f"{what} of {len(ranks)} of {world} ranks ({rank_list(ranks)})"


def document_clock_text(clock: Clock | None) -> str | None:
    """``clock_text`` of a report document's ``clock`` (``{"method": {"0": "measured", ...}, "residual_skew_s":
    1.6e-05, "samples": 118}``); None where the document has none (no job)."""
    if not clock:
        return None
    residual = clock["residual_skew_s"]
    return clock_text({int(r): m for r, m in clock["method"].items()},
                      round(residual * 1e9) if residual is not None else None, clock["samples"])


def clock_text(method: Mapping[int, str], residual_skew_ns: int | None, samples: int) -> str:
    """How the ranks' clocks were put on rank 0's, always said (merge's summary, the report's header):
    aligned with the residual left, aligned by the recorder's measurement alone, or not aligned and why.
    ``method``: rank -> ``refined``, ``measured``, ``assumed`` or ``none`` (model.ClockAlignment)."""
    if len(method) <= 1:
        return "clocks: one rank, nothing to align"
    if residual_skew_ns is not None:
        return f"clocks aligned to rank 0; residual skew {duration(residual_skew_ns)} ({samples} collective ends)"
    if all(m == "none" for m in method.values()):
        return "clocks: not aligned (--no-align): each rank on its own clock"
    reference = min(method)  # rank 0, or the lowest rank with data: the clock the others are put on
    assumed = [r for r, m in method.items() if m == "assumed" and r != reference]
    if not assumed:
        return "clocks aligned to rank 0 by the recorder's start-up measurement (too few collective ends to refine it)"
    own = ("each rank on its own clock" if len(assumed) == len(method) - 1
           else f"{ranks_text(assumed)} on {'its' if len(assumed) == 1 else 'their'} own clock")
    return f"clocks: not aligned ({own}): no recorder measurement, and too few collective ends to align on"
