"""The mutable global state the hot path reads: the active recorder of this process, and per-thread context.

Wrappers check ``state.recorder is None`` first, so a process that is not recording (the torchrun agent, a
DataLoader worker, any rank after an internal error) pays one global lookup per call.
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from comm2perfetto.record.view import RecorderView

recorder: RecorderView | None = None  # a recorder.Recorder, set by session.start


class ThreadState:
    """What is known about one thread: read by a recorded call in one thread-local lookup (each attribute of a
    ``threading.local`` costs a lookup of its own)."""

    __slots__ = (
        "__weakref__",
        "call",
        "domains",
        "ends",
        "ids",
        "names",
        "paths",
        "root_start",
        "root_starts",
        "roots",
        "stack",
        "tid",
    )

    def __init__(self) -> None:
        self.tid = threading.get_ident()  # Flight Recorder's thread_id
        # The `b` record of the recorded call running on this thread, or None. Calls made while it runs are
        # part of torch's implementation of it (all_gather_object's all_gather): they pass through.
        self.call: list | None = None
        self.names: tuple[str, ...] = ()  # open NVTX / comm2perfetto ranges, outermost first
        self.ids: tuple[int, ...] = ()  # their range ids
        # Their NVTX domains (None: the default one). NVTX keeps a stack per domain and thread: a pop closes
        # the innermost range of its own domain, which need not be the innermost range overall.
        self.domains: tuple[str | None, ...] = ()
        # What context.ModuleTracker keeps. The running modules, outermost first, with their paths:
        self.stack: list[tuple[Any, str]] = []
        self.root_start = 0  # the autograd sequence number when the outermost running module began
        # The module calls that ended on this thread, in that order: the last autograd sequence number
        # created by then (never decreasing: the counter is per thread) and the module's path.
        self.ends: list[int] = []
        self.paths: list[str] = []
        # The outermost of those calls: their first sequence number; their last one and their range in
        # ends/paths.
        self.root_starts: list[int] = []
        self.roots: list[tuple[int, int, int]] = []


class _Threads(threading.local):
    def __init__(self) -> None:
        self.state = ThreadState()
        all_threads[self.state.tid] = self.state
        if recorder is not None:  # once per thread, never on the hot path
            recorder.name_thread(self.state.tid)


# Every live thread's state (it goes with its thread): where the watchdog finds the calls running.
all_threads: weakref.WeakValueDictionary[int, ThreadState] = weakref.WeakValueDictionary()
threads = _Threads()
