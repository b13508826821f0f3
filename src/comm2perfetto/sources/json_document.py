"""One JSON document of ours read from a file: the checks every such reader makes before its own.

The live snapshot, a live window and a stacks file are each one JSON object that names its format::

    {"format": "comm2perfetto-window", "version": 1, "world_size": 4, ...}

``read_json_document`` refuses what is not a regular file (a FIFO would block forever), more than ``limit``
bytes (after gzip), what does not parse, and an object of another format, with one line naming the file in
the reader's own error class. The fields are the reader's to check.
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

import orjson

from comm2perfetto.sources.limits import MAX_FILE_BYTES, TooLargeError, read_bounded, regular_file_problem

__all__ = ["read_json_document"]


def read_json_document(path: Path, fmt: str, what: str, error: type[Exception],
                       limit: int = MAX_FILE_BYTES) -> dict[str, Any]:
    """The JSON object in ``path`` whose ``"format"`` is ``fmt``; raises ``error`` (its message: the path, then
    what is wrong, ``what`` naming the kind of file) when there is none.

    >>> read_json_document(Path("/nonexistent.json"), "comm2perfetto-window", "comm2perfetto window", ValueError)
    Traceback (most recent call last):
    ValueError: /nonexistent.json: cannot read (No such file or directory)
    """
    problem = regular_file_problem(path)
    if problem is not None:
        raise error(f"{path}: {problem}")
    try:
        doc = orjson.loads(read_bounded(path, limit))
    except (OSError, TooLargeError, EOFError, zlib.error, orjson.JSONDecodeError) as exc:
        raise error(f"{path}: unreadable ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != fmt:
        raise error(f"{path}: not a {what}")
    return doc
