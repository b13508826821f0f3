"""Which rank a profiler (Kineto) trace belongs to, before it is parsed. Never imports torch.

In order:

1. ``distributedInfo`` (``{"backend": "nccl", "rank": 3, "world_size": 8, ...}``), wherever it is in the file:
   Kineto writes it near the top, but traces rewritten by other tools have it after the events (a public 2023
   trace has it at byte 863,585), so when the first bytes lack it the whole text is scanned (decompressed in
   chunks, never parsed);
2. an explicit rank in the file name: ``rank3``, ``rank-3``, ``rank_3``, torch's ``*_rank_3``
   (``rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz``, ``sampled_rank-1.json.gz``, ``rank0.kineto.1.json.gz``).
   Any other number in a name is not a rank (``train_resnet18.json.gz``, ``rank0_iter16_18.json``: rank 0);
3. otherwise unknown: the caller names the file and the user gives its rank (``--trace-rank FILE=RANK``).
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from comm2perfetto.sources.limits import MAX_TRACE_BYTES, MAX_WORLD_SIZE

_KEY = b'"distributedInfo"'
_CHUNK = 1 << 20
_AFTER = 1 << 16  # how much text after the key to look in for rank and world_size
_RANK_IN_NAME = re.compile(r"(?:^|[^a-z0-9])rank[-_]?(\d+)(?!\d)", re.IGNORECASE)
_INT_FIELD = {key: re.compile(rb'"' + key.encode() + rb'"\s*:\s*(-?\d+)') for key in ("rank", "world_size")}


def rank_from_trace_name(name: str) -> int | None:
    """The rank a trace's file name states explicitly, else None.

    >>> [rank_from_trace_name(n) for n in ("rank-3.json", "trace_rank_12.json.gz", "rank0_iter16_18.json",
    ...                                    "train_resnet18.json.gz", "myrank3.json", "rank0.kineto.1.json.gz")]
    [3, 12, 0, None, None, 0]
    """
    match = _RANK_IN_NAME.search(name)
    rank = int(match.group(1)) if match else None
    return rank if rank is not None and rank < MAX_WORLD_SIZE else None


def distributed_info(path: Path, gzipped: bool) -> tuple[int | None, int | None]:
    """(rank, world size) from the trace's ``distributedInfo``, wherever it is; (None, None) without one."""
    window = _find_after_key(path, gzipped)
    if window is None:
        return None, None
    end = _object_end(window)
    info = window[:end]
    values = []
    for key in ("rank", "world_size"):
        match = _INT_FIELD[key].search(info)
        values.append(int(match.group(1)) if match else None)
    rank, world = values
    if world is not None and not 0 < world <= MAX_WORLD_SIZE:
        world = None
    return (rank if rank is not None and 0 <= rank < (world or MAX_WORLD_SIZE) else None), world


def _find_after_key(path: Path, gzipped: bool) -> bytes | None:
    """Up to ``_AFTER`` bytes of text from the ``distributedInfo`` key on, or None."""
    try:
        fh = open(path, "rb")
    except OSError:
        return None
    with fh:
        tail = b""
        found: bytes | None = None
        for text in _text_chunks(fh, gzipped):
            if found is not None:
                found += text
                if len(found) >= _AFTER:
                    return found[:_AFTER]
                continue
            data = tail + text
            i = data.find(_KEY)
            if i >= 0:
                found = data[i:]
                if len(found) >= _AFTER:
                    return found[:_AFTER]
                continue
            tail = data[-len(_KEY):]
        return found


def _text_chunks(fh: BinaryIO, gzipped: bool) -> Iterator[bytes]:
    """The file's text in chunks of at most ``_CHUNK`` bytes, inflated in bounded steps, and no more than
    ``MAX_TRACE_BYTES`` in all (a gzip bomb is scanned that far, never held)."""
    inflate = zlib.decompressobj(16 + zlib.MAX_WBITS) if gzipped else None
    total = 0
    while total < MAX_TRACE_BYTES:
        try:
            raw = fh.read(_CHUNK)
            if inflate is None:
                if not raw:
                    return
                total += len(raw)
                yield raw
                continue
            data = raw
            while True:
                text = inflate.decompress(data, _CHUNK)
                total += len(text)
                if text:
                    yield text
                data = inflate.unconsumed_tail
                if not data or total >= MAX_TRACE_BYTES:
                    break
        except (OSError, zlib.error):
            return
        if not raw:
            return


def _object_end(window: bytes) -> int:
    """Where the ``distributedInfo`` object that ``window`` starts with ends (its closing brace), so that a
    later ``"rank"`` (of an event's args) is not read as the trace's."""
    depth = 0
    for i, byte in enumerate(window):
        if byte == 0x7B:  # {
            depth += 1
        elif byte == 0x7D:  # }
            depth -= 1
            if depth == 0:
                return i + 1
    return len(window)
