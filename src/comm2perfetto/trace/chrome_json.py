"""Legacy Chrome JSON trace writer (``.json``, or ``.json.gz`` gzipped), streamed.

The file, one event per line::

    {"displayTimeUnit":"ns","otherData":{"time_origin_ns":0},"traceEvents":[
    {"ph":"M","pid":2,"tid":0,"name":"process_name","args":{"name":"rank 0"}},
    {"ph":"M","pid":2,"tid":10,"name":"thread_name","args":{"name":"default_pg"}},
    {"ph":"X","pid":2,"tid":10,"ts":1000.0,"dur":8.0,"name":"all_reduce","args":{"seq":3}},
    {"ph":"s","pid":2,"tid":10,"ts":1000.0,"id":7,"cat":"comm2perfetto","name":"flow","bp":"e"},
    {"ph":"C","pid":2,"ts":1010.5,"name":"bytes in flight","args":{"value":16}}
    ]}

A process is a pid (``process_name``, ``process_sort_index``, ``process_labels`` from its description); a
track is a tid inside it, its uuid (``thread_name``, ``thread_sort_index``; a uuid that is not a valid
uint32 tid, or equals the pid, gets a tid from 2**31 up). Events placed on a process itself use tid = pid.

``ts`` and ``dur`` are microseconds as floats: ``(ns - time_origin_ns) / 1000``. A double holds whole ns
only below 2**53 ns (104 days), so pass ``time_origin_ns`` (at most the earliest time written; earlier
times raise ``ValueError``, trace_processor drops negative ones) to keep ns precision with CLOCK_REALTIME
times. It is written into ``otherData``, which trace_processor skips, for readers such as ``check``.

Flows are legacy v1 flow events right after the event they belong to, with ``bp: "e"``: trace_processor
binds them to the slice open on that pid/tid at that ts (src/trace_processor/importers/json/
json_trace_parser.cc, FlowTracker), which is that event, since X events sort before others at one ts.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import orjson

from .sink import ArgValue, EventItem, SharedArgs, WriteStats, arg_text

FLOW_CATEGORY = "comm2perfetto"
FLOW_NAME = "flow"
_CHUNK_BYTES = 1 << 20
_GZIP_LEVEL = 6  # gzip.open defaults to 9: several times slower for a few percent
_SCALARS = (str, int, float, bool)
_FLOW_PHASES = ("s", "t", "f")  # flow_start, flow_step, flow_end


class ChromeJsonWriter:
    """Writes a ``TraceSink`` stream as Chrome JSON. ``gzip=None``: gzip when ``path`` ends in ``.gz``.

    An unwritable path raises ``OSError`` here; events on an undeclared track raise ``ValueError``.
    """

    def __init__(self, path: str | os.PathLike[str], *, gzip: bool | None = None, time_origin_ns: int = 0) -> None:
        self._path = os.fspath(path)
        if gzip is None:
            gzip = self._path.endswith(".gz")
        self._file = open(self._path, "wb")
        # gzip: one gzip stream (wbits 31), deflated on a worker thread (zlib releases the GIL).
        self._gzip = zlib.compressobj(_GZIP_LEVEL, zlib.DEFLATED, 31) if gzip else None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="json-writer") if gzip else None
        self._inflight: Future[None] | None = None
        self._origin = time_origin_ns
        self._lines: list[bytes] = []
        self._pending_bytes = 0
        self._first = True
        self._stats: WriteStats | None = None
        # uuid -> (pid, tid) of every place events may go; counter tracks -> (pid, name).
        self._slice_tracks: dict[int, tuple[int, int]] = {}
        self._counter_tracks: dict[int, tuple[int, str]] = {}
        self._pids: dict[int, int] = {}  # process uuid -> pid
        self._tids: set[tuple[int, int]] = set()  # (pid, tid) of the tracks
        self._open: dict[int, int] = {}
        self._slices = self._instants = self._counters = self._flows = 0
        header = {"displayTimeUnit": "ns", "otherData": {"time_origin_ns": time_origin_ns}}
        self._write(orjson.dumps(header)[:-1] + b',"traceEvents":[\n')

    # --- declarations ---------------------------------------------------------------------------------------

    def process(self, uuid: int, pid: int, name: str, *, description: str | None = None,
                sort_index: int | None = None) -> None:
        self._check_new(uuid)
        self._pids[uuid] = pid
        self._slice_tracks[uuid] = (pid, pid)
        self._open[uuid] = 0
        self._meta(pid, 0, "process_name", {"name": name})
        if sort_index is not None:
            self._meta(pid, 0, "process_sort_index", {"sort_index": sort_index})
        if description is not None:
            self._meta(pid, 0, "process_labels", {"labels": description})

    def track(self, uuid: int, parent: int, name: str, *, sort_index: int | None = None,
              description: str | None = None) -> None:
        pid = self._parent_pid(uuid, parent)
        tid = uuid
        if tid == pid or not 0 < tid < 1 << 32 or (pid, tid) in self._tids:
            # trace_processor reads tids as uint32, and tid == pid is the process's own track.
            tid = next(t for t in range(1 << 31, 1 << 32) if (pid, t) not in self._tids and t != pid)
        self._tids.add((pid, tid))
        self._slice_tracks[uuid] = (pid, tid)
        self._open[uuid] = 0
        self._meta(pid, tid, "thread_name", {"name": name})
        if sort_index is not None:
            self._meta(pid, tid, "thread_sort_index", {"sort_index": sort_index})
        # Chrome JSON has no place for a thread's description.

    def counter_track(self, uuid: int, parent: int, name: str, *, unit: str | None = None,
                      sort_index: int | None = None) -> None:
        # A counter track is its name inside the pid: JSON has no declaration (nor unit, nor order) for it.
        self._counter_tracks[uuid] = (self._parent_pid(uuid, parent), name)

    def _check_new(self, uuid: int) -> None:
        if not isinstance(uuid, int) or uuid <= 0:
            raise ValueError(f"track uuid must be a positive int, got {uuid!r}")
        if uuid in self._slice_tracks or uuid in self._counter_tracks:
            raise ValueError(f"track uuid {uuid} declared twice")

    def _parent_pid(self, uuid: int, parent: int) -> int:
        self._check_new(uuid)
        pid = self._pids.get(parent)
        if pid is None:
            raise ValueError(f"track {uuid}: parent {parent} is not a declared process")
        return pid

    def _meta(self, pid: int, tid: int, name: str, args: dict[str, Any]) -> None:
        self._emit({"ph": "M", "pid": pid, "tid": tid, "name": name, "args": args})

    # --- events ---------------------------------------------------------------------------------------------

    def _place(self, track: int) -> tuple[int, int]:
        place = self._slice_tracks.get(track)
        if place is None:
            if track in self._counter_tracks:
                raise ValueError(f"track {track} is a counter track: it takes only counter() samples")
            raise ValueError(f"event on undeclared track {track}")
        return place

    def _ts(self, ns: int) -> float:
        if ns < self._origin:
            raise ValueError(f"time {ns} is before time_origin_ns {self._origin}: trace_processor drops it")
        return (ns - self._origin) / 1000

    def _slice_event(self, phase: str, track: int, ts: int, name: str, args: Mapping[str, ArgValue] | None,
                     category: str | None, shared: SharedArgs | None,
                     flows: tuple[Sequence[int], Sequence[int], Sequence[int]], dur: int | None = None) -> None:
        pid, tid = self._place(track)
        us = self._ts(ts)
        event: dict[str, Any] = {"ph": phase, "pid": pid, "tid": tid, "ts": us, "name": name}
        if phase == "i":
            event["s"] = "t"
        if dur is not None:
            if dur < 0:
                raise ValueError(f"negative duration {dur} for {name!r} on track {track}")
            event["dur"] = dur / 1000
        if category is not None:
            event["cat"] = category
        if shared is not None:
            args = {**shared.args, **args} if args else shared.args
            (start, step, end), (shared_start, shared_step, shared_end) = flows, shared.flows
            flows = ((*start, *shared_start), (*step, *shared_step), (*end, *shared_end))
        if args:
            event["args"] = {k: v if v.__class__ in _SCALARS else arg_text(v) for k, v in args.items()}
        self._emit(event)
        for flow_phase, ids in zip(_FLOW_PHASES, flows):
            for flow in ids:
                flow_event = {"ph": flow_phase, "pid": pid, "tid": tid, "ts": us, "id": flow,
                              "cat": FLOW_CATEGORY, "name": FLOW_NAME, "bp": "e"}
                self._emit(flow_event)
        self._flows += len(flows[0])

    def begin(self, track: int, ts: int, name: str, args: Mapping[str, ArgValue] | None = None, *,
              category: str | None = None, shared: SharedArgs | None = None, flow_start: Sequence[int] = (),
              flow_step: Sequence[int] = (), flow_end: Sequence[int] = ()) -> None:
        self._slice_event("B", track, ts, name, args, category, shared, (flow_start, flow_step, flow_end))
        self._open[track] += 1
        self._slices += 1

    def end(self, track: int, ts: int) -> None:
        pid, tid = self._place(track)
        if not self._open[track]:
            raise ValueError(f"end() on track {track} with no open slice")
        self._open[track] -= 1
        self._emit({"ph": "E", "pid": pid, "tid": tid, "ts": self._ts(ts)})

    def complete(self, track: int, ts: int, dur: int, name: str, args: Mapping[str, ArgValue] | None = None,
                 *, category: str | None = None, shared: SharedArgs | None = None, flow_start: Sequence[int] = (),
                 flow_step: Sequence[int] = (), flow_end: Sequence[int] = ()) -> None:
        self._slice_event("X", track, ts, name, args, category, shared, (flow_start, flow_step, flow_end), dur)
        self._slices += 1

    def events(self, track: int, items: Iterable[EventItem]) -> None:
        for ts, end, name, args, category, shared, (flow_start, flow_step, flow_end) in items:
            if end is None:
                self.instant(track, ts, name, args, category=category, shared=shared, flow_start=flow_start,
                             flow_step=flow_step, flow_end=flow_end)
            else:
                self.complete(track, ts, end - ts, name, args, category=category, shared=shared,
                              flow_start=flow_start, flow_step=flow_step, flow_end=flow_end)

    def instant(self, track: int, ts: int, name: str, args: Mapping[str, ArgValue] | None = None, *,
                category: str | None = None, shared: SharedArgs | None = None, flow_start: Sequence[int] = (),
                flow_step: Sequence[int] = (), flow_end: Sequence[int] = ()) -> None:
        self._slice_event("i", track, ts, name, args, category, shared, (flow_start, flow_step, flow_end))
        self._instants += 1

    def counter(self, track: int, ts: int, value: int | float) -> None:
        place = self._counter_tracks.get(track)
        if place is None:
            if track in self._slice_tracks:
                raise ValueError(f"track {track} is not a counter track: counter() needs counter_track()")
            raise ValueError(f"counter on undeclared track {track}")
        pid, name = place
        if value.__class__ is bool:
            value = int(value)
        self._emit({"ph": "C", "pid": pid, "ts": self._ts(ts), "name": name, "args": {"value": value}})
        self._counters += 1

    # --- output ---------------------------------------------------------------------------------------------

    def _emit(self, event: dict[str, Any]) -> None:
        if self._stats is not None:
            raise ValueError("the writer is closed")
        try:
            line = orjson.dumps(event)
        except TypeError:  # ints beyond 64 bits: keep their digits as text
            line = orjson.dumps(_sanitized(event))
        self._lines.append(line)
        self._pending_bytes += len(line)
        if self._pending_bytes >= _CHUNK_BYTES:
            self._write_lines()

    def _write_lines(self) -> None:
        if not self._lines:
            return
        text = b",\n".join(self._lines)
        self._write(text if self._first else b",\n" + text)
        self._first = False
        self._lines.clear()
        self._pending_bytes = 0

    def _write(self, data: bytes) -> None:
        if self._pool is None:
            self._file.write(data)
            return
        if self._inflight is not None:
            self._inflight.result()  # one chunk in flight at most; errors surface here
        self._inflight = self._pool.submit(self._deflate, data)

    def _deflate(self, data: bytes) -> None:
        assert self._gzip is not None
        self._file.write(self._gzip.compress(data))

    def close(self) -> WriteStats:
        """Finish the JSON document and close the file."""
        if self._stats is not None:
            return self._stats
        try:
            self._write_lines()
            self._write(b"\n]}\n")
            if self._pool is not None:
                assert self._inflight is not None and self._gzip is not None
                self._inflight.result()
                self._file.write(self._gzip.flush())
        finally:  # closed even when writing failed: later events raise, close() returns this
            if self._pool is not None:
                self._pool.shutdown(wait=True)
            self._file.close()
            self._stats = WriteStats(path=self._path, bytes=os.path.getsize(self._path), slices=self._slices,
                                     unclosed=sum(self._open.values()), instants=self._instants,
                                     counters=self._counters, flows=self._flows)
        return self._stats


def _sanitized(value: Any) -> Any:
    """``value`` with ints orjson cannot write (beyond 64 bits) turned into their digits."""
    if isinstance(value, dict):
        return {k: _sanitized(v) for k, v in value.items()}
    if isinstance(value, int) and not isinstance(value, bool) and not -(1 << 63) <= value < (1 << 64):
        return str(value)
    return value
