"""Read back a trace this package wrote (Perfetto protobuf, Chrome JSON, gzipped JSON) and check its rules.

``read_trace(path)`` decodes by content, not by suffix: gzip magic ``1f 8b`` is inflated first; then a
first non-blank byte ``{`` or ``[`` means JSON, anything else a protobuf ``Trace`` (``compressed_packets``
inflated with zlib, recursively). ``check_trace(path)`` also raises ``TraceRuleError`` listing every broken
rule:

- protobuf: each TrackEvent's track is declared by an earlier packet, parents are declared; every iid
  (event names, categories, annotation names, annotation string values) resolves from interned data seen
  earlier on the packet's sequence after SEQ_INCREMENTAL_STATE_CLEARED, and such packets say
  SEQ_NEEDS_INCREMENTAL_STATE; counter events only on counter tracks, slice events never there;
- JSON: each pid has a ``process_name``, each tid with slices a ``thread_name`` (tid = pid is the process);
- both: slices on one track nest strictly in the order trace_processor replays them (protobuf: by ts, then
  file order; JSON: E first, then X longest first, then the rest in file order), no END (E) without a BEGIN
  (B), BEGINs never ended only where ``allow_unclosed`` says so (default: arg ``state == "stalled"``); every
  flow id is on at least two events and ends exactly once, on its latest event (JSON: one ``s`` first, one
  ``f`` last, each bound to a slice open on its pid/tid at its ts).

Decoded times are ns. JSON tracks get synthetic uuids (processes by pid, tracks by (pid, tid), counter
tracks by (pid, name)). Group tracks (see ``perfetto.PerfettoWriter``: a track with ``child_ordering`` that
only holds other tracks) are folded away: their children's ``parent`` is the group's parent.
"""

from __future__ import annotations

import bisect
import gzip
import os
import zlib
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from comm2perfetto.errors import Comm2PerfettoError

MAX_SHOWN = 20
_SEQ_CLEARED, _SEQ_NEEDS = 1, 2
_UNITS = {1: "ns", 2: "count", 3: "bytes"}
_TYPE_BEGIN, _TYPE_END, _TYPE_INSTANT, _TYPE_COUNTER = 1, 2, 3, 4
_BOOTTIME, _REALTIME = 6, 1


class TraceRuleError(Comm2PerfettoError):
    """A trace breaks TrackEvent rules; ``problems`` lists every one."""

    def __init__(self, path: str, problems: list[str]) -> None:
        self.path = path
        self.problems = problems
        shown = "\n".join(f"  - {p}" for p in problems[:MAX_SHOWN])
        more = f"\n  ... and {len(problems) - MAX_SHOWN} more" if len(problems) > MAX_SHOWN else ""
        super().__init__(f"{path}: {len(problems)} problem(s) in the trace:\n{shown}{more}")


@dataclass(frozen=True)
class DecodedTrack:
    uuid: int
    name: str | None
    kind: str  # "process" | "slice" | "counter"
    parent: int | None
    pid: int | None
    description: str | None
    sort_index: int | None
    unit: str | None = None  # counter tracks


@dataclass(frozen=True)
class DecodedEvent:
    kind: str  # "slice" | "instant" | "counter"
    track: int
    ts: int  # ns
    dur: int | None  # None: never ended
    name: str
    category: str | None
    args: dict[str, Any]
    flow_ids: tuple[int, ...]  # every flow id on the event, terminating ones included
    value: float | None  # counters
    terminating_flow_ids: tuple[int, ...] = ()
    order: int = 0  # position in the file (a slice: its BEGIN)


def stalled(event: DecodedEvent) -> bool:
    """The default ``allow_unclosed``: a slice may stay open when its ``state`` arg says ``stalled``."""
    return event.args.get("state") == "stalled"


@dataclass
class DecodedTrace:
    tracks: dict[int, DecodedTrack]  # declaration order
    events: list[DecodedEvent]  # file order
    flows: dict[int, list[DecodedEvent]]  # flow id -> its events by (ts, file order)
    format: str = "protobuf"  # or "json"
    problems: list[str] = field(default_factory=list)
    groups: dict[int, DecodedTrack] = field(default_factory=dict)  # folded group tracks
    realtime_anchor_ns: int | None = None  # protobuf: REALTIME == BOOTTIME at this value
    time_origin_ns: int = 0  # JSON: ts 0 is this ns

    def process_named(self, name: str) -> DecodedTrack:
        found = [t for t in self.tracks.values() if t.kind == "process" and t.name == name]
        if len(found) != 1:
            raise KeyError(f"{len(found)} processes named {name!r}")
        return found[0]

    def process_track(self, track: DecodedTrack) -> DecodedTrack | None:
        """The process ``track`` is in (itself for a process)."""
        seen = 0
        while track.kind != "process":
            if track.parent is None or track.parent not in self.tracks or seen > len(self.tracks):
                return None
            track, seen = self.tracks[track.parent], seen + 1
        return track

    def process_of(self, event: DecodedEvent) -> DecodedTrack:
        process = self.process_track(self.tracks[event.track])
        if process is None:
            raise KeyError(f"track {event.track} is in no process")
        return process

    def tracks_of(self, process_name: str) -> list[DecodedTrack]:
        """The slice and counter tracks of a process, in ``sort_index`` order (none = 0, then declaration)."""
        process = self.process_named(process_name)
        found = [t for t in self.tracks.values() if t.kind != "process" and self.process_track(t) is process]
        return sorted(found, key=lambda t: t.sort_index or 0)

    def events_on(self, track_name: str, process_name: str | None = None,
                  kind: str | None = None) -> list[DecodedEvent]:
        """Events on the tracks named ``track_name`` (in that process), by (ts, file order)."""
        uuids = {t.uuid for t in self.tracks.values() if t.name == track_name
                 and (process_name is None or ((p := self.process_track(t)) is not None and p.name == process_name))}
        found = [e for e in self.events if e.track in uuids and (kind is None or e.kind == kind)]
        return sorted(found, key=lambda e: (e.ts, e.order))


def read_trace(path: str | os.PathLike[str],
               allow_unclosed: Callable[[DecodedEvent], bool] = stalled) -> DecodedTrace:
    """Decode a trace file; broken rules are listed in ``problems`` (``check_trace`` raises on them)."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    head = data[:64].lstrip()
    if head[:1] in (b"{", b"["):
        return _JsonDecoder(allow_unclosed).decode(data)
    return _ProtoDecoder(allow_unclosed).decode(data)


def check_trace(path: str | os.PathLike[str],
                allow_unclosed: Callable[[DecodedEvent], bool] = stalled) -> DecodedTrace:
    """``read_trace``, raising ``TraceRuleError`` when any rule is broken."""
    trace = read_trace(path, allow_unclosed=allow_unclosed)
    if trace.problems:
        raise TraceRuleError(os.fspath(path), trace.problems)
    return trace


# --- shared: slices under construction, nesting, flows ---------------------------------------------------


@dataclass
class _Slice:
    kind: str
    track: int
    ts: int
    order: int
    name: str
    category: str | None
    args: dict[str, Any]
    flows: list[int] = field(default_factory=list)
    terminating: list[int] = field(default_factory=list)
    end: int | None = None  # None: open / never ended (kind "slice")
    value: float | None = None
    sort_key: int = 0  # JSON: X events of one ts sort longest first
    parent: _Slice | None = None

    def span(self) -> str:
        end = "open" if self.end is None else self.end
        return f"{self.name!r} [{self.ts}, {end}]"

    def freeze(self) -> DecodedEvent:
        dur = None if self.end is None else self.end - self.ts
        return DecodedEvent(self.kind, self.track, self.ts, dur, self.name, self.category, self.args,
                            tuple(self.flows), self.value, tuple(self.terminating), self.order)


def _check_nesting(slices: list[_Slice], describe: Callable[[int], str], problems: list[str]) -> None:
    """Slices (and instants) of each track must nest strictly in replay order; sets ``parent``."""
    by_track: dict[int, list[_Slice]] = defaultdict(list)
    for s in slices:
        by_track[s.track].append(s)
    for track, items in by_track.items():
        items.sort(key=lambda s: (s.ts, s.sort_key, s.order))
        stack: list[_Slice] = []
        for s in items:
            while stack and stack[-1].end is not None and stack[-1].end <= s.ts and not (
                    stack[-1].end == s.ts == stack[-1].ts and s.end == s.ts):
                stack.pop()
            if stack:
                top = stack[-1]
                if top.end is not None and (s.end is None or s.end > top.end):
                    problems.append(f"{describe(track)}: {s.span()} starts inside {top.span()} and ends after it "
                                    f"(slices on one track must nest)")
                s.parent = top
            stack.append(s)


def _check_flows(flows: dict[int, list[tuple[_Slice, str]]], problems: list[str], *,
                 explicit_start: bool = False) -> None:
    """Each flow: at least two events, one terminating end (its latest). Roles: s, t, f; with
    ``explicit_start`` (JSON: an ``s`` event starts a flow) exactly one ``s``, the earliest."""
    for flow_id, uses in flows.items():
        uses.sort(key=lambda u: (u[0].ts, u[0].order))
        roles = [role for _, role in uses]
        where = ", ".join(f"{s.name!r}@{s.ts}:{role}" for s, role in uses[:4])
        if len(uses) < 2:
            problems.append(f"flow {flow_id} is on one event only ({where})")
            continue
        if roles.count("f") != 1 or roles[-1] != "f":
            problems.append(f"flow {flow_id} must end exactly once, on its latest event ({where})")
        if roles[0] == "f" or (explicit_start and (roles.count("s") != 1 or roles[0] != "s")):
            problems.append(f"flow {flow_id} must start once, on its earliest event ({where})")


def _build(fmt: str, tracks: dict[int, DecodedTrack], slices: list[_Slice],
           flows: dict[int, list[tuple[_Slice, str]]], problems: list[str]) -> DecodedTrace:
    frozen = {id(s): s.freeze() for s in slices}
    events = [frozen[id(s)] for s in sorted(slices, key=lambda s: s.order)]
    flow_events = {fid: [frozen[id(s)] for s, _ in uses] for fid, uses in flows.items()}
    return DecodedTrace(tracks, events, flow_events, fmt, problems)


# --- protobuf --------------------------------------------------------------------------------------------


class _Sequence:
    """Incremental state of one packet sequence: interned strings by kind, valid after a clear."""

    def __init__(self) -> None:
        self.valid = False
        self.tables: dict[str, dict[int, str]] = {}

    def clear(self) -> None:
        self.valid = True
        self.tables = {"name": {}, "category": {}, "annotation": {}, "string": {}}


@dataclass
class _TrackRecord:
    track: DecodedTrack
    child_ordering: int | None
    order: int


class _ProtoDecoder:
    def __init__(self, allow_unclosed: Callable[[DecodedEvent], bool]) -> None:
        from perfetto.protos.perfetto.trace import perfetto_trace_pb2

        self.pb = perfetto_trace_pb2
        self.allow_unclosed = allow_unclosed
        self.problems: list[str] = []
        self.records: dict[int, _TrackRecord] = {}
        self.sequences: dict[int, _Sequence] = defaultdict(_Sequence)
        self.slices: list[_Slice] = []
        self.open: dict[int, list[_Slice]] = defaultdict(list)
        self.flows: dict[int, list[tuple[_Slice, str]]] = defaultdict(list)
        self.order = 0
        self.anchor: int | None = None
        self.process_ordering = False

    def decode(self, data: bytes) -> DecodedTrace:
        for packet in self._packets(data):
            self._packet(packet)
        problems = self.problems
        for track_uuid, stack in self.open.items():
            for s in stack:
                if not self.allow_unclosed(s.freeze()):
                    problems.append(f"{self._describe(track_uuid)}: {s.span()} is never ended")
        tracks, groups = self._tracks()
        for record in self.records.values():
            parent = record.track.parent
            if parent is not None and parent not in self.records:
                problems.append(f"track {record.track.uuid} ({record.track.name!r}): parent {parent} is not declared")
        _check_nesting([s for s in self.slices if s.kind != "counter"], self._describe, problems)
        _check_flows(self.flows, problems)
        trace = _build("protobuf", tracks, self.slices, self.flows, problems)
        trace.groups = groups
        trace.realtime_anchor_ns = self.anchor
        return trace

    def _packets(self, data: bytes) -> Iterator[Any]:
        try:
            trace = self.pb.Trace.FromString(data)
        except Exception as exc:  # any parse failure means "not a trace"
            raise ValueError(f"not a Perfetto protobuf trace: {exc}") from exc
        for packet in trace.packet:
            if packet.HasField("compressed_packets"):
                try:
                    inner = zlib.decompress(packet.compressed_packets)
                except zlib.error as exc:
                    raise ValueError(f"compressed_packets do not inflate: {exc}") from exc
                yield from self._packets(inner)
            else:
                yield packet

    def _describe(self, uuid: int) -> str:
        record = self.records.get(uuid)
        return f"track {uuid} ({record.track.name!r})" if record else f"track {uuid}"

    def _packet(self, packet: Any) -> None:
        seq = self.sequences[packet.trusted_packet_sequence_id]
        flags = packet.sequence_flags
        if flags & _SEQ_CLEARED or packet.incremental_state_cleared:
            seq.clear()
        if packet.HasField("interned_data"):
            if not seq.valid:
                self.problems.append(f"interned data at ts {packet.timestamp} before its sequence's incremental "
                                     "state was cleared")
            else:
                self._intern(seq, packet.interned_data)
        which = packet.WhichOneof("data")
        if which == "track_descriptor":
            self._descriptor(packet.track_descriptor)
        elif which == "track_event":
            self._event(packet, seq, flags)
        elif which == "clock_snapshot":
            clocks = {c.clock_id: c.timestamp for c in packet.clock_snapshot.clocks}
            if _REALTIME in clocks and clocks.get(_BOOTTIME) == clocks[_REALTIME]:
                self.anchor = clocks[_REALTIME]

    def _intern(self, seq: _Sequence, interned: Any) -> None:
        for kind, entries in (("name", interned.event_names), ("category", interned.event_categories),
                              ("annotation", interned.debug_annotation_names)):
            for entry in entries:
                seq.tables[kind][entry.iid] = entry.name
        for entry in interned.debug_annotation_string_values:
            seq.tables["string"][entry.iid] = entry.str.decode("utf-8", "replace")

    def _descriptor(self, td: Any) -> None:
        if td.uuid == 0:  # the root track: only its ordering matters here
            self.process_ordering = td.process_ordering == 1
            return
        if td.HasField("process"):
            kind, pid = "process", td.process.pid
            name = td.name if td.HasField("name") else td.process.process_name or None
        else:
            kind, pid = ("counter" if td.HasField("counter") else "slice"), None
            name = td.name if td.HasField("name") else (td.static_name or None)
        unit = None
        if td.HasField("counter"):
            unit = _UNITS.get(td.counter.unit) or (td.counter.unit_name or None)
        track = DecodedTrack(td.uuid, name, kind, td.parent_uuid if td.HasField("parent_uuid") else None, pid,
                             td.description if td.HasField("description") else None,
                             td.sibling_order_rank if td.HasField("sibling_order_rank") else None, unit)
        old = self.records.get(td.uuid)
        if old is not None and old.track != track:
            self.problems.append(f"track {td.uuid} declared twice, differently: {old.track} then {track}")
        if old is None:
            self.records[td.uuid] = _TrackRecord(
                track, td.child_ordering if td.HasField("child_ordering") else None, len(self.records))

    def _unresolved(self, kind: str, iid: int, ts: int) -> str:
        self.problems.append(f"event at ts {ts}: {kind} iid {iid} is not in the interned data seen before")
        return f"<unresolved {kind} iid {iid}>"

    def _event(self, packet: Any, seq: _Sequence, flags: int) -> None:
        te = packet.track_event
        ts = packet.timestamp
        order = self.order
        self.order += 1
        tables = seq.tables if seq.valid else {}
        args, uses_iids = self._args(te, tables, ts) if te.debug_annotations else ({}, False)
        name_iid = te.name_iid  # iids start at 1: 0 is "not set"
        uses_iids = uses_iids or bool(name_iid) or bool(te.category_iids)
        if uses_iids and not flags & _SEQ_NEEDS:
            self.problems.append(f"event at ts {ts} uses interned data without SEQ_NEEDS_INCREMENTAL_STATE")
        if flags & _SEQ_NEEDS and not seq.valid:
            self.problems.append(f"event at ts {ts} needs incremental state its sequence never cleared "
                                 "(trace_processor drops it)")
        uuid = te.track_uuid
        record = self.records.get(uuid)
        if record is None:
            if not te.HasField("track_uuid"):
                self.problems.append(f"event at ts {ts} has no track_uuid")
            else:
                self.problems.append(f"event at ts {ts} on track {uuid}, not declared by an earlier packet")
            return
        kind = record.track.kind
        event_type = te.type
        if event_type == _TYPE_COUNTER:
            if kind != "counter":
                self.problems.append(f"counter event at ts {ts} on {self._describe(uuid)}, not a counter track")
            value = te.double_counter_value if te.HasField("double_counter_value") else te.counter_value
            self.slices.append(_Slice("counter", uuid, ts, order, record.track.name or "", None, {}, value=value))
            return
        if kind == "counter":
            self.problems.append(f"slice event at ts {ts} on counter {self._describe(uuid)}")
        if event_type == _TYPE_END:
            stack = self.open[uuid]
            if not stack:
                self.problems.append(f"{self._describe(uuid)}: END at ts {ts} without a BEGIN")
                return
            s = stack.pop()
            if ts < s.ts:
                self.problems.append(f"{self._describe(uuid)}: END at ts {ts} is before its BEGIN {s.span()}")
            s.end = ts
            if args:
                s.args.update(args)
            self._flows(s, te)
            return
        if name_iid:
            name = tables.get("name", {}).get(name_iid)
            if name is None:
                name = self._unresolved("name", name_iid, ts)
        else:
            name = te.name
        category = None
        if te.category_iids or te.categories:
            table = tables.get("category", {})
            categories = [self._unresolved("category", iid, ts) if table.get(iid) is None else table[iid]
                          for iid in te.category_iids]
            category = ",".join(categories + list(te.categories))
        s = _Slice("instant" if event_type == _TYPE_INSTANT else "slice", uuid, ts, order, name, category, args)
        if event_type == _TYPE_INSTANT:
            s.end = ts
        elif event_type == _TYPE_BEGIN:
            self.open[uuid].append(s)
        else:
            self.problems.append(f"event at ts {ts}: unsupported TrackEvent type {event_type}")
        self.slices.append(s)
        self._flows(s, te)

    def _flows(self, s: _Slice, te: Any) -> None:
        if te.flow_ids or te.flow_ids_old:
            for flow in (*te.flow_ids, *te.flow_ids_old):
                s.flows.append(flow)
                role = "t" if flow in self.flows else "s"
                self.flows[flow].append((s, role))
        if te.terminating_flow_ids or te.terminating_flow_ids_old:
            for flow in (*te.terminating_flow_ids, *te.terminating_flow_ids_old):
                s.flows.append(flow)
                s.terminating.append(flow)
                self.flows[flow].append((s, "f"))

    def _args(self, te: Any, tables: dict[str, dict[int, str]], ts: int) -> tuple[dict[str, Any], bool]:
        """(args, whether any iid was used) of a TrackEvent's debug annotations."""
        args: dict[str, Any] = {}
        uses_iids = False
        names, strings = tables.get("annotation", {}), tables.get("string", {})
        for annotation in te.debug_annotations:
            iid = annotation.name_iid
            if iid:
                uses_iids = True
                key = names.get(iid)
                if key is None:
                    key = self._unresolved("annotation", iid, ts)
            else:
                key = annotation.name
            which = annotation.WhichOneof("value")
            if which == "string_value_iid":
                uses_iids = True
                iid = annotation.string_value_iid
                text = strings.get(iid)
                args[key] = text if text is not None else self._unresolved("string", iid, ts)
            elif which is not None:
                args[key] = getattr(annotation, which)
            else:
                args[key] = self._nested(annotation, strings, ts)
        return args, uses_iids

    def _nested(self, annotation: Any, strings: dict[int, str], ts: int) -> Any:
        which = annotation.WhichOneof("value")
        if which == "string_value_iid":
            text = strings.get(annotation.string_value_iid)
            return text if text is not None else self._unresolved("string", annotation.string_value_iid, ts)
        if which is not None:
            return getattr(annotation, which)
        if annotation.dict_entries:
            return {e.name: self._nested(e, strings, ts) for e in annotation.dict_entries}
        if annotation.array_values:
            return [self._nested(e, strings, ts) for e in annotation.array_values]
        return None

    def _tracks(self) -> tuple[dict[int, DecodedTrack], dict[int, DecodedTrack]]:
        """The declared tracks, minus group tracks (folded into their parent)."""
        with_events = {s.track for s in self.slices}
        parents = {r.track.parent for r in self.records.values()}
        groups = {uuid: r.track for uuid, r in self.records.items()
                  if r.track.kind == "slice" and r.child_ordering is not None and uuid in parents
                  and uuid not in with_events}

        def lift(parent: int | None) -> int | None:
            seen = 0
            while parent in groups and seen <= len(groups):
                parent, seen = groups[parent].parent, seen + 1
            return parent

        tracks = {}
        for uuid, record in sorted(self.records.items(), key=lambda item: item[1].order):
            if uuid in groups:
                continue
            track = record.track
            if track.parent in groups:
                track = DecodedTrack(track.uuid, track.name, track.kind, lift(track.parent), track.pid,
                                     track.description, track.sort_index, track.unit)
            tracks[uuid] = track
        return tracks, groups


# --- Chrome JSON -----------------------------------------------------------------------------------------


class _JsonDecoder:
    def __init__(self, allow_unclosed: Callable[[DecodedEvent], bool]) -> None:
        self.allow_unclosed = allow_unclosed
        self.problems: list[str] = []
        self.uuids: dict[tuple[Any, ...], int] = {}
        self.processes: dict[int, dict[str, Any]] = {}  # pid -> name, sort_index, description
        self.threads: dict[tuple[int, int], dict[str, Any]] = {}

    def _uuid(self, key: tuple[Any, ...]) -> int:
        if key[0] != "process":  # a process is registered before anything inside it
            self._uuid(("process", key[1]))
        return self.uuids.setdefault(key, len(self.uuids) + 1)

    def decode(self, data: bytes) -> DecodedTrace:
        try:
            doc = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"not a JSON trace: {exc}") from exc
        origin = 0
        if isinstance(doc, dict):
            other = doc.get("otherData")
            origin = int(other.get("time_origin_ns", 0)) if isinstance(other, dict) else 0
            events = doc.get("traceEvents", [])
        else:
            events = doc
        problems = self.problems
        slices: list[_Slice] = []
        open_: dict[tuple[int, int], list[_Slice]] = defaultdict(list)
        flow_events: list[tuple[int, str, int, int, int, int]] = []  # (id, phase, pid, tid, ts, order)
        used: set[tuple[int, int]] = set()

        for order, e in enumerate(events):
            ph = e.get("ph")
            pid, tid = e.get("pid", 0), e.get("tid", 0)
            if ph == "M":
                self._metadata(e, pid, tid)
                continue
            ts = origin + round(e.get("ts", 0) * 1000)
            args = dict(e.get("args") or {})
            if ph == "C":
                for key, value in args.items():
                    name = e.get("name", "") if key == "value" else f"{e.get('name', '')} {key}"
                    uuid = self._uuid(("counter", pid, name))
                    slices.append(_Slice("counter", uuid, ts, order, name, None, {}, value=value))
                continue
            if ph in ("s", "t", "f"):
                flow_events.append((e.get("id"), ph, pid, tid, ts, order))
                continue
            if ph not in ("B", "E", "X", "i", "I"):
                continue
            place = (pid, tid)
            track = self._uuid(("process", pid)) if tid == pid else self._uuid(("thread", pid, tid))
            used.add(place)
            if ph == "E":
                stack = open_[place]
                if not stack:
                    problems.append(f"pid {pid} tid {tid}: E at ts {ts} without a B")
                    continue
                s = stack.pop()
                if ts < s.ts:
                    problems.append(f"pid {pid} tid {tid}: E at ts {ts} is before its B {s.span()}")
                s.end = ts
                s.args.update(args)
                continue
            s = _Slice("instant" if ph in ("i", "I") else "slice", track, ts, order, e.get("name", ""),
                       e.get("cat"), args)
            if ph == "X":
                dur = round(e.get("dur", 0) * 1000)
                s.end, s.sort_key = ts + dur, -dur  # trace_processor sorts X of one ts longest first
            elif ph in ("i", "I"):
                s.end = ts
            else:
                open_[place].append(s)
            slices.append(s)

        for (pid, tid), stack in open_.items():
            for s in stack:
                if not self.allow_unclosed(s.freeze()):
                    problems.append(f"pid {pid} tid {tid}: {s.span()} is never ended")
        for pid in sorted({pid for pid, _ in used}):
            if "name" not in self.processes.get(pid, {}):
                problems.append(f"pid {pid} has events but no process_name")
        for pid, tid in sorted(used):
            if tid != pid and "name" not in self.threads.get((pid, tid), {}):
                problems.append(f"pid {pid} tid {tid} has slices but no thread_name")
        tracks = self._tracks()
        describe = {}
        for key, uuid in self.uuids.items():
            where = f"pid {key[1]}" if key[0] == "process" else f"pid {key[1]} tid {key[2]}" \
                if key[0] == "thread" else f"pid {key[1]} counter"
            describe[uuid] = f"{where} ({tracks[uuid].name!r})"
        _check_nesting([s for s in slices if s.kind != "counter"], lambda u: describe.get(u, f"track {u}"), problems)
        flows = self._bind_flows(flow_events, slices, problems)
        _check_flows(flows, problems, explicit_start=True)
        trace = _build("json", tracks, slices, flows, problems)
        trace.time_origin_ns = origin
        return trace

    def _metadata(self, e: dict[str, Any], pid: int, tid: int) -> None:
        args = e.get("args") or {}
        name = e.get("name")
        if name in ("process_name", "process_sort_index", "process_labels"):
            info = self.processes.setdefault(pid, {})
            self._uuid(("process", pid))
            key = {"process_name": "name", "process_sort_index": "sort_index", "process_labels": "labels"}[name]
            info[key] = args.get(key)
        elif name in ("thread_name", "thread_sort_index"):
            info = self.threads.setdefault((pid, tid), {})
            self._uuid(("thread", pid, tid))
            key = "name" if name == "thread_name" else "sort_index"
            info[key] = args.get(key)

    def _tracks(self) -> dict[int, DecodedTrack]:
        tracks: dict[int, DecodedTrack] = {}
        for key, uuid in self.uuids.items():
            if key[0] == "process":
                info = self.processes.get(key[1], {})
                tracks[uuid] = DecodedTrack(uuid, info.get("name"), "process", None, key[1], info.get("labels"),
                                            info.get("sort_index"))
            elif key[0] == "thread":
                info = self.threads.get((key[1], key[2]), {})
                parent = self.uuids[("process", key[1])]
                tracks[uuid] = DecodedTrack(uuid, info.get("name"), "slice", parent, None, None,
                                            info.get("sort_index"))
            else:
                parent = self.uuids[("process", key[1])]
                tracks[uuid] = DecodedTrack(uuid, key[2], "counter", parent, None, None, None)
        return tracks

    def _bind_flows(self, flow_events: list[tuple[int, str, int, int, int, int]], slices: list[_Slice],
                    problems: list[str]) -> dict[int, list[tuple[_Slice, str]]]:
        """Bind each s/t/f event to the slice open on its pid/tid at its ts, the way trace_processor does."""
        by_track: dict[int, list[_Slice]] = defaultdict(list)
        for s in slices:
            if s.kind != "counter":
                by_track[s.track].append(s)
        keys: dict[int, list[tuple[int, int, int]]] = {}
        for track, items in by_track.items():
            items.sort(key=lambda s: (s.ts, s.sort_key, s.order))
            keys[track] = [(s.ts, s.sort_key, s.order) for s in items]
        flows: dict[int, list[tuple[_Slice, str]]] = defaultdict(list)
        for flow_id, phase, pid, tid, ts, order in flow_events:
            flow_track = self.uuids.get(("process", pid) if tid == pid else ("thread", pid, tid))
            items = by_track.get(flow_track, []) if flow_track is not None else []
            starts = keys.get(flow_track, []) if flow_track is not None else []
            # The last slice replayed before this flow event (flow events sort like B at their ts).
            i = bisect.bisect_left(starts, (ts, 0, order)) - 1 if items else -1
            found = items[i] if i >= 0 else None
            while found is not None and found.end is not None and found.end < ts:
                found = found.parent
            if found is None:
                problems.append(f"flow {flow_id} ({phase}) at ts {ts} on pid {pid} tid {tid}: no enclosing slice")
                continue
            found.flows.append(flow_id)
            if phase == "f":
                found.terminating.append(flow_id)
            flows[flow_id].append((found, phase))
        return flows
