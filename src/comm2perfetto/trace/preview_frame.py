"""Which stretch of time the preview draws: the part that matters, not the whole recording.

A recorded run is mostly start-up and unprofiled steps: drawn whole, a 7.6 ms profiled window is 2 px of a 6 s
recording and a stall at the end a sliver. ``preview_frame`` picks, from the rows the preview would draw
(``preview.PreviewRow``):

- a stall, a missing rank or a mismatch (diagnose's spans and marks): from before the earliest one to the end,
  with as much time before it as after (at least ``MIN_LEAD`` of the recording), so what led to it shows;
- else, where compute was measured (the profiled steps, when only those were profiled): its extent;
- else, the collectives (communication and memory copies): their extent;

padded by ``PAD`` of its length on each side. Where that is most of the recording anyway (``WHOLE``), or
nothing is drawn, the whole window is drawn. The picture's header says the frame (``Frame.note``).

>>> from comm2perfetto.trace.preview import PreviewRow
>>> rows = [PreviewRow("rank 0", [(0, 6_000_000_000, "nodata"), (2_300_000_000, 2_307_600_000, "compute"),
...                               (10, 5_900_000_000, "comm")])]
>>> f = preview_frame(rows, 0, 6_000_000_000)
>>> f.t0, f.t1, f.note
(2299924000, 2307676000, 'time axis: 7.75 ms from 2.30 s, of 6.00 s recorded: where compute was measured')
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from comm2perfetto.trace.preview import PreviewRow
from comm2perfetto.words import duration

__all__ = ["Frame", "preview_frame"]

ATTENTION = frozenset({"stalled", "missing", "mismatch"})
MEASURED = frozenset({"comm", "memory"})
PAD = 0.01  # of the frame's length, on each side
MIN_LEAD = 0.02  # of the recording: the least time drawn before a stall or mark
WHOLE = 0.8  # a frame this much of the recording, or more, is the whole recording


@dataclass(frozen=True)
class Frame:
    """The window ``[t0, t1]`` (ns) the preview draws, of the recording ``[start, end]``; ``why`` names what it
    is framed on (None: the whole recording)."""

    t0: int
    t1: int
    start: int
    end: int
    why: str | None = None

    @property
    def note(self) -> str | None:
        """The header's line, where the frame is not the whole recording."""
        if self.why is None:
            return None
        return (f"time axis: {duration(self.t1 - self.t0)} from {duration(self.t0 - self.start)}, of "
                f"{duration(self.end - self.start)} recorded: {self.why}")


def preview_frame(rows: Sequence[PreviewRow], start: int, end: int) -> Frame:
    """The frame of ``rows`` drawn over the recording ``[start, end]`` (see the module's docstring)."""
    whole = Frame(start, end, start, end)
    total = end - start
    if total <= 0:
        return whole
    attention = [b for row in rows for b, _e, kind in row.spans if kind in ATTENTION]
    attention += [t for row in rows for t, kind in row.marks if kind in ATTENTION]
    if attention:
        first = max(min(attention), start)
        lead = max(end - first, int(total * MIN_LEAD))
        return _framed(whole, first - lead, end, "the stall or fault diagnose found, and the time before it")
    compute = [(b, e) for row in rows for b, e, kind in row.spans if kind == "compute"]
    if compute:
        return _framed(whole, min(b for b, _ in compute), max(e for _, e in compute), "where compute was measured")
    work = [(b, e) for row in rows for b, e, kind in row.spans if kind in MEASURED]
    if work:
        return _framed(whole, min(b for b, _ in work), max(e for _, e in work), "the collectives")
    return whole


def _framed(whole: Frame, lo: int, hi: int, why: str) -> Frame:
    pad = int((hi - lo) * PAD)
    lo, hi = max(lo - pad, whole.start), min(hi + pad, whole.end)
    if hi <= lo or hi - lo >= WHOLE * (whole.end - whole.start):
        return whole
    return Frame(lo, hi, whole.start, whole.end, why)
