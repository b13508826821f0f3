"""What a trace format must accept: the interface the timeline builder writes to. Never imports torch.

Two writers implement it: ``perfetto.PerfettoWriter`` (interned, streaming protobuf, ``.pftrace``) and
``chrome_json.ChromeJsonWriter`` (legacy Chrome JSON, ``.json`` / ``.json.gz``). The builder declares
processes and tracks first, then writes events; a track is always declared before any event uses it.

Times are ``int`` nanoseconds on one clock (rank 0's ``CLOCK_REALTIME`` after alignment). Track ids are
small positive ints chosen by the caller, unique in the trace. ``args`` values may be ``int``, ``float``,
``bool``, ``str`` or a list/tuple of those (written as one string).

``shared`` (``begin``, ``complete``, ``instant``) is a ``SharedArgs``: what many events carry unchanged, such
as what every rank's slice of one collective says about it, and the flow that all but the first and last
rank's slices continue. Its args come before ``args`` (no name in both), its flows add to the event's own; a
writer may encode it once and reuse that for every event given the same object.

``events`` writes many slices and instants of one track in one call: what a big merge spends its time on.

Flows link events across tracks (the same collective on every rank, a send and its recv). A flow is a chain
ordered by time: the caller passes each flow id in ``flow_start`` on the earliest event, in ``flow_step`` on
the middle ones and in ``flow_end`` on the latest; a flow needs a start and an end.

Example::

    w.process(1, pid=2, name="rank 0", description="host a, pid 4242", sort_index=0)
    w.track(10, parent=1, name="default_pg", sort_index=0)
    common = SharedArgs({"seq": 3, "bytes": 16})
    w.begin(10, 1_000, "all_reduce", {"lateness_ns": 0}, shared=common, flow_start=(7,))
    w.end(10, 9_000)
    w.instant(10, 9_500, "missing all_reduce (default_pg seq 4)", {"stack": "train.py:57 step"})
    stats = w.close()
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Protocol

ArgValue = int | float | bool | str | Sequence[int | float | bool | str]


class SharedArgs:
    """Args and flows that many events carry, never changed once made: writers may cache their encoding by
    identity. ``flows`` is (flow_start, flow_step, flow_end); ``starts`` the number of flows started."""

    __slots__ = ("args", "flows", "starts")

    def __init__(self, args: Mapping[str, ArgValue], *, flow_start: Sequence[int] = (),
                 flow_step: Sequence[int] = (), flow_end: Sequence[int] = ()) -> None:
        self.args: Mapping[str, ArgValue] = MappingProxyType(dict(args))
        self.flows = (tuple(flow_start), tuple(flow_step), tuple(flow_end))
        self.starts = len(self.flows[0])

    def __repr__(self) -> str:
        return f"SharedArgs({dict(self.args)!r}, flows={self.flows!r})"


# The flows of an EventItem on none (fastest as this object).
NO_FLOWS: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]] = ((), (), ())


# One event for ``TraceSink.events``: (ts, end, name, args, category, shared, (flow_start, flow_step, flow_end)).
EventItem = tuple[int, int | None, str, Mapping[str, ArgValue] | None, str | None, SharedArgs | None,
                  tuple[Sequence[int], Sequence[int], Sequence[int]]]


@dataclass(frozen=True, slots=True)
class WriteStats:
    """What a writer wrote: counts of each kind of event and the size of the file in bytes."""

    path: str
    bytes: int
    slices: int  # begins (closed or not) plus complete events
    unclosed: int  # begins never ended: stalled collectives drawn to the end of the trace
    instants: int
    counters: int
    flows: int  # flow ids started


class TraceSink(Protocol):
    def process(self, uuid: int, pid: int, name: str, *, description: str | None = None,
                sort_index: int | None = None) -> None:
        """Declare a process (one per rank, plus the job). ``sort_index`` orders processes top-down."""

    def track(self, uuid: int, parent: int, name: str, *, sort_index: int | None = None,
              description: str | None = None) -> None:
        """Declare a slice track inside process ``parent``. Slices on one track must nest strictly."""

    def counter_track(self, uuid: int, parent: int, name: str, *, unit: str | None = None,
                      sort_index: int | None = None) -> None:
        """Declare a counter track inside process ``parent``."""

    def begin(self, track: int, ts: int, name: str, args: Mapping[str, ArgValue] | None = None, *,
              category: str | None = None, shared: SharedArgs | None = None, flow_start: Sequence[int] = (),
              flow_step: Sequence[int] = (), flow_end: Sequence[int] = ()) -> None:
        """Open a slice. Every ``begin`` is closed by the next ``end`` on the same track (innermost first)."""

    def end(self, track: int, ts: int) -> None:
        """Close the innermost open slice of ``track``."""

    def complete(self, track: int, ts: int, dur: int, name: str, args: Mapping[str, ArgValue] | None = None,
                 *, category: str | None = None, shared: SharedArgs | None = None, flow_start: Sequence[int] = (),
                 flow_step: Sequence[int] = (), flow_end: Sequence[int] = ()) -> None:
        """A slice whose end is known: ``begin`` then ``end`` at ``ts + dur``."""

    def events(self, track: int, items: Iterable[EventItem]) -> None:
        """For each item in order: ``end`` None, ``instant()``; else ``complete()`` with ``dur = end - ts``."""

    def instant(self, track: int, ts: int, name: str, args: Mapping[str, ArgValue] | None = None, *,
                category: str | None = None, shared: SharedArgs | None = None, flow_start: Sequence[int] = (),
                flow_step: Sequence[int] = (), flow_end: Sequence[int] = ()) -> None:
        """A zero-length event."""

    def counter(self, track: int, ts: int, value: int | float) -> None:
        """A counter sample: the value holds until the next sample."""

    def close(self) -> WriteStats:
        """Flush and close the file. Slices still open stay unclosed (drawn to the end of the trace)."""


def arg_text(value: Any) -> int | float | bool | str:
    """Args as a trace can hold them: lists and tuples become one compact string, ``[[4, 4], [8]]``."""
    if isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(str(arg_text(v)) for v in value) + "]"
    return str(value)
