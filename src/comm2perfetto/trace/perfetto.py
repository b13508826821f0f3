"""Perfetto protobuf trace writer (``.pftrace``): hand-encoded TrackEvent packets, interned, streamed.

The file is a ``perfetto.protos.Trace``: a run of ``packet`` fields (field 1), each a TracePacket::

    0a <len> TracePacket{ 40 <timestamp ns>  50 01 (trusted_packet_sequence_id 1)  68 02 (sequence_flags)
                          62 <len> InternedData{...}   (only when this packet introduces new iids)
                          5a <len> TrackEvent{ 48 <type>  58 <track_uuid>  50 <name_iid>  18 <category_iid>
                                               22 <len> DebugAnnotation{ 08 <name_iid>  20 <int> | ... } ... } }

With ``compress=True`` about 1 MiB of such ``packet`` fields at a time is deflated (zlib format, one stream)
into one outer ``TracePacket.compressed_packets`` (field 50), exactly what the Perfetto tracing service does
(src/tracing/service/zlib_compressor.cc); trace_processor and ui.perfetto.dev inflate it
(src/trace_processor/importers/proto/proto_trace_tokenizer.h).

Everything is on one packet sequence (``trusted_packet_sequence_id`` 1) so that the interned names and strings
are shared by every rank: the first packet sets SEQ_INCREMENTAL_STATE_CLEARED, every packet that refers to
an iid sets SEQ_NEEDS_INCREMENTAL_STATE, and the InternedData entry of an iid rides in the packet that first
uses it. Timestamps are absolute ns in trace time (no ``timestamp_clock_id``).

Ordering, as trace_processor and the UI implement it (google/perfetto, track_descriptor.proto,
importers/proto/track_event_tracker.cc, stdlib viz/summary/track_event.sql, UI plugins
dev.perfetto.ProcessThreadGroups and dev.perfetto.TrackEvent):

- Processes: a TrackDescriptor for the root track (uuid 0) with ``process_ordering = PROCESS_ORDERING_EXPLICIT``
  makes trace_processor copy each process track's ``sibling_order_rank`` into the process's
  ``process_sort_index_hint``, which the UI sorts process groups by. ``sort_index`` becomes that rank.
- Tracks inside a process: ``child_ordering`` of a *process* track is ignored (tracks parented to a process
  track are not nested under it and the UI sorts them by name). ``child_ordering = EXPLICIT`` with the
  children's ``sibling_order_rank`` is honoured on an ordinary track. So by default (``group_tracks=True``)
  each process with tracks gets one intermediate "group" track (uuid ``1 << 63 | process uuid``, named like
  the process) holding its tracks in ``sort_index`` order: one more level to expand in the UI, the same in
  every process. ``group_tracks=False``: tracks sit right in the process, in name order.
  ``group_tracks=None``: per process, a group only when the names of its tracks would not sort into
  ``sort_index`` order, decided at the first event on one of its tracks (so declare a process's tracks
  before its events). ``check.read_trace`` folds group tracks away.
- Slice tracks use ``sibling_merge_behavior = NONE``: each declared track stays its own track in the UI
  instead of being merged with a same-named sibling.
"""

from __future__ import annotations

import itertools
import numbers
import os
import struct
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, BinaryIO

from .protobuf import (
    GROUPS14,
    MASK64,
    SMALL,
    VARINTS,
    field_bytes,
    field_string,
    field_varint,
    pack_double,
    varint,
)
from .sink import NO_FLOWS, ArgValue, EventItem, SharedArgs, WriteStats, arg_text

# Compressed chunks hold about this much encoded packet data. zlib's window is 32 KiB, so bigger chunks
# barely compress better; 1 MiB keeps the per-chunk overhead negligible and the reader's buffers small.
CHUNK_BYTES = 1 << 20
# zlib level 2, measured on the slices of a 64-rank merge (bench_merge's dumps, 138 bytes a slice before
# compression): 0.54 us and 17.6 bytes a slice; level 1 costs as much for 20.9 bytes, level 5 twice the CPU
# (1.1 us) for 15.7, level 6 four times. Compression runs on a worker thread (zlib releases the GIL): with a
# spare core its cost hides behind encoding, without one (a busy machine) it adds to merge's time.
ZLIB_LEVEL = 2
# Caps on what is remembered: past them strings are written inline and caches start over.
INTERN_LIMIT = 1 << 20
CACHE_LIMIT = 1 << 16
_PARTS_LIMIT = 1 << 16  # pieces of packets gathered by events() before they go into the buffer
PER_NAME_CACHE = 1 << 12
GROUP_UUID_BIT = 1 << 63
_NO_HIGH = object()

# TracePacket fields (protos/perfetto/trace/trace_packet.proto).
_PACKET = b"\x0a"  # Trace.packet = 1, length-delimited
_TS = b"\x40"  # timestamp = 8
_SEQ = field_varint(10, 1)  # trusted_packet_sequence_id = 10
_SEQ_CLEARED = _SEQ + field_varint(13, 1)  # sequence_flags = 13: SEQ_INCREMENTAL_STATE_CLEARED
_SEQ_NEEDS = _SEQ + field_varint(13, 2)  # SEQ_NEEDS_INCREMENTAL_STATE
_INTERNED = b"\x62"  # interned_data = 12
_TRACK_EVENT = b"\x5a"  # track_event = 11
_SEQ_NEEDS_TE = _SEQ_NEEDS + _TRACK_EVENT
_COMPRESSED = varint(50 << 3 | 2)  # compressed_packets = 50
_TRACK_DESCRIPTOR = 60
_CLOCK_SNAPSHOT = 6

# TrackEvent fields (protos/perfetto/trace/track_event/track_event.proto).
_TYPE_BEGIN = field_varint(9, 1)
_TYPE_END = field_varint(9, 2)
_TYPE_INSTANT = field_varint(9, 3)
_TYPE_COUNTER = field_varint(9, 4)
_TRACK_UUID = 11
_NAME_IID = 10
_NAME_INLINE = 23
_CATEGORY_IID = 3
_CATEGORY_INLINE = 22
_ANNOTATION = b"\x22"  # debug_annotations = 4
_COUNTER_INT = varint(30 << 3)  # counter_value = 30, int64
_COUNTER_DOUBLE = varint(44 << 3 | 1)  # double_counter_value = 44
# flow_ids = 47 and terminating_flow_ids = 48, fixed64: their two tag bytes read as a little-endian u16,
# so that one struct call writes tag and id.
_FLOW = int.from_bytes(varint(47 << 3 | 1), "little")
_FLOW_END = int.from_bytes(varint(48 << 3 | 1), "little")
_pack_flow = struct.Struct("<HQ").pack

# DebugAnnotation fields.
_ANN_NAME_IID = 1
_ANN_NAME_INLINE = 10
_ANN_BOOL = (b"\x10\x00", b"\x10\x01")  # bool_value = 2
_ANN_UINT = b"\x18"  # uint_value = 3
_ANN_INT = b"\x20"  # int_value = 4
_ANN_DOUBLE = b"\x29"  # double_value = 5
_ANN_STRING = 6
_ANN_STRING_IID = varint(17 << 3)  # string_value_iid = 17

# InternedData fields: event_categories = 1, event_names = 2, debug_annotation_names = 3,
# debug_annotation_string_values = 29; each entry is {iid = 1, name/str = 2}.
_I_CATEGORY, _I_NAME, _I_ANN_NAME, _I_STRING = 1, 2, 3, 29

# TrackDescriptor fields (protos/perfetto/trace/track_event/track_descriptor.proto).
_TD_UUID, _TD_NAME, _TD_PROCESS, _TD_PARENT, _TD_COUNTER = 1, 2, 3, 5, 8
_TD_CHILD_ORDERING, _TD_RANK, _TD_DESCRIPTION, _TD_MERGE, _TD_PROCESS_ORDERING = 11, 12, 14, 15, 19
_EXPLICIT = 3  # ChildTracksOrdering.EXPLICIT
_PROCESS_ORDERING_EXPLICIT = 1
_MERGE_NONE = 2  # SiblingMergeBehavior.SIBLING_MERGE_BEHAVIOR_NONE
_COUNTER_UNITS = {"ns": 1, "count": 2, "bytes": 3}  # CounterDescriptor.Unit; others go to unit_name = 6

_BUILTIN_CLOCK_REALTIME, _BUILTIN_CLOCK_BOOTTIME = 1, 6

_INT64_MIN, _INT64_END, _UINT64_END = -(1 << 63), 1 << 63, 1 << 64
_CACHED_INT = 1 << 32  # ints with |v| below this get their encoded annotation cached


@dataclass
class _Process:
    uuid: int
    pid: int
    name: str
    description: str | None
    sort_index: int | None


@dataclass
class _Track:
    uuid: int
    parent: int
    name: str
    description: str | None
    sort_index: int | None
    unit: str | None
    counter: bool


# Packet tag + length, and timestamp tag + low 14 bits, looked up (see protobuf.GROUPS14).
_PACKET_SIZE = [_PACKET + v for v in VARINTS]
_TS_LOW = [_TS + g for g in GROUPS14]
_BEGIN_HEADS: dict[int, list[bytes]] = {}  # by timestamp length: see PerfettoWriter._timestamp_range


def _track_event(parts: bytes) -> bytes:
    return _TRACK_EVENT + varint(len(parts)) + parts


class PerfettoWriter:
    """Writes a ``TraceSink`` stream as a Perfetto protobuf trace.

    ``path_or_binary_file`` is a path (created or truncated; an unwritable path raises ``OSError`` here)
    or a binary file object (left open by ``close()``). ``realtime_anchor_ns``: write a ClockSnapshot that
    says trace time equals ``CLOCK_REALTIME`` (the times given are realtime ns), so the UI can show
    wall-clock time. On one track, call events in start-time order, parents before children.
    """

    __slots__ = ("_ann_name_iids", "_ann_names", "_args_cache", "_args_lookup", "_begin_entries", "_buf",
                 "_cached_per_name", "_category_iids", "_counter_heads", "_counters", "_end_tails",
                 "_file", "_float_prefix", "_flows", "_group_tracks", "_grouped", "_groups", "_high",
                 "_high_begin", "_high_bytes", "_inflight", "_instant_entries", "_instants", "_int_prefixes",
                 "_level", "_name_iids", "_open", "_owns_file", "_path", "_pending", "_pool", "_processes",
                 "_shared_lookup", "_slice_uuid", "_slices", "_stats", "_string_iids", "_tracks", "_ts_len",
                 "_typed_cache", "_waiting", "_written")

    def __init__(self, path_or_binary_file: str | os.PathLike[str] | BinaryIO, *, compress: bool = True,
                 realtime_anchor_ns: int | None = None, group_tracks: bool | None = True,
                 zlib_level: int = ZLIB_LEVEL) -> None:
        if isinstance(path_or_binary_file, (str, os.PathLike)):
            self._path = os.fspath(path_or_binary_file)
            self._file: BinaryIO = open(self._path, "wb")
            self._owns_file = True
        else:
            self._path = str(getattr(path_or_binary_file, "name", "<stream>"))
            self._file = path_or_binary_file
            self._owns_file = False
        self._level = zlib_level
        self._group_tracks = group_tracks
        self._buf = bytearray()
        self._written = 0
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pftrace-writer") if compress else None
        self._inflight: Future[None] | None = None
        self._stats: WriteStats | None = None
        # Timestamps: the high part (ts >> 28) last seen, its varint, and tag + whole timestamp length.
        self._high: object = _NO_HIGH  # equal to no int: the first timestamp takes the slow path
        self._high_bytes = b""
        self._high_begin = b""
        self._ts_len = 0

        # Declarations (see the module docstring on ordering): whether each process's tracks sit in a group
        # track (absent: not decided yet), the processes whose group track is written, and (group_tracks=None)
        # the tracks waiting for that decision.
        self._processes: dict[int, _Process] = {}
        self._tracks: dict[int, _Track] = {}
        self._grouped: dict[int, bool] = {}
        self._groups: set[int] = set()
        self._waiting: dict[int, list[_Track]] = {}
        # Per writable track: encoded ``track_uuid`` field, the END packet after its timestamp, open BEGINs;
        # per counter track: the TrackEvent fields before the value.
        self._slice_uuid: dict[int, bytes] = {}
        self._end_tails: dict[int, bytes] = {}
        self._open: dict[int, int] = {}
        self._counter_heads: dict[int, bytes] = {}

        # Interning: iids per string, per kind; InternedData entries waiting for the next event packet.
        self._name_iids: dict[str, int] = {}
        self._category_iids: dict[str, int] = {}
        self._ann_name_iids: dict[str, int] = {}
        self._string_iids: dict[str, int] = {}
        self._pending = bytearray()
        # Encoded pieces. (track, name, category) -> (TrackEvent type/track/name/category fields, END tail);
        # arg name -> DebugAnnotation name field, or the start of a double annotation;
        # (arg name, value) -> whole debug_annotations field (see _annotation on which values go where).
        self._begin_entries: dict[tuple[int, str, str | None], tuple[bytes, bytes]] = {}
        self._instant_entries: dict[tuple[int, str, str | None], tuple[bytes, bytes]] = {}
        self._ann_names: dict[str, bytes] = {}
        self._float_prefix: dict[str, bytes] = {}
        self._args_cache = _ArgCache()
        self._args_cache.encode = self._encode_arg
        self._args_lookup = self._args_cache.__getitem__
        shared_cache = _SharedCache()
        shared_cache.encode = self._encode_shared
        self._shared_lookup = shared_cache.__getitem__
        self._typed_cache: dict[tuple[str, Any, type], bytes] = {}
        self._cached_per_name: dict[str, int] = {}
        self._int_prefixes: dict[str, list[bytes]] = {}

        self._slices = self._instants = self._counters = self._flows = 0

        first_flags = _SEQ_CLEARED
        if realtime_anchor_ns is not None:
            clocks = b"".join(field_bytes(1, field_varint(1, clock) + field_varint(2, realtime_anchor_ns))
                              for clock in (_BUILTIN_CLOCK_BOOTTIME, _BUILTIN_CLOCK_REALTIME))
            self._packet(_TS + varint(realtime_anchor_ns) + first_flags + field_bytes(_CLOCK_SNAPSHOT, clocks))
            first_flags = _SEQ
        root = field_varint(_TD_UUID, 0) + field_varint(_TD_PROCESS_ORDERING, _PROCESS_ORDERING_EXPLICIT)
        self._packet(first_flags + field_bytes(_TRACK_DESCRIPTOR, root))

    # --- declarations ---------------------------------------------------------------------------------------

    def process(self, uuid: int, pid: int, name: str, *, description: str | None = None,
                sort_index: int | None = None) -> None:
        self._check_new_uuid(uuid, sort_index)
        proc = _Process(uuid, pid, name, description, sort_index)
        self._processes[uuid] = proc
        self._write_process(proc)
        if self._group_tracks is not None:
            self._grouped[uuid] = self._group_tracks

    def track(self, uuid: int, parent: int, name: str, *, sort_index: int | None = None,
              description: str | None = None) -> None:
        self._declare_track(_Track(uuid, parent, name, description, sort_index, None, False))

    def counter_track(self, uuid: int, parent: int, name: str, *, unit: str | None = None,
                      sort_index: int | None = None) -> None:
        self._declare_track(_Track(uuid, parent, name, None, sort_index, unit, True))

    def _check_new_uuid(self, uuid: int, sort_index: int | None) -> None:
        if self._stats is not None:
            raise ValueError("the writer is closed")
        if sort_index is not None and not -(1 << 31) <= sort_index < 1 << 31:
            raise ValueError(f"sort_index {sort_index} does not fit Perfetto's int32 sibling_order_rank")
        if not isinstance(uuid, int) or not 0 < uuid < GROUP_UUID_BIT:
            raise ValueError(f"track uuid must be an int in 1 .. 2**63-1, got {uuid!r}")
        if uuid in self._processes or uuid in self._tracks:
            raise ValueError(f"track uuid {uuid} declared twice")

    def _declare_track(self, track: _Track) -> None:
        self._check_new_uuid(track.uuid, track.sort_index)
        if track.parent not in self._processes:
            raise ValueError(f"track {track.uuid} ({track.name!r}): parent {track.parent} is not a declared process")
        self._tracks[track.uuid] = track
        if track.parent in self._grouped:
            self._write_track(track)
        else:
            self._waiting.setdefault(track.parent, []).append(track)

    def _decide(self, process: int) -> None:
        """group_tracks=None: group this process's tracks or not, now; write the tracks waiting for that."""
        tracks = self._waiting.pop(process, [])
        self._grouped[process] = self._names_misordered(tracks)
        for track in tracks:
            self._write_track(track)

    @staticmethod
    def _names_misordered(tracks: list[_Track]) -> bool:
        """Would the UI's by-name order of these sibling tracks differ from their ``sort_index`` order?"""
        children = sorted(tracks, key=lambda t: t.sort_index or 0)  # stable: ties keep declaration order
        # The UI orders with SQL ``ORDER BY name`` (bytewise UTF-8 = Python's code point order); equal
        # names have no defined order, so they count as misordered too.
        return any(a.name >= b.name for a, b in itertools.pairwise(children))

    def _write_process(self, proc: _Process) -> None:
        body = field_varint(_TD_UUID, proc.uuid) + field_string(_TD_NAME, proc.name)
        body += field_bytes(_TD_PROCESS, field_varint(1, proc.pid) + field_string(6, proc.name))
        if proc.description is not None:
            body += field_string(_TD_DESCRIPTION, proc.description)
        if proc.sort_index is not None:
            body += field_varint(_TD_RANK, proc.sort_index)
        # Ignored for process tracks by today's UI (see the module docstring), kept as the stated intent.
        body += field_varint(_TD_CHILD_ORDERING, _EXPLICIT)
        self._packet(_SEQ + field_bytes(_TRACK_DESCRIPTOR, body))
        self._register(proc.uuid, counter=False)

    def _write_group(self, proc: _Process) -> int:
        uuid = GROUP_UUID_BIT | proc.uuid
        body = field_varint(_TD_UUID, uuid) + field_varint(_TD_PARENT, proc.uuid)
        body += field_string(_TD_NAME, proc.name) + field_varint(_TD_CHILD_ORDERING, _EXPLICIT)
        body += field_varint(_TD_MERGE, _MERGE_NONE)
        self._packet(_SEQ + field_bytes(_TRACK_DESCRIPTOR, body))
        self._groups.add(proc.uuid)
        return uuid

    def _write_track(self, track: _Track) -> None:
        parent = track.parent
        if self._grouped[parent]:
            parent = GROUP_UUID_BIT | parent if parent in self._groups else self._write_group(self._processes[parent])
        body = field_varint(_TD_UUID, track.uuid) + field_varint(_TD_PARENT, parent)
        body += field_string(_TD_NAME, track.name)
        if track.description is not None:
            body += field_string(_TD_DESCRIPTION, track.description)
        if track.sort_index is not None:
            body += field_varint(_TD_RANK, track.sort_index)
        if track.counter:
            unit = b""
            if track.unit in _COUNTER_UNITS:
                unit = field_varint(3, _COUNTER_UNITS[track.unit])
            elif track.unit is not None:
                unit = field_string(6, track.unit)
            body += field_bytes(_TD_COUNTER, unit)
        else:
            body += field_varint(_TD_MERGE, _MERGE_NONE)
        self._packet(_SEQ + field_bytes(_TRACK_DESCRIPTOR, body))
        self._register(track.uuid, counter=track.counter)

    def _register(self, uuid: int, *, counter: bool) -> None:
        uuid_field = field_varint(_TRACK_UUID, uuid)
        if counter:
            self._counter_heads[uuid] = _TYPE_COUNTER + uuid_field
        else:
            self._slice_uuid[uuid] = uuid_field
            self._end_tails[uuid] = _SEQ + _track_event(_TYPE_END + uuid_field)
            self._open[uuid] = 0

    def _unknown_track(self, track: int, *, counter: bool) -> bytes:
        """Slow path of events: write a process's waiting tracks at its first event, else explain the error."""
        if self._stats is not None:
            raise ValueError("the writer is closed")
        declared = self._tracks.get(track)
        if declared is not None and declared.parent in self._waiting:
            self._decide(declared.parent)
            found = (self._counter_heads if counter else self._slice_uuid).get(track)
            if found is not None:
                return found
        if track in self._processes or track in self._tracks:
            if counter:
                raise ValueError(f"track {track} is not a counter track: counter() needs counter_track()")
            raise ValueError(f"track {track} is a counter track: it takes only counter() samples")
        raise ValueError(f"event on undeclared track {track}")

    # --- events ---------------------------------------------------------------------------------------------
    #
    # The hot path (``events``). Per event: one dict lookup gives the encoded type + track + name + category
    # fields (and validates the track), one more the shared args' annotations, one per own arg its
    # annotation, one the flow fields, all already encoded; the packet is joined from pieces. Timestamps of
    # the same ~0.27 s share their high varint bytes (``_high_bytes``); the low 28 bits come from a table.
    # Everything else goes through slower methods that fill these caches.

    def begin(self, track: int, ts: int, name: str, args: Mapping[str, ArgValue] | None = None, *,
              category: str | None = None, shared: SharedArgs | None = None, flow_start: Sequence[int] = (),
              flow_step: Sequence[int] = (), flow_end: Sequence[int] = ()) -> None:
        entry = self._begin_entries.get((track, name, category))
        if entry is None:
            entry = self._slice_entry(self._begin_entries, _TYPE_BEGIN, track, name, category)
        event = entry[0]
        if shared is not None or args or flow_start or flow_step or flow_end:
            event += self._extras(shared, args, flow_start, flow_step, flow_end)
        self._write_event(ts, event)
        self._open[track] += 1
        self._slices += 1

    def end(self, track: int, ts: int) -> None:
        tail = self._end_tails.get(track)
        if tail is None:
            self._unknown_track(track, counter=False)
            tail = self._end_tails[track]
        depth = self._open[track]
        if not depth:
            raise ValueError(f"end() on track {track} with no open slice")
        self._open[track] = depth - 1
        self._write_end(ts, tail)

    def complete(self, track: int, ts: int, dur: int, name: str, args: Mapping[str, ArgValue] | None = None,
                 *, category: str | None = None, shared: SharedArgs | None = None, flow_start: Sequence[int] = (),
                 flow_step: Sequence[int] = (), flow_end: Sequence[int] = ()) -> None:
        entry = self._begin_entries.get((track, name, category))
        if entry is None:
            entry = self._slice_entry(self._begin_entries, _TYPE_BEGIN, track, name, category)
        if dur < 0:
            raise ValueError(f"negative duration {dur} for {name!r} on track {track}")
        event, tail = entry
        if shared is not None or args or flow_start or flow_step or flow_end:
            event += self._extras(shared, args, flow_start, flow_step, flow_end)
        end = ts + dur
        high = ts >> 28
        size = len(event)
        if high == self._high and end >> 28 == high and size < 16000 and not self._pending:
            # BEGIN then END, both inline, as events() writes them.
            ts_len = self._ts_len
            low, end_low = ts & 0xFFFFFFF, end & 0xFFFFFFF
            buf = self._buf
            buf += b"".join((
                _PACKET_SIZE[ts_len + 6 + size if size < 128 else ts_len + 7 + size], _TS_LOW[low & 0x3FFF],
                GROUPS14[low >> 14], self._high_begin, VARINTS[size], event,
                _PACKET_SIZE[ts_len + len(tail)], _TS_LOW[end_low & 0x3FFF], GROUPS14[end_low >> 14],
                self._high_bytes, tail))
            if len(buf) >= CHUNK_BYTES:
                self._flush()
        else:
            self._write_event(ts, event)
            self._write_end(end, tail)
        self._slices += 1

    def events(self, track: int, items: Iterable[EventItem]) -> None:
        # The hot loop of a big merge (2M slices): everything it needs is in locals, and the packets go to
        # ``parts``, joined into the buffer in bulk. BEGIN then END, both inline: the END follows its BEGIN at
        # once, which pairs right because trace_processor sorts by (ts, file order) and slices on one track
        # come in start-time order, parents first.
        entries, pending = self._begin_entries, self._pending
        shared_lookup, args_lookup = self._shared_lookup, self._args_lookup
        base, limit, heads = self._timestamp_range()
        high_begin, high_bytes, ts_len = self._high_begin, self._high_bytes, self._ts_len
        tail = end_head = end_rest = b""  # the track's END packet: its head and what follows the low ts bytes
        parts: list[bytes] = []
        slices = started = 0
        try:
            for ts, end, name, args, category, shared, flows in items:
                if end is None:
                    self._write_parts(parts)
                    self.instant(track, ts, name, args, category=category, shared=shared, flow_start=flows[0],
                                 flow_step=flows[1], flow_end=flows[2])
                    continue
                entry = entries.get((track, name, category))
                if entry is None:
                    entry = self._slice_entry(entries, _TYPE_BEGIN, track, name, category)
                if end < ts:
                    raise ValueError(f"negative duration {end - ts} for {name!r} on track {track}")
                event = entry[0]
                if entry[1] is not tail:
                    tail = entry[1]
                    end_head, end_rest = _PACKET_SIZE[ts_len + len(tail)], high_bytes + tail
                if shared is not None:
                    event += shared_lookup(shared)
                    started += shared.starts
                if args:
                    head = event
                    try:
                        for item in args.items():  # for the usual one or two, faster than join(map())
                            event += args_lookup(item)
                    except TypeError:  # an unhashable value (a list)
                        event = head + self._args_uncached(args)
                if flows is not NO_FLOWS:
                    event += _flow_fields(*flows)
                    started += len(flows[0])
                size = len(event)
                if base <= ts and end < limit and size < 16000 and not pending:
                    low, end_low = ts - base, end - base
                    parts += (heads[size], _TS_LOW[low & 0x3FFF], GROUPS14[low >> 14], high_begin, VARINTS[size],
                              event, end_head, _TS_LOW[end_low & 0x3FFF], GROUPS14[end_low >> 14], end_rest)
                    if len(parts) >= _PARTS_LIMIT:
                        self._write_parts(parts)
                else:  # a new high part of the timestamps, interned data to send first, or a huge event
                    self._write_parts(parts)
                    self._write_event(ts, event)
                    self._write_end(end, tail)
                    base, limit, heads = self._timestamp_range()
                    high_begin, high_bytes, ts_len = self._high_begin, self._high_bytes, self._ts_len
                    end_head, end_rest = _PACKET_SIZE[ts_len + len(tail)], high_bytes + tail
                slices += 1
        finally:
            self._write_parts(parts)
            self._slices += slices
            self._flows += started

    def _timestamp_range(self) -> tuple[int, int, list[bytes]]:
        """For events(): the times the cached high part covers, [base, limit) (empty if none), and the packet
        head (tag and length) of a BEGIN there, by the length of its TrackEvent."""
        if self._high is _NO_HIGH:
            return 0, 0, []
        base = self._high << 28  # type: ignore[operator]
        heads = _BEGIN_HEADS.get(self._ts_len)
        if heads is None:  # ts, sequence fields, TrackEvent tag, its length, the TrackEvent
            heads = _BEGIN_HEADS[self._ts_len] = [_PACKET_SIZE[self._ts_len + 5 + len(VARINTS[size]) + size]
                                                  for size in range(16000)]
        return base, base + (1 << 28), heads

    def _write_parts(self, parts: list[bytes]) -> None:
        if parts:
            self._buf += b"".join(parts)
            parts.clear()
            if len(self._buf) >= CHUNK_BYTES:
                self._flush()

    def instant(self, track: int, ts: int, name: str, args: Mapping[str, ArgValue] | None = None, *,
                category: str | None = None, shared: SharedArgs | None = None, flow_start: Sequence[int] = (),
                flow_step: Sequence[int] = (), flow_end: Sequence[int] = ()) -> None:
        entry = self._instant_entries.get((track, name, category))
        if entry is None:
            entry = self._slice_entry(self._instant_entries, _TYPE_INSTANT, track, name, category)
        event = entry[0]
        if shared is not None or args or flow_start or flow_step or flow_end:
            event += self._extras(shared, args, flow_start, flow_step, flow_end)
        self._write_event(ts, event)
        self._instants += 1

    def counter(self, track: int, ts: int, value: int | float) -> None:
        head = self._counter_heads.get(track)
        if head is None:
            self._unknown_track(track, counter=True)
            head = self._counter_heads[track]
        kind = value.__class__
        if kind is float:
            event = head + _COUNTER_DOUBLE + pack_double(value)
        elif kind is int or isinstance(value, numbers.Integral):
            event = head + _COUNTER_INT + varint(int(value))
        else:
            event = head + _COUNTER_DOUBLE + pack_double(float(value))
        self._write_event(ts, event, _SEQ + _TRACK_EVENT)
        self._counters += 1

    def _timestamp(self, ts: int) -> bytes:
        """The varint of ``ts`` when its high part is not the cached one; caches the new high part."""
        if not 0 <= ts < _UINT64_END:
            raise ValueError(f"timestamp {ts} is not an unsigned 64-bit ns count" if ts > 0 else
                             f"negative timestamp {ts}")
        high = ts >> 28
        if high == 0:  # before 0.27 s: tests and toy traces; no caching
            return varint(ts)
        self._high, self._high_bytes = high, varint(high)
        self._high_begin = self._high_bytes + _SEQ_NEEDS_TE
        self._ts_len = 1 + 4 + len(self._high_bytes)  # tag + low 4 bytes + high bytes
        low = ts & 0xFFFFFFF
        return GROUPS14[low & 0x3FFF] + GROUPS14[low >> 14] + self._high_bytes

    def _write_event(self, ts: int, event: bytes, head: bytes = b"") -> None:
        """One TracePacket around the TrackEvent body ``event`` (BEGIN/INSTANT unless ``head`` is given)."""
        if ts >> 28 == self._high:
            low = ts & 0xFFFFFFF
            ts_bytes = GROUPS14[low & 0x3FFF] + GROUPS14[low >> 14] + self._high_bytes
        else:
            ts_bytes = self._timestamp(ts)
        if not head:
            head = _SEQ_NEEDS_TE
            if self._pending:
                head = _SEQ_NEEDS + _INTERNED + varint(len(self._pending)) + self._pending + _TRACK_EVENT
                self._pending.clear()
        size = varint(len(event))
        packet = 1 + len(ts_bytes) + len(head) + len(size) + len(event)
        buf = self._buf
        buf += b"".join((_PACKET, varint(packet), _TS, ts_bytes, head, size, event))
        if len(buf) >= CHUNK_BYTES:
            self._flush()

    def _write_end(self, ts: int, tail: bytes) -> None:
        if ts >> 28 == self._high:
            low = ts & 0xFFFFFFF
            ts_bytes = GROUPS14[low & 0x3FFF] + GROUPS14[low >> 14] + self._high_bytes
        else:
            ts_bytes = self._timestamp(ts)
        buf = self._buf
        buf += b"".join((_PACKET, varint(1 + len(ts_bytes) + len(tail)), _TS, ts_bytes, tail))
        if len(buf) >= CHUNK_BYTES:
            self._flush()

    def _slice_entry(self, cache: dict[tuple[int, str, str | None], tuple[bytes, bytes]], type_field: bytes,
                     track: int, name: str, category: str | None) -> tuple[bytes, bytes]:
        """(TrackEvent type + track + name + category fields, END packet tail) for a (track, name, category)."""
        uuid_field = self._slice_uuid.get(track)
        if uuid_field is None:
            uuid_field = self._unknown_track(track, counter=False)
        entry = (type_field + uuid_field + self._event_names(name, category), self._end_tails[track])
        if len(cache) >= CACHE_LIMIT:
            cache.clear()
        cache[(track, name, category)] = entry
        return entry

    def _extras(self, shared: SharedArgs | None, args: Mapping[str, ArgValue] | None, flow_start: Sequence[int],
                flow_step: Sequence[int], flow_end: Sequence[int]) -> bytes:
        """The debug annotations and flow fields of one event, encoded."""
        out = b""
        if args:
            try:
                out = b"".join(map(self._args_lookup, args.items()))
            except TypeError:  # an unhashable value (a list)
                out = self._args_uncached(args)
        if shared is not None:
            out = self._shared_lookup(shared) + out
            self._flows += shared.starts
        if flow_start or flow_step or flow_end:
            out += _flow_fields(flow_start, flow_step, flow_end)
            if flow_start:
                self._flows += len(flow_start)
        return out

    def _args_uncached(self, args: Mapping[str, ArgValue]) -> bytes:
        return b"".join([self._annotation(key, value) for key, value in args.items()])

    # --- interning and debug annotations --------------------------------------------------------------------

    def _intern(self, table: dict[str, int], kind: int, text: str) -> int | None:
        """The iid of ``text`` (queued in InternedData on first use), or None once ``table`` is full."""
        iid = table.get(text)
        if iid is None:
            if len(table) >= INTERN_LIMIT:
                return None
            iid = table[text] = len(table) + 1
            self._pending += field_bytes(kind, field_varint(1, iid) + field_string(2, text))
        return iid

    def _event_names(self, name: str, category: str | None) -> bytes:
        if not isinstance(name, str) or not isinstance(category, (str, type(None))):
            raise TypeError(f"event name and category must be str, got {name!r}, {category!r}")
        iid = self._intern(self._name_iids, _I_NAME, name)
        fields = field_varint(_NAME_IID, iid) if iid is not None else field_string(_NAME_INLINE, name)
        if category is not None:
            cat = self._intern(self._category_iids, _I_CATEGORY, category)
            fields += field_varint(_CATEGORY_IID, cat) if cat is not None else field_string(_CATEGORY_INLINE, category)
        return fields

    def _encode_shared(self, shared: SharedArgs) -> bytes:
        """The debug annotations and flow fields of a ``SharedArgs`` not seen before."""
        if not isinstance(shared, SharedArgs):
            raise TypeError(f"shared must be a SharedArgs, got {shared!r}")
        try:
            args = b"".join(map(self._args_lookup, shared.args.items()))
        except TypeError:  # an unhashable value (a list)
            args = self._args_uncached(shared.args)
        return args + _flow_fields(*shared.flows)

    def _encode_arg(self, item: tuple[str, Any]) -> bytes:
        """An arg the cache does not hold (``_ArgCache.__missing__``)."""
        key, value = item
        if value.__class__ is int and 1 < value < _INT64_END:
            prefix = self._int_prefixes.get(key)
            if prefix is not None:
                # The common miss, an int never seen under this name (a skew, a timestamp): inline.
                value_bytes = VARINTS[value] if value < SMALL else \
                    GROUPS14[value & 0x3FFF] + VARINTS[value >> 14] if value < 1 << 28 else varint(value)
                encoded = prefix[len(value_bytes)] + value_bytes
                if value < _CACHED_INT and self._cached_per_name.get(key, 0) < PER_NAME_CACHE:
                    self._cache_arg(key, value, encoded)
                return encoded
        typed = self._typed_cache.get((key, value, value.__class__))
        if typed is not None:  # 0, 1 and bools: a lateness of 0 on every collective's first rank
            return typed
        return self._annotation(key, value)

    def _annotation_name(self, key: str) -> bytes:
        field = self._ann_names.get(key)
        if field is None:
            if not isinstance(key, str):
                raise TypeError(f"arg names must be str, got {key!r}")
            iid = self._intern(self._ann_name_iids, _I_ANN_NAME, key)
            field = field_varint(_ANN_NAME_IID, iid) if iid is not None else field_string(_ANN_NAME_INLINE, key)
            if len(self._ann_names) < CACHE_LIMIT:
                self._ann_names[key] = field
        return field

    def _annotation(self, key: str, value: Any) -> bytes:
        """A whole ``debug_annotations`` field for one arg; caches it where that is safe.

        ``_args_cache`` is keyed by the ``(name, value)`` item itself, and ``True == 1 == 1.0`` as dict
        keys. So only str values and ints other than 0 and 1 go in it (a bool can never hit an int entry),
        and a name seen with a float value stops caching ints (its cached ints are dropped). What is left:
        an integral float under a name whose earlier int values were cached may be written as that same int
        until the name's first non-integral float.
        """
        kind = value.__class__
        if kind is str:
            return self._annotation_str(key, value)
        if kind is int:
            return self._annotation_int(key, value)
        if kind is float:
            prefix = self._float_prefix.get(key)
            if prefix is None:
                name_field = self._annotation_name(key)
                prefix = _ANNOTATION + varint(len(name_field) + 9) + name_field + _ANN_DOUBLE
                self._float_prefix[key] = prefix
                self._args_cache.clear()  # drop this name's cached ints (see above)
                self._cached_per_name.clear()
            return prefix + pack_double(value)
        if kind is bool:
            encoded = self._typed_cache.get((key, value, kind))
            if encoded is None:
                encoded = _annotation(self._annotation_name(key) + _ANN_BOOL[value])
                if len(self._typed_cache) < CACHE_LIMIT:
                    self._typed_cache[(key, value, kind)] = encoded
            return encoded
        # Subclasses (IntEnum, str enums), numpy scalars, lists and tuples, anything else as its text.
        if isinstance(value, bool):
            return self._annotation(key, bool(value))
        if isinstance(value, numbers.Integral):
            return self._annotation_int(key, int(value))
        if isinstance(value, numbers.Real):
            return self._annotation(key, float(value))
        return self._annotation_str(key, str(arg_text(value)))

    def _cache_arg(self, key: str, value: str | int, encoded: bytes) -> None:
        # At most PER_NAME_CACHE values per arg name: an arg whose every value is new (a skew in ns) would
        # otherwise fill the cache and evict the values that do repeat (seq numbers, sizes).
        counts = self._cached_per_name
        count = counts.get(key, 0)
        if count >= PER_NAME_CACHE:
            return
        cache = self._args_cache
        if len(cache) >= CACHE_LIMIT:
            cache.clear()
            counts.clear()
            count = 0
        if not counts:  # names with float values never cache ints (see _annotation)
            counts.update(dict.fromkeys(self._float_prefix, PER_NAME_CACHE))
            if key in self._float_prefix and value.__class__ is not str:
                return
        counts[key] = count + 1
        cache[(key, value)] = encoded

    def _annotation_str(self, key: str, value: str) -> bytes:
        iid = self._intern(self._string_iids, _I_STRING, value)
        if iid is None:  # too many distinct strings: this one goes inline, uncached
            return _annotation(self._annotation_name(key) + field_string(_ANN_STRING, value))
        encoded = _annotation(self._annotation_name(key) + _ANN_STRING_IID + varint(iid))
        self._cache_arg(key, value, encoded)
        return encoded

    def _annotation_int(self, key: str, value: int) -> bytes:
        if value in (0, 1):
            encoded = self._typed_cache.get((key, value, int))
            if encoded is None:
                encoded = _annotation(self._annotation_name(key) + _ANN_INT + VARINTS[value])
                if len(self._typed_cache) < CACHE_LIMIT:
                    self._typed_cache[(key, value, int)] = encoded
            return encoded
        if _INT64_MIN <= value < _INT64_END:
            body = _ANN_INT + varint(value)
        elif 0 <= value < _UINT64_END:
            body = _ANN_UINT + varint(value)
        else:  # beyond 64 bits: keep every digit, as text
            return self._annotation_str(key, str(value))
        name_field = self._ann_names.get(key) or self._annotation_name(key)
        if key not in self._int_prefixes:
            # An int annotation is this prefix, chosen by the value's varint length, then the varint.
            self._int_prefixes[key] = [_ANNOTATION + VARINTS[len(name_field) + 1 + n] + name_field + _ANN_INT
                                       for n in range(11)]
        encoded = _ANNOTATION + VARINTS[len(name_field) + len(body)] + name_field + body
        # Seq numbers, sizes and ranks repeat across ranks; timestamps and other big values do not.
        if -_CACHED_INT < value < _CACHED_INT and key not in self._float_prefix:
            self._cache_arg(key, value, encoded)
        return encoded

    # --- output ---------------------------------------------------------------------------------------------

    def _packet(self, body: bytes) -> None:
        self._buf += _PACKET + varint(len(body)) + body

    def _flush(self) -> None:
        data, self._buf = self._buf, bytearray()
        if not data:
            return
        if self._pool is None:
            self._file.write(data)
            self._written += len(data)
            return
        if self._inflight is not None:
            self._inflight.result()  # at most one chunk in flight: bounded memory, errors surface here
        self._inflight = self._pool.submit(self._compress_and_write, data)

    def _compress_and_write(self, data: bytearray) -> None:
        """On the worker thread: one zlib stream of ``Trace.packet`` fields -> one compressed_packets packet."""
        deflated = zlib.compress(data, self._level)
        inner = _COMPRESSED + varint(len(deflated))
        out = _PACKET + varint(len(inner) + len(deflated)) + inner
        self._file.write(out)
        self._file.write(deflated)
        self._written += len(out) + len(deflated)

    def close(self) -> WriteStats:
        """Flush, wait for the last chunk and close the file (a file object given is flushed, left open)."""
        if self._stats is not None:
            return self._stats
        try:
            for process in list(self._waiting):
                self._decide(process)
            self._flush()
            if self._inflight is not None:
                self._inflight.result()
            self._file.flush()
        finally:  # closed even when writing failed (a full disk): later events raise, close() returns this
            if self._pool is not None:
                self._pool.shutdown(wait=True)
            if self._owns_file:
                self._file.close()
            self._stats = WriteStats(path=self._path, bytes=self._written, slices=self._slices,
                                     unclosed=sum(self._open.values()), instants=self._instants,
                                     counters=self._counters, flows=self._flows)
            for table in (self._begin_entries, self._instant_entries, self._slice_uuid, self._end_tails,
                          self._counter_heads):
                table.clear()  # every event now takes the slow path, which says the writer is closed
        return self._stats


class _ArgCache(dict[tuple[str, Any], bytes]):
    """(arg name, value) -> encoded debug_annotations field; a miss encodes (and maybe caches) the arg.

    ``map(cache.__getitem__, args.items())`` runs at C speed while every arg is known; ``__missing__`` costs
    one Python call only for the new ones.
    """

    __slots__ = ("encode",)
    encode: Callable[[tuple[str, Any]], bytes]

    def __missing__(self, item: tuple[str, Any]) -> bytes:
        return self.encode(item)


class _SharedCache(dict[SharedArgs, bytes]):
    """SharedArgs (by identity) -> its encoded annotations and flow fields; a miss encodes and keeps them."""

    __slots__ = ("encode",)
    encode: Callable[[SharedArgs], bytes]

    def __missing__(self, shared: SharedArgs) -> bytes:
        if len(self) >= CACHE_LIMIT:
            self.clear()
        encoded = self[shared] = self.encode(shared)
        return encoded


def _flow_fields(flow_start: Sequence[int], flow_step: Sequence[int], flow_end: Sequence[int]) -> bytes:
    """flow_ids for the flows an event starts or continues, terminating_flow_ids for those it ends."""
    fields = b""
    for flow in flow_start:
        fields += _pack_flow(_FLOW, flow & MASK64)
    for flow in flow_step:
        fields += _pack_flow(_FLOW, flow & MASK64)
    for flow in flow_end:
        fields += _pack_flow(_FLOW_END, flow & MASK64)
    return fields


def _annotation(body: bytes) -> bytes:
    return _ANNOTATION + varint(len(body)) + body
