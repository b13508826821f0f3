"""CUDA graph captures in progress in this process, so that the recorder touches no CUDA state meanwhile.

While a stream captures (``torch.cuda.graph``, ``make_graphed_callables``, torch.compile's cudagraphs), a CUDA
call from any thread that queries or synchronises (a Flight Recorder dump queries its entries' events; ``--sync``
synchronises the device) fails and invalidates the capture under the default "global" capture mode. The
recorder counts captures by wrapping ``torch.cuda.CUDAGraph.capture_begin`` / ``capture_end`` (what every way of
capturing calls) and stays off CUDA while ``active`` is non-zero.

A collective captured into a graph is issued at each replay, out of sight: Flight Recorder does not record
captured work and the patch layer sees only the capture. The recorder marks captured calls (a ``v`` record) so
that readers do not take them for collectives issued then.
"""

from __future__ import annotations

from typing import Any

active = 0  # captures in progress in this process, on any thread
_patched: list[tuple[Any, str, Any]] = []


def install(torch: Any) -> None:
    """Wrap CUDAGraph's capture_begin/capture_end (idempotent; a build without CUDA graphs is left alone)."""
    graph = getattr(getattr(torch, "cuda", None), "CUDAGraph", None)
    if graph is None or _patched:
        return
    begin, end = graph.capture_begin, graph.capture_end

    def capture_begin(self: Any, *args: Any, **kwargs: Any) -> Any:
        global active
        active += 1  # before the capture starts: no dump may slip in between
        try:
            return begin(self, *args, **kwargs)
        except BaseException:
            active -= 1
            raise

    def capture_end(self: Any, *args: Any, **kwargs: Any) -> Any:
        global active
        try:
            return end(self, *args, **kwargs)
        finally:
            active = max(active - 1, 0)

    replacements: tuple[tuple[str, Any, Any], ...] = (
        ("capture_begin", capture_begin, begin), ("capture_end", capture_end, end))
    for name, new, original in replacements:
        new.__wrapped__ = original
        new.__name__ = original.__name__
        setattr(graph, name, new)
        _patched.append((graph, name, original))


def uninstall() -> None:
    global active
    while _patched:
        owner, name, original = _patched.pop()
        setattr(owner, name, original)
    active = 0
