"""The crash-safe per-rank event log.

Each rank appends one JSON document per line to ``rank<R>.events.jsonl`` (format in docs/log-format.md).
The file is a shared memory mapping: a record is in the kernel's page cache the moment it is copied in, so
it survives SIGKILL, a SIGABRT raised from C++ and ``os._exit`` without any flush. Only a machine crash
loses the tail. The mapping grows in chunks; a clean close truncates the zero padding, a dead process
leaves it (readers strip trailing NUL bytes and tolerate one torn last line).

Raw example (first lines of a log)::

    {"kind":"header","format":"comm2perfetto-events","version":1,"rank":0,"world_size":2,...}
    ["g",0,"0","default_pg",[0,1],"gloo"]
    ["s",1,"train.py:57 main"]
    ["a",1,[[4]],["Float"],16]
    ["b",1,1763110000000000000,"all_reduce",0,1,null,false,139911,1,0,3,1]
"""

from __future__ import annotations

import mmap
import os
import threading
from typing import Any

import orjson

_MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)  # Linux 5.14+
_CHUNK = 4 << 20  # grow 4 MiB at a time: a few hundred thousand records
_dumps = orjson.dumps
_NEWLINE = orjson.OPT_APPEND_NEWLINE


class EventLog:
    """Append-only JSON-lines file backed by a shared mapping.

    ``write`` is called from the training thread, gloo's callback threads and the watchdog, so the copy
    and the position update are done under one lock.
    """

    def __init__(self, path: str, chunk: int = _CHUNK) -> None:
        self.path = path
        self._chunk = chunk
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        self._size = chunk
        os.ftruncate(self._fd, self._size)
        self._map = mmap.mmap(self._fd, self._size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self._populate(0, self._size)
        self._pos = 0  # the length, once closed; the mapping's own position before
        self._lock = threading.Lock()
        self.closed = False
        # The recorder's hot path appends serialised records with this (mmap.write: copies and advances the
        # position in one C call) and hands what raises ValueError or TypeError (full, or closed) to
        # write_bytes.
        self.append = self._map.write

    def write(self, record: Any) -> None:
        """Serialise ``record`` (a list or dict of JSON types) and append it as one line.

        ``mmap.write`` copies and advances the mapping's position in one C call under the GIL, so writers on
        different threads never interleave; only growing the mapping takes the lock.
        """
        data = _dumps(record, None, _NEWLINE)
        try:
            self._map.write(data)
        except (ValueError, TypeError):  # full (or closed: ValueError/TypeError from a released mapping)
            self.write_bytes(data)

    def write_bytes(self, data: bytes) -> None:
        """Append one serialised record, growing the mapping as needed; nothing once closed."""
        with self._lock:
            if self.closed:
                return
            needed = self._map.tell() + len(data)
            if needed > self._size:
                size = self._size
                while size < needed:
                    size += self._chunk
                os.ftruncate(self._fd, size)
                self._map.resize(size)
                self._populate(self._size, size - self._size)
                self._size = size
            self._map.write(data)

    def _populate(self, start: int, length: int) -> None:
        """Fault the pages of a new chunk in for writing now, in one system call (about 3 ms for 4 MiB here):
        faulting them in one at a time, as records reach them, costs a third more, spread over the calls."""
        try:
            self._map.madvise(_MADV_POPULATE_WRITE, start, length)
        except (OSError, ValueError):  # Linux before 5.14: records fault their pages in as they go
            pass

    def tail(self, nbytes: int) -> bytes:
        """A copy of the last ``nbytes`` written (all of it when shorter): the live verdict reads its own recent
        records back at a stall, so the hot path keeps no history of its own."""
        with self._lock:  # the mapping is not resized meanwhile
            if self.closed:
                return b""
            end = self._map.tell()
            return self._map[max(0, end - nbytes):end]

    def read_from(self, offset: int) -> bytes:
        """A copy of what was written from byte ``offset`` on: the window summaries (window.py) read the records
        of the last second back, so the hot path keeps no counts of its own. Every record is copied in by one C
        call under the GIL, so the copy ends with a whole record."""
        with self._lock:
            if self.closed:
                return b""
            return self._map[offset:self._map.tell()]

    @property
    def bytes_written(self) -> int:
        return self._map.tell() if not self.closed else self._pos

    def close(self) -> None:
        """Flush, drop the zero padding and release the mapping. Safe to call twice."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            self._pos = self._map.tell()
            self._map.flush()
            self._map.close()
            os.ftruncate(self._fd, self._pos)
            os.close(self._fd)

    def abandon(self) -> None:
        """Forget the mapping without touching the file: used in a forked child, which must not write.

        No lock: the fork may have copied it in a held state from another thread.
        """
        self.closed = True
        self._lock = threading.Lock()
        try:
            self._map.close()
            os.close(self._fd)
        except (OSError, ValueError, BufferError):
            pass
