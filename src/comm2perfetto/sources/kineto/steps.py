"""A trace's steps: the ``ProfilerStep#n`` spans the CPU ran, which step launched each GPU kernel, and the same
steps projected onto the GPU's time (what a step's kernels ran, however late the GPU ran them).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from functools import partial
from typing import Any

from comm2perfetto.sources.kineto.classify import PROFILER_STEP
from comm2perfetto.sources.kineto.events import KinetoEvent, Span

__all__ = ["gpu_step_spans", "launch_steps", "profiler_steps"]


def profiler_steps(cpu_ops: list[KinetoEvent]) -> tuple[tuple[int, int, int], ...]:
    """``(n, begin, end)`` of each ``ProfilerStep#n`` among the training threads' CPU ops; the same n on two
    threads (unusual) spans both.

    Only profilers run with a ``schedule`` (which call ``prof.step()``) write these annotations; a plain
    ``profile()`` window (``comm2perfetto record --profile-steps``) has none.
    """
    spans: dict[int, tuple[int, int]] = {}
    for ev in cpu_ops:
        match = PROFILER_STEP.match(ev.name) if ev.name.startswith("ProfilerStep#") else None
        if match:
            n = int(match.group(1))
            begin, end = spans.get(n, (ev.t_begin_ns, ev.t_end_ns))
            spans[n] = (min(begin, ev.t_begin_ns), max(end, ev.t_end_ns))
    return tuple((n, begin, end) for n, (begin, end) in sorted(spans.items()))


def launch_steps(steps: Sequence[tuple[int, int, int]], launches: Mapping[Any, int],
                 kernels: Iterable[tuple[Any, int]]) -> list[int | None]:
    """The step each GPU kernel belongs to: the ``ProfilerStep#n`` whose CPU span holds the runtime call that
    launched it (matched by correlation id), or, without a known launch, the step its own begin falls in.
    ``kernels``: (correlation, begin) pairs; None for a kernel launched outside every step.

    >>> launch_steps([(5, 0, 100), (6, 100, 200)], {7: 90}, [(7, 150), (None, 120), (8, 500)])
    [5, 6, None]
    """
    # a kernel per microsecond or so: one pass at C speed (map) for the times and the bisection
    times = [launches.get(c, b) if c is not None else b for c, b in kernels]
    slots = list(map(partial(bisect_right, [b for _, b, _ in steps]), times))
    numbers = [None] + [n for n, _, _ in steps]
    ends = [-1] + [e for _, _, e in steps]
    return [numbers[i] if t < ends[i] else None for i, t in zip(slots, times)]


def gpu_step_spans(steps: Sequence[tuple[int, int, int]], launched: Sequence[int | None],
                   kernels: Iterable[Span]) -> tuple[tuple[int, int, int], ...]:
    """Steps on the GPU's time: step n runs from the first begin of the kernels launched in it to the first
    begin of the next step's (the last one: to its kernels' last end). A step that launched nothing keeps
    its CPU span. Consecutive and disjoint, so that a range of steps is one window holding what they ran.

    >>> gpu_step_spans([(5, 0, 100), (6, 100, 200)], [5, 5, 6], [(40, 150), (150, 170), (180, 260)])
    ((5, 40, 180), (6, 180, 260))
    """
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for n, (begin, end) in zip(launched, kernels):
        if n is not None:
            if begin < first.get(n, begin + 1):
                first[n] = begin
            if end > last.get(n, end - 1):
                last[n] = end
    if not first:
        return tuple(steps)
    out: list[tuple[int, int, int]] = []
    for k, (n, cpu_begin, cpu_end) in enumerate(steps):
        begin = first.get(n, cpu_begin)
        if out:
            begin = max(begin, out[-1][1])
        following = [first.get(m, b) for m, b, _ in steps[k + 1:k + 2]]
        end = max(following[0], begin) if following else max(last.get(n, cpu_end), cpu_end, begin)
        out.append((n, begin, end))
    return tuple(out)
