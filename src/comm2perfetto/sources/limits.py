"""What a file may claim, and how much of it is read: the bounds every reader in ``sources/`` checks against.

Files copied off a cluster can be partly written, corrupted, from another tool or crafted. Memory and time
follow the data actually present, never a number a file states: a world size, a rank in a file name, a
group's member list or a gzip stream's inflated size is refused beyond these limits, with one line naming the
file. Never imports torch.
"""

from __future__ import annotations

import os
import stat
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeGuard

from comm2perfetto.errors import Comm2PerfettoError

# The largest world size (and so the largest rank + 1) accepted: above the largest jobs run today (about
# 100,000 GPUs), and small enough that a per-rank table of it costs megabytes, not gigabytes.
MAX_WORLD_SIZE = 1 << 17
# The largest file read whole (after gzip): a Flight Recorder dump of a 20,000-entry ring is about 20 MB,
# an event log of a long job a few hundred MB.
MAX_FILE_BYTES = 1 << 29
# The largest profiler trace read (after gzip): Kineto JSON of many profiled GPU steps reaches a gigabyte.
MAX_TRACE_BYTES = 1 << 31
# Times are integer nanoseconds of CLOCK_REALTIME (or, in some fields, CLOCK_MONOTONIC): never negative and
# within an int64 (the year 2262), which the readers' columns hold them in (and an array('q') checks in C).
# Ids and sequence numbers have the same range.
MAX_TIME_NS = (1 << 63) - 1
# A time of a job's event is at least a day after the epoch (clock offsets between ranks, at most a day too,
# never take it below zero) and, in an event log, within a year of the rank's start (its header's wall_ns).
MIN_TIME_NS = 86_400 * 10**9
MAX_OFFSET_NS = 86_400 * 10**9
MAX_JOB_NS = 366 * 86_400 * 10**9
_INFLATE_CHUNK = 1 << 24


class TooLargeError(Comm2PerfettoError, ValueError):
    """A file (or its gzip content) larger than ``MAX_FILE_BYTES``."""


def regular_file_problem(path: Path) -> str | None:
    """Why ``path`` must not be opened (a FIFO blocks the reader forever, a device never ends), or None."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        return f"cannot read ({exc.strerror})"
    if stat.S_ISREG(mode):
        return None
    kind = ("a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a file")
    return f"not a regular file ({kind}); not read"


def read_bounded(path: Path, limit: int = MAX_FILE_BYTES) -> bytes:
    """The whole file, gunzipped when it is gzip, refusing more than ``limit`` bytes either way.

    Raises OSError, TooLargeError, or zlib.error / EOFError for a corrupt or truncated gzip stream.
    """
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size > limit:
            raise TooLargeError(f"{size:,} bytes, larger than any real one (limit {limit:,}); not read")
        data = fh.read(min(size, limit) + 1)  # +1: a file that grew past the limit since fstat
    if len(data) > limit:
        raise TooLargeError(f"larger than any real one (limit {limit:,} bytes); not read")
    return gunzip_bounded(data, limit) if data[:2] == b"\x1f\x8b" else data


def gunzip_bounded(data: bytes, limit: int = MAX_FILE_BYTES) -> bytes:
    """Inflate a gzip stream (several members allowed), refusing to produce more than ``limit`` bytes."""
    out: list[bytes] = []
    total = 0
    while data:
        inflater = zlib.decompressobj(31)
        while True:
            piece = inflater.decompress(data, min(_INFLATE_CHUNK, limit + 1 - total))
            total += len(piece)
            out.append(piece)
            if total > limit:
                raise TooLargeError(f"inflates to more than {limit:,} bytes, larger than any real one; not read")
            data = inflater.unconsumed_tail
            if inflater.eof or (not data and not piece):
                break
        if not inflater.eof:
            raise EOFError("truncated gzip stream")
        data = inflater.unused_data.lstrip(b"\0")
    return b"".join(out)


def is_int(value: Any) -> bool:
    """An int that is not a bool (JSON and pickles both give bools where ints were expected)."""
    return type(value) is int


# A group's members: a range where they are consecutive (see ``compact_ranks``).
Ranks = tuple[int, ...] | range


def compact_ranks(ranks: Sequence[int]) -> Ranks:
    """Checked ranks as a ``range`` where they are one (the usual group: every rank, or a block of them), so
    that membership, hashing and comparing cost nothing: 16,384 ranks each naming a 16,384-rank group made
    resolving groups quadratic as tuples; else a tuple.

    >>> compact_ranks([0, 1, 2, 3]), compact_ranks([0, 2]), compact_ranks([])
    (range(0, 4), (0, 2), ())
    """
    ranks = tuple(ranks)
    if ranks and ranks == tuple(range(ranks[0], ranks[0] + len(ranks))):
        return range(ranks[0], ranks[0] + len(ranks))
    return ranks


def rank_ok(value: Any, world: int | None = None) -> TypeGuard[int]:
    """A rank: an int in [0, world) (or [0, MAX_WORLD_SIZE) while the world is unknown)."""
    return type(value) is int and 0 <= value < (world if world else MAX_WORLD_SIZE)


def world_ok(value: Any) -> TypeGuard[int]:
    """A world size: an int in [1, MAX_WORLD_SIZE]."""
    return type(value) is int and 1 <= value <= MAX_WORLD_SIZE


def time_ok(value: Any) -> bool:
    """A time in ns: an int in [0, 2**63)."""
    return type(value) is int and 0 <= value <= MAX_TIME_NS


def opt_time_ok(value: Any) -> bool:
    return value is None or (type(value) is int and 0 <= value <= MAX_TIME_NS)


def count_ok(value: Any) -> TypeGuard[int]:
    """A sequence number, id or size: an int in [0, 2**63)."""
    return type(value) is int and 0 <= value <= MAX_TIME_NS


def shown(value: Any, width: int = 40) -> str:
    """A value read from a file, as a note may quote it: its repr, cut to ``width`` characters."""
    if isinstance(value, int) and abs(value) >= 10**30:
        return f"a {value.bit_length()}-bit number"  # repr of a huge int is slow, past 4300 digits refused
    try:
        text = repr(value)
    except RecursionError:  # a list nested thousands deep
        return "a deeply nested value"
    return text if len(text) <= width else text[:width - 3] + "..."
