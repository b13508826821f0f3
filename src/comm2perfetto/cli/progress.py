"""Progress on stderr for long work: silent for the first second, then at most two updates a second.

On a terminal one line is rewritten in place; into a log file (a batch job's stderr) a line is written at most
every 10 seconds, so the log stays readable.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """``Progress("reading dumps")(done, total)``; ``finish()`` ends the line if one was drawn."""

    def __init__(self, label: str, stream: TextIO | None = None, quiet_s: float = 1.0) -> None:
        self._label = label
        self._stream = stream if stream is not None else sys.stderr
        self._tty = hasattr(self._stream, "isatty") and self._stream.isatty()
        self._start = time.monotonic()
        self._quiet_s = quiet_s
        self._every_s = 0.5 if self._tty else 10.0
        self._last = 0.0
        self._drawn = False

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if now - self._start < self._quiet_s or (now - self._last < self._every_s and done < total):
            return
        self._last = now
        text = f"comm2perfetto: {self._label}: {done}/{total} ({done * 100 // max(total, 1)}%)"
        if self._tty:
            self._stream.write("\r" + text)
        else:
            self._stream.write(text + "\n")
        self._stream.flush()
        self._drawn = True

    def finish(self) -> None:
        if self._drawn and self._tty:
            self._stream.write("\n")
            self._stream.flush()
