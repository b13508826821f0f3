"""Progress on stderr for long work: silent for the first second, then at most two updates a second.

On a terminal one line is rewritten in place. Into a pipe (``diagnose run1 2>&1 | less``) nothing is written;
into a log file (a batch job's stderr) a counted step is written at most every 10 seconds, so the log stays
readable. Work that cannot be counted (matching, analysis) shows its elapsed time, on a terminal only.
"""

from __future__ import annotations

import os
import stat
import sys
import threading
import time
from types import TracebackType
from typing import TextIO

_TTY, _FILE, _QUIET = "tty", "file", "quiet"


def _kind(stream: TextIO) -> str:
    if hasattr(stream, "isatty") and stream.isatty():
        return _TTY
    try:
        mode = os.fstat(stream.fileno()).st_mode
    except (AttributeError, OSError, ValueError):  # a StringIO, a closed stream: treat as a log
        return _FILE
    return _QUIET if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) else _FILE


class Progress:
    """``Progress("reading dumps")(done, total)``; ``finish()`` ends the line if one was drawn.

    ``then``: what runs once the counted work is done, until ``finish()`` (``load_job`` matches the collectives
    right after reading the last dump): shown as a :class:`Phase`."""

    def __init__(self, label: str, stream: TextIO | None = None, quiet_s: float = 1.0,
                 then: str | None = None) -> None:
        self._label = label
        self._stream = stream if stream is not None else sys.stderr
        self._kind = _kind(self._stream)
        self._tty = self._kind == _TTY
        self._start = time.monotonic()
        self._quiet_s = quiet_s
        self._every_s = 0.5 if self._tty else 10.0
        self._last = 0.0
        self._drawn = False
        self._then = Phase(then, self._stream, quiet_s) if then else None

    def __call__(self, done: int, total: int) -> None:
        self._draw(done, total)
        if done >= total and self._then is not None:
            self.finish_line()
            self._then.__enter__()

    def _draw(self, done: int, total: int) -> None:
        now = time.monotonic()
        if self._kind == _QUIET or now - self._start < self._quiet_s or \
                (now - self._last < self._every_s and done < total):
            return
        self._last = now
        text = f"comm2perfetto: {self._label}: {done}/{total} ({done * 100 // max(total, 1)}%)"
        if self._tty:
            self._stream.write("\r" + text)
        else:
            self._stream.write(text + "\n")
        self._stream.flush()
        self._drawn = True

    def finish_line(self) -> None:
        if self._drawn and self._tty:
            self._stream.write("\n")
            self._stream.flush()
            self._drawn = False

    def finish(self) -> None:
        self.finish_line()
        if self._then is not None:
            self._then.__exit__(None, None, None)


class Phase:
    """``with Phase("analysing"):``: on a terminal, after a quiet second, ``comm2perfetto: analysing... 12 s``
    rewritten every second by a daemon thread until the block ends; nothing elsewhere."""

    def __init__(self, label: str, stream: TextIO | None = None, quiet_s: float = 1.0, every_s: float = 1.0) -> None:
        self._label = label
        self._stream = stream if stream is not None else sys.stderr
        self._quiet_s = quiet_s
        self._every_s = every_s
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._drawn = False

    def __enter__(self) -> Phase:
        if self._thread is None and _kind(self._stream) == _TTY:
            self._thread = threading.Thread(target=self._tick, name="comm2perfetto-progress", daemon=True)
            self._thread.start()
        return self

    def _tick(self) -> None:
        start = time.monotonic()
        if self._done.wait(self._quiet_s):
            return
        while True:
            self._stream.write(f"\rcomm2perfetto: {self._label}... {time.monotonic() - start:.0f} s")
            self._stream.flush()
            self._drawn = True
            if self._done.wait(self._every_s):
                return

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._thread is None:
            return
        self._done.set()
        self._thread.join()
        self._thread = None
        if self._drawn:
            self._stream.write("\n")
            self._stream.flush()
