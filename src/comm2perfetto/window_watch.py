"""The live windows' launcher side: ``comm2perfetto record`` turns each window the job gathers into metrics and
straggler events.

A thread of ``record`` watches ``DIR/live/window.json`` (the lowest rank of each host and folder copies every
gathered window there: record/gather.py). For each new window it rewrites ``metrics.prom`` (in ``DIR/live``, or
``--metrics-dir``) atomically, appends the window's straggler events to ``DIR/live/stragglers.jsonl`` (one JSON
object a line), says each on stderr and runs ``--on-straggler`` with the event on stdin (hooks.py). The event
(docs/live.md)::

    {"format": "comm2perfetto-straggler", "version": 1, "event": "start", "rank": 2, "group": "0",
     "group_desc": "default_pg", "mean_lateness_s": 0.0305, "last_share": 1.0, "windows": [359181721, 359181722],
     "threshold_s": 0.00207, "window": 359181722, "attempt": 0, "host": "node1", "t_ns": 1795908615949854660}
"""

from __future__ import annotations

import os
import sys
from typing import Any, TextIO

import orjson

from comm2perfetto import layout
from comm2perfetto.hooks import HookRunner, Poller

DEFAULT_HOOK_TIMEOUT_S = 30.0


class WindowWatcher(Poller):
    """Polls ``out_dir/live/window.json`` on a daemon thread; ``stop()`` takes a last look and waits for the
    commands still running."""

    def __init__(self, out_dir: str, metrics_dir: str | None = None, on_straggler: str | None = None,
                 hook_timeout_s: float = DEFAULT_HOOK_TIMEOUT_S, err: TextIO | None = None,
                 poll_s: float = 0.5) -> None:
        super().__init__("live windows", "comm2perfetto-windows", poll_s)
        self._path = os.path.join(out_dir, layout.LIVE_WINDOW_FILE)
        self._events_path = os.path.join(out_dir, layout.STRAGGLERS_FILE)
        self._metrics_path = os.path.join(metrics_dir or os.path.join(out_dir, layout.WINDOWS_DIR),
                                          layout.METRICS_FILE)
        self._err = err if err is not None else sys.stderr
        self._seen: tuple[int, int] | None = None  # the file's (mtime_ns, size) last read
        self._last: tuple[int, int] | None = None  # (attempt, window) last handled
        self._problem: str | None = None
        self._hooks = HookRunner(on_straggler, hook_timeout_s, os.path.join(out_dir, layout.ON_STRAGGLER_LOG),
                                 "--on-straggler", self._say) if on_straggler else None

    def poll(self) -> None:
        from comm2perfetto.render.prometheus import metrics_text
        from comm2perfetto.sources.live_window import LiveWindowError, read_window

        try:
            st = os.stat(self._path)
        except OSError:
            return
        if (st.st_mtime_ns, st.st_size) == self._seen:
            return
        self._seen = (st.st_mtime_ns, st.st_size)
        try:
            window = read_window(self._path)
        except LiveWindowError as exc:
            if str(exc) != self._problem:  # said once, not every poll
                self._problem = str(exc)
                self._say(f"live windows: {exc}")
            return
        if (window.attempt, window.window) == self._last:
            return
        self._last = (window.attempt, window.window)
        os.makedirs(os.path.dirname(self._metrics_path), exist_ok=True)
        layout.write_whole(self._metrics_path, metrics_text(window).encode())
        if window.events:
            with open(self._events_path, "ab") as f:
                f.write(b"".join(orjson.dumps(e, option=orjson.OPT_APPEND_NEWLINE) for e in window.events))
        for event in window.events:
            self._say(describe(event))
            if self._hooks is not None:
                self._hooks.submit(f"straggler-{event['event']}", orjson.dumps(event))

    def _say(self, text: str) -> None:
        self._err.write(f"comm2perfetto: {text}\n")
        self._err.flush()


def describe(event: dict[str, Any]) -> str:
    """One line for a straggler event.

    >>> print(describe({"event": "start", "rank": 2, "group": "0", "group_desc": "default_pg",
    ...                 "mean_lateness_s": 0.0305, "last_share": 1.0, "windows": [7, 8]}))
    straggler: rank 2 on default_pg (group 0) arrives 30.5 ms after the earliest, last at 100% ... windows 7, 8
    """
    from comm2perfetto.words import duration

    where = f"{event.get('group_desc') or 'group'} (group {event['group']})"
    windows = ", ".join(map(str, event["windows"]))
    if event["event"] == "start":
        return (f"straggler: rank {event['rank']} on {where} arrives {duration(event['mean_lateness_s'] * 1e9)} "
                f"after the earliest, last at {event['last_share']:.0%} of its collectives, late in windows {windows}")
    return (f"straggler ended: rank {event['rank']} on {where} was late in windows {windows} "
            f"({duration(event['mean_lateness_s'] * 1e9)} on average)")
