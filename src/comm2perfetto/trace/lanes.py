"""Put intervals on as few tracks as possible so that slices on one track nest strictly. Never imports torch.

Perfetto draws one track as a stack of properly nested slices; two intervals that overlap without one
containing the other (two async collectives in flight on one group, a kernel launched on a busy stream)
need separate tracks. ``layout`` places each interval on the first lane where it either nests inside the
innermost open interval or starts after it ended, and returns, per lane, a begin/end event stream in time
order (parents open before their children and close after them), ready to write. ``in_order`` tells when
that work can be skipped: the items already are one lane, in order, none inside another.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

UNCLOSED = float("inf")  # the end of an interval drawn to the end of the trace

# An interval: a tuple that starts with (begin, end); what follows is the caller's.
Item = tuple[Any, ...]
# One event of a lane's stream: (kind, ts, item). kind: "B" begin, "E" end (item None), "I" instant.
LaneEvent = tuple[str, int, Any]


def layout(items: Iterable[Item]) -> list[list[LaneEvent]]:
    """Lane streams for ``(begin, end, ...)`` items; ``end`` None is an instant, ``UNCLOSED`` never ends.

    >>> [[(k, t) for k, t, _ in lane] for lane in layout([(0, 10, "a"), (2, 5, "b"), (4, 12, "c")])]
    [[('B', 0), ('B', 2), ('E', 5), ('E', 10)], [('B', 4), ('E', 12)]]
    """
    ordered = sorted(items, key=_order)
    simple = _one_lane(ordered)
    if simple is not None:
        return [simple]
    stacks: list[list[int | float]] = []  # per lane: ends of the open intervals, innermost last
    lanes: list[list[LaneEvent]] = []
    for item in ordered:
        begin, end = item[0], item[1]
        stop = begin if end is None else end
        for k, stack in enumerate(stacks):
            lane = lanes[k]
            while stack and stack[-1] <= begin:
                lane.append(("E", stack.pop(), None))  # type: ignore[arg-type]
            # A slice drawn to the end of the trace takes instants (a marker on it) but no slices: what
            # follows it is not inside it.
            if not stack or (stop <= stack[-1] and (stack[-1] != UNCLOSED or end is None)):
                break
        else:
            stacks.append([])
            lanes.append([])
            k = len(stacks) - 1
        if end is None:
            lanes[k].append(("I", begin, item))
        else:
            lanes[k].append(("B", begin, item))
            stacks[k].append(end)
    for k, stack in enumerate(stacks):
        while stack:
            end = stack.pop()
            if end != UNCLOSED:
                lanes[k].append(("E", end, None))  # type: ignore[arg-type]
    return lanes


def in_order(items: Sequence[Item]) -> bool:
    """Whether ``layout`` would keep ``items`` on one lane, in this order, each closed before the next begins.

    Then each item is one event as it stands: an instant, a slice (begin to end) or, last, a slice drawn to
    the end of the trace.

    >>> in_order([(0, 5, "a"), (5, None, "b"), (6, 9, "c")]), in_order([(0, 5, "a"), (4, 9, "b")])
    (True, False)
    """
    prev: Item | None = None
    free: int | float = 0  # when the previous item is over
    for item in items:
        begin, end = item[0], item[1]
        if prev is not None and (begin < free or begin < prev[0] or (begin == prev[0] and _order(item) < _order(prev))):
            return False
        prev = item
        free = begin if end is None else end
    return True


def _one_lane(ordered: list[Item]) -> list[LaneEvent] | None:
    """The stream when no two items overlap (the usual case: one group's collectives on one rank), else None."""
    lane: list[LaneEvent] = []
    append = lane.append
    free = None  # when the previous item ends
    for item in ordered:
        begin, end = item[0], item[1]
        if free is not None and begin < free:
            return None
        if end is None:
            append(("I", begin, item))
            free = begin
        else:
            append(("B", begin, item))
            if end != UNCLOSED:
                append(("E", end, None))
            free = end
    return lane


def _order(item: Item) -> tuple[int, float]:
    # Earlier first; at one begin, the longer first so that it becomes the parent; instants after slices.
    begin, end = item[0], item[1]
    return (begin, -(end - begin) if end is not None else 1.0)
