"""Pick the trace writer from the output file's suffix. Never imports torch.

``job.pftrace`` (or ``.perfetto-trace``): interned, compressed Perfetto protobuf, the format to use.
``job.json`` / ``job.json.gz``: legacy Chrome JSON, for tools that only read that (several times larger).
"""

from __future__ import annotations

import zlib
from pathlib import Path

from comm2perfetto.errors import OptionError
from comm2perfetto.trace.sink import TraceSink

__all__ = ["JSON_SUFFIXES", "PERFETTO_SUFFIXES", "format_for", "open_writer", "sniff_trace"]

PERFETTO_SUFFIXES = (".pftrace", ".perfetto-trace")
JSON_SUFFIXES = (".json", ".json.gz")


def format_for(path: str | Path) -> str:
    """``"perfetto"`` or ``"json"``; OptionError (a ValueError) naming the suffixes known."""
    name = str(path).lower()
    if name.endswith(PERFETTO_SUFFIXES):
        return "perfetto"
    if name.endswith(JSON_SUFFIXES):
        return "json"
    known = ", ".join(PERFETTO_SUFFIXES + JSON_SUFFIXES)
    raise OptionError(f"unknown output format for {Path(path).name!r}: use one of {known}")


def open_writer(path: str | Path, *, write_to: str | Path | None = None,
                realtime_anchor_ns: int | None = None) -> TraceSink:
    """A writer in the format ``path`` names, writing to ``write_to`` (default ``path``), created now.

    Raises OSError when the file cannot be created.
    """
    target = write_to if write_to is not None else path
    if format_for(path) == "perfetto":
        from comm2perfetto.trace.perfetto import PerfettoWriter

        return PerfettoWriter(target, realtime_anchor_ns=realtime_anchor_ns)
    from comm2perfetto.trace.chrome_json import ChromeJsonWriter

    # JSON times are float microseconds: exact to the ns only close to an origin. A whole second a minute
    # before the anchor stays below every event (profiler traces may start a little before the first call).
    origin = 0 if realtime_anchor_ns is None else max(0, (realtime_anchor_ns // 10**9 - 60) * 10**9)
    return ChromeJsonWriter(target, gzip=str(path).lower().endswith(".gz"), time_origin_ns=origin)


# How each kind of file the Perfetto UI opens begins: a Perfetto protobuf Trace with its first field, `packet`
# (field 1, length-delimited: tag 0x0a); Chrome JSON (an object or an array); systrace / ftrace text.
_TEXT_TRACE_STARTS = (b"# tracer:", b"TRACE:", b"<html", b"<!DOCTYPE html")


def sniff_trace(head: bytes) -> str | None:
    """What the first bytes of a file say it is: ``"perfetto"``, ``"json"``, ``"systrace"`` (also gzipped),
    or None (not a trace the Perfetto UI opens).

    >>> sniff_trace(b"\\x0a\\x8f\\x01"), sniff_trace(b'  {"traceEvents": ['), sniff_trace(b"meeting notes")
    ('perfetto', 'json', None)
    """
    if head[:2] == b"\x1f\x8b":
        try:
            head = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(head, 4096)
        except zlib.error:
            return None
    text = head.lstrip()
    if text[:1] in (b"{", b"["):  # first: JSON may begin with a newline, which is also the protobuf's tag
        return "json"
    if head[:1] == b"\x0a":
        return "perfetto"
    if text.startswith(_TEXT_TRACE_STARTS):
        return "systrace"
    return None
