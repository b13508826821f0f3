"""A raw Kineto event's fields read as numbers, ``None`` where they are not: times in integer nanoseconds from
Kineto's float microseconds (``"ts": 4464633909866.391``), ints written as numbers or digit strings
(``"Seq": "5"``), the GPU stream of a kernel (``"tid": "stream 7"``). Shared by both parsers.
"""

from __future__ import annotations

import re
from math import ceil, floor
from typing import Any

from comm2perfetto.sources.kineto.events import Span
from comm2perfetto.sources.limits import MAX_TIME_NS

__all__ = ["int_or_none", "on_stream", "span_ns", "span_whole_us", "stream_from_tid"]

def int_or_none(value: Any) -> int | None:
    """An int field that may be written as a number or a digit string (``"Seq": "5"``)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None



def on_stream(ev: dict[str, Any]) -> bool:
    """Whether a GPU event names its device and stream (in args, or as Kineto's pid and tid)."""
    args = ev.get("args")
    if args.__class__ is not dict:
        args = {}
    device, stream = args.get("device"), args.get("stream")
    if device.__class__ is int and stream.__class__ is int:  # what Kineto writes
        return True
    if device.__class__ is not int and int_or_none(device) is None and int_or_none(ev.get("pid")) is None:
        return False
    return stream.__class__ is int or int_or_none(stream) is not None or stream_from_tid(ev.get("tid")) is not None


def span_ns(ts: Any, dur: Any, base: int) -> Span | None:
    """(begin, end) in integer ns from Kineto's microsecond ts and dur (``base``: ``baseTimeNanoseconds``); None
    when either is not a finite number or dur is negative (floor() refuses None, strings, NaN and infinities).

    ``ts`` is written to the nanosecond (three decimals) but parsed as a float, within half an ulp of the
    decimal. Around today's ts (~2**42 us) ``int(ts * 1000)`` is a nanosecond short for about 1 value in 170, and
    ``round(ts * 1000)`` off for 1 in 340 (the product's own rounding adds to the float's error; e.g.
    ``4453700846418.643``). Splitting off the whole microseconds first (an exact subtraction) and rounding only
    the fraction gives back the written nanoseconds for every ts < 2**43 us (101.8 days). Kineto's base time is
    the start of the 7889238-second (91.3-day) interval the process started in (libkineto ChromeTraceBaseTime),
    so ts stays below that unless the trace is taken over ten days after that interval ended; past 2**43 us the
    float itself has 2 ns steps.

    >>> span_ns(4464633909866.391, 12.5, 0), span_ns("x", 1.0, 0)
    ((4464633909866391, 4464633909878891), None)
    """
    try:
        whole = floor(ts)
        begin = base + whole * 1000 + round((ts - whole) * 1000)
        whole = floor(dur)
        duration = whole * 1000 + round((dur - whole) * 1000)
    except (TypeError, ValueError, OverflowError):
        return None
    return (begin, begin + duration) if 0 <= duration and 0 <= begin and begin + duration <= MAX_TIME_NS else None


def span_whole_us(ts: Any, dur: Any, base: int) -> Span | None:
    """``span_ns`` rounded inward to whole microseconds as HTA rounds (``ceil(ts)``, ``floor(ts + dur)``, on the
    floats as written); None also when nothing is left."""
    try:
        begin, end = ceil(ts), floor(ts + dur)
    except (TypeError, ValueError, OverflowError):
        return None
    span = (base + begin * 1000, base + end * 1000)
    return span if end >= begin and dur >= 0 and 0 <= span[0] and span[1] <= MAX_TIME_NS else None


def stream_from_tid(tid: Any) -> int | None:
    """Kineto writes a GPU event's stream as its tid: ``7``, or ``"stream 7"`` in some versions."""
    value = int_or_none(tid)
    if value is not None:
        return value
    if isinstance(tid, str):
        match = re.search(r"\d+", tid)
        if match:
            return int(match.group(0))
    return None
