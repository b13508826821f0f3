"""Interval arithmetic for time accounting: unions, intersections and differences of half-open spans.

Every figure ``report`` gives is a length of a union, never a sum of events that may overlap: two kernels on
two streams for the same microsecond count once. A *union* here is a list of disjoint ``(begin, end)`` pairs in
increasing order, as :func:`union` returns it; the other functions take and return unions.

>>> u = union([(0, 10), (5, 20), (30, 40), (40, 45)])
>>> u
[(0, 20), (30, 45)]
>>> length(u), length(intersection(u, [(15, 35)])), length(difference(u, [(15, 35)]))
(35, 10, 25)
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from itertools import accumulate
from operator import itemgetter, lt, sub

Span = tuple[int, int]
_begin, _end = itemgetter(0), itemgetter(1)
NS = 1e-9  # seconds in a nanosecond: spans are in ns, the report's figures in s


def union(spans: Iterable[Span]) -> list[Span]:
    """Merge spans (in any order; empty and reversed ones are dropped) into a union. Touching spans merge."""
    spans = spans if isinstance(spans, list) else list(spans)
    if _already_a_union(spans):
        return spans[:]  # a list of the caller's own, as the merge below returns
    ordered = sorted(s for s in spans if s[1] > s[0])
    out: list[Span] = []
    if not ordered:
        return out
    begin, end = ordered[0]
    for b, e in ordered:
        if b > end:
            out.append((begin, end))
            begin, end = b, e
        elif e > end:
            end = e
    out.append((begin, end))
    return out


def _already_a_union(spans: list[Span]) -> bool:
    """Every span is non-empty and ends before the next begins (the common case of one stream's collectives
    or a rank's ranges, seen in order): a few passes in C instead of a sort and a merge in Python."""
    begins, ends = list(map(_begin, spans)), list(map(_end, spans))
    return all(map(lt, begins, ends)) and all(map(lt, ends, begins[1:]))


def length(u: Iterable[Span]) -> int:
    return sum(e - b for b, e in u)


def intersection(a: list[Span], b: list[Span]) -> list[Span]:
    """The spans covered by both unions: one linear sweep."""
    out: list[Span] = []
    i = j = 0
    while i < len(a) and j < len(b):
        begin = max(a[i][0], b[j][0])
        end = min(a[i][1], b[j][1])
        if end > begin:
            out.append((begin, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def difference(a: list[Span], b: list[Span]) -> list[Span]:
    """The spans of union ``a`` not covered by union ``b``."""
    out: list[Span] = []
    j = 0
    for begin, end in a:
        while j < len(b) and b[j][1] <= begin:
            j += 1
        k = j
        cursor = begin
        while k < len(b) and b[k][0] < end:
            if b[k][0] > cursor:
                out.append((cursor, b[k][0]))
            cursor = max(cursor, b[k][1])
            k += 1
        if cursor < end:
            out.append((cursor, end))
    return out


def envelope(*unions: list[Span]) -> Span | None:
    """From the first begin to the last end over several unions; None when all are empty."""
    firsts = [u[0][0] for u in unions if u]
    lasts = [u[-1][1] for u in unions if u]
    return (min(firsts), max(lasts)) if firsts else None


class Measured:
    """A union with running totals: its length inside any window in O(log n), for the many step windows of
    one rank.

    >>> m = Measured([(0, 10), (20, 30)])
    >>> m.total, m.within(5, 25), m.within(10, 20)
    (20, 10, 0)
    """

    def __init__(self, u: list[Span]) -> None:
        self.union = u
        # map() over C functions: a report builds these for every rank, on unions of 10^4 to 10^5 spans
        self._begins = list(map(_begin, u))
        self._ends = list(map(_end, u))
        self.total: int = sum(self._ends) - sum(self._begins)
        self._before: list[int] | None = None  # length of u[:i], built when a window is first asked

    def within(self, begin: int, end: int) -> int:
        if end <= begin:
            return 0
        if self._before is None:
            self._before = list(accumulate(map(sub, self._ends, self._begins), initial=0))
        first = bisect.bisect_right(self._ends, begin)  # spans first..last-1 meet [begin, end)
        last = bisect.bisect_left(self._begins, end)
        if first >= last:
            return 0
        inside = self._before[last] - self._before[first]
        inside -= max(begin - self._begins[first], 0)
        inside -= max(self._ends[last - 1] - end, 0)
        return inside
