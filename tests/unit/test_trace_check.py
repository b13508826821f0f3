"""check_trace: each TrackEvent rule, broken on purpose in a hand-built trace, is reported."""

from __future__ import annotations

import gzip
from pathlib import Path

import orjson
import pytest
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from comm2perfetto.trace.check import (
    MAX_SHOWN,
    TraceRuleError,
    check_trace,
    read_trace,
)
from comm2perfetto.trace.chrome_json import ChromeJsonWriter
from comm2perfetto.trace.perfetto import PerfettoWriter

BEGIN, END, INSTANT, COUNTER = (pb.TrackEvent.TYPE_SLICE_BEGIN, pb.TrackEvent.TYPE_SLICE_END,
                                pb.TrackEvent.TYPE_INSTANT, pb.TrackEvent.TYPE_COUNTER)
CLEARED, NEEDS = 1, 2


def descriptor(uuid: int, name: str, *, parent: int | None = None, pid: int | None = None,
               counter: bool = False, seq: int = 1, flags: int = 0) -> pb.TracePacket:
    packet = pb.TracePacket(trusted_packet_sequence_id=seq, sequence_flags=flags)
    td = packet.track_descriptor
    td.uuid, td.name = uuid, name
    if parent is not None:
        td.parent_uuid = parent
    if pid is not None:
        td.process.pid, td.process.process_name = pid, name
    if counter:
        td.counter.SetInParent()
    return packet


def event(ts: int, kind: int, track: int, *, name: str | None = None, name_iid: int | None = None,
          args: dict | None = None, string_iids: dict | None = None, flows: tuple = (), ends: tuple = (),
          flags: int = 0, seq: int = 1, interned: dict | None = None, value: float | None = None) -> pb.TracePacket:
    """A TrackEvent packet. ``args``: inline names; ``string_iids``: {annotation name iid: string iid}."""
    packet = pb.TracePacket(timestamp=ts, trusted_packet_sequence_id=seq, sequence_flags=flags)
    te = packet.track_event
    te.type, te.track_uuid = kind, track
    if name is not None:
        te.name = name
    if name_iid is not None:
        te.name_iid = name_iid
    for key, val in (args or {}).items():
        annotation = te.debug_annotations.add(name=key)
        annotation.int_value = val
    for name_id, string_id in (string_iids or {}).items():
        te.debug_annotations.add(name_iid=name_id, string_value_iid=string_id)
    te.flow_ids.extend(flows)
    te.terminating_flow_ids.extend(ends)
    if value is not None:
        te.double_counter_value = value
    for kind_name, entries in (interned or {}).items():
        for iid, text in entries.items():
            entry = getattr(packet.interned_data, kind_name).add(iid=iid)
            if kind_name == "debug_annotation_string_values":
                entry.str = text.encode()
            else:
                entry.name = text
    return packet


def write(tmp_path: Path, packets: list[pb.TracePacket], name: str = "t.pftrace") -> Path:
    path = tmp_path / name
    path.write_bytes(pb.Trace(packet=packets).SerializeToString())
    return path


def base() -> list[pb.TracePacket]:
    """Process 1 with slice track 2 and counter track 3, on sequence 1, incremental state cleared."""
    return [descriptor(1, "rank 0", pid=10, flags=CLEARED), descriptor(2, "default_pg", parent=1),
            descriptor(3, "bytes", parent=1, counter=True)]


def problems(path: Path, **kwargs) -> list[str]:
    with pytest.raises(TraceRuleError) as caught:
        check_trace(path, **kwargs)
    return caught.value.problems


def test_a_correct_hand_built_trace_passes(tmp_path: Path) -> None:
    path = write(tmp_path, base() + [
        event(100, BEGIN, 2, name_iid=1, string_iids={1: 1}, flags=NEEDS, flows=(9,),
              interned={"event_names": {1: "all_reduce"}, "debug_annotation_names": {1: "pg"},
                        "debug_annotation_string_values": {1: "default_pg"}}),
        event(150, INSTANT, 2, name="mark", ends=(9,)),
        event(200, END, 2),
        event(120, COUNTER, 3, value=4.0)])
    trace = check_trace(path)
    [slice_, instant, counter] = trace.events
    assert (slice_.name, slice_.ts, slice_.dur, slice_.args) == ("all_reduce", 100, 100, {"pg": "default_pg"})
    assert (instant.name, instant.dur, counter.value) == ("mark", 0, 4.0)
    assert [e.name for e in trace.flows[9]] == ["all_reduce", "mark"]


def test_undeclared_track_and_late_declaration(tmp_path: Path) -> None:
    path = write(tmp_path, base() + [event(100, INSTANT, 7, name="x"), descriptor(8, "late", parent=1),
                                     event(50, INSTANT, 8, name="y"), event(60, INSTANT, 9, name="z")])
    found = problems(path)
    assert found == ["event at ts 100 on track 7, not declared by an earlier packet",
                     "event at ts 60 on track 9, not declared by an earlier packet"]
    path = write(tmp_path, [descriptor(1, "p", pid=1, flags=CLEARED), event(5, INSTANT, 2, name="x"),
                            descriptor(2, "t", parent=1)])
    assert problems(path) == ["event at ts 5 on track 2, not declared by an earlier packet"]


def test_parent_not_declared(tmp_path: Path) -> None:
    path = write(tmp_path, base() + [descriptor(4, "orphan", parent=99), event(5, INSTANT, 4, name="x")])
    assert problems(path) == ["track 4 ('orphan'): parent 99 is not declared"]


def test_unresolved_iids(tmp_path: Path) -> None:
    path = write(tmp_path, base() + [
        event(100, INSTANT, 2, name_iid=5, flags=NEEDS),
        event(200, INSTANT, 2, name="x", string_iids={1: 3}, flags=NEEDS,
              interned={"debug_annotation_names": {1: "pg"}})])
    assert problems(path) == ["event at ts 100: name iid 5 is not in the interned data seen before",
                              "event at ts 200: string iid 3 is not in the interned data seen before"]


def test_iids_interned_after_their_use_or_on_another_sequence(tmp_path: Path) -> None:
    later = event(200, INSTANT, 2, name_iid=1, flags=NEEDS, interned={"event_names": {1: "x"}})
    path = write(tmp_path, base() + [event(100, INSTANT, 2, name_iid=1, flags=NEEDS), later])
    assert problems(path) == ["event at ts 100: name iid 1 is not in the interned data seen before"]
    other = [descriptor(9, "other seq", pid=2, seq=2, flags=CLEARED),
             event(300, INSTANT, 2, name_iid=1, flags=NEEDS, seq=2)]
    path = write(tmp_path, base() + [later] + other)
    assert problems(path) == ["event at ts 300: name iid 1 is not in the interned data seen before"]


def test_interned_data_before_the_state_is_cleared(tmp_path: Path) -> None:
    packets = [descriptor(1, "p", pid=1), descriptor(2, "t", parent=1),
               event(100, INSTANT, 2, name_iid=1, flags=NEEDS, interned={"event_names": {1: "x"}})]
    found = problems(write(tmp_path, packets))
    assert found == ["interned data at ts 100 before its sequence's incremental state was cleared",
                     "event at ts 100 needs incremental state its sequence never cleared (trace_processor drops it)",
                     "event at ts 100: name iid 1 is not in the interned data seen before"]


def test_iids_without_needs_incremental_state(tmp_path: Path) -> None:
    path = write(tmp_path, base() + [
        event(100, INSTANT, 2, name_iid=1, interned={"event_names": {1: "x"}})])
    assert problems(path) == ["event at ts 100 uses interned data without SEQ_NEEDS_INCREMENTAL_STATE"]


def test_end_without_begin_and_end_before_begin(tmp_path: Path) -> None:
    path = write(tmp_path, base() + [event(100, END, 2), event(200, BEGIN, 2, name="a"), event(150, END, 2)])
    assert problems(path) == ["track 2 ('default_pg'): END at ts 100 without a BEGIN",
                              "track 2 ('default_pg'): END at ts 150 is before its BEGIN 'a' [200, open]"]


def _writer_trace(tmp_path: Path, calls) -> Path:
    path = tmp_path / "w.pftrace"
    w = PerfettoWriter(path)
    w.process(1, pid=1, name="p")
    w.track(2, parent=1, name="t")
    calls(w)
    w.close()
    return path


def test_overlapping_slices(tmp_path: Path) -> None:
    def calls(w):
        w.complete(2, 0, 10, "a")
        w.complete(2, 5, 10, "b")  # starts inside a, ends after it
    assert problems(_writer_trace(tmp_path, calls)) == [
        "track 2 ('t'): 'b' [5, 15] starts inside 'a' [0, 10] and ends after it (slices on one track must nest)"]


def test_child_written_before_its_parent_at_the_same_ts(tmp_path: Path) -> None:
    # trace_processor replays by (ts, file order): the child's BEGIN would come first and the child would
    # become the parent, with the durations swapped.
    def calls(w):
        w.complete(2, 0, 5, "child")
        w.complete(2, 0, 10, "parent")
    assert problems(_writer_trace(tmp_path, calls)) == [
        ("track 2 ('t'): 'parent' [0, 10] starts inside 'child' [0, 5] and ends after it "
         "(slices on one track must nest)")]


def test_nesting_that_is_fine(tmp_path: Path) -> None:
    def calls(w):
        w.begin(2, 0, "outer")
        w.complete(2, 0, 5, "first")
        w.complete(2, 5, 5, "second")  # touches first: not an overlap
        w.instant(2, 10, "mark")
        w.instant(2, 10, "mark 2")
        w.end(2, 10)
        w.complete(2, 10, 0, "empty")
        w.begin(2, 20, "stuck", {"state": "stalled"})
        w.complete(2, 25, 1, "inside the stuck one")
    trace = check_trace(_writer_trace(tmp_path, calls))
    assert [(e.name, e.dur) for e in trace.events] == [
        ("outer", 10), ("first", 5), ("second", 5), ("mark", 0), ("mark 2", 0), ("empty", 0), ("stuck", None),
        ("inside the stuck one", 1)]


def test_unclosed_slices(tmp_path: Path) -> None:
    def calls(w):
        w.begin(2, 0, "stuck", {"state": "stalled"})
        w.begin(2, 5, "forgotten", {"state": "started"})
    path = _writer_trace(tmp_path, calls)
    assert problems(path) == ["track 2 ('t'): 'forgotten' [5, open] is never ended"]
    assert problems(path, allow_unclosed=lambda e: False) == ["track 2 ('t'): 'stuck' [0, open] is never ended",
                                                              "track 2 ('t'): 'forgotten' [5, open] is never ended"]
    assert [e.dur for e in check_trace(path, allow_unclosed=lambda e: True).events] == [None, None]


def test_flow_rules(tmp_path: Path) -> None:
    path = write(tmp_path, base() + [
        event(10, INSTANT, 2, name="lone", flows=(1,)),
        event(20, INSTANT, 2, name="no end a", flows=(2,)), event(30, INSTANT, 2, name="no end b", flows=(2,)),
        event(40, INSTANT, 2, name="end twice a", flows=(3,)), event(50, INSTANT, 2, name="x", ends=(3,)),
        event(60, INSTANT, 2, name="y", ends=(3,)),
        event(70, INSTANT, 2, name="ends first", ends=(4,)), event(80, INSTANT, 2, name="z", flows=(4,)),
        event(90, INSTANT, 2, name="fine", flows=(5,)), event(95, INSTANT, 2, name="fine end", ends=(5,))])
    found = problems(path)
    assert len(found) == 5
    assert found[0] == "flow 1 is on one event only ('lone'@10:s)"
    assert found[1].startswith("flow 2 must end exactly once, on its latest event")
    assert found[2].startswith("flow 3 must end exactly once")
    assert found[3].startswith("flow 4 must end exactly once") and found[4].startswith("flow 4 must start once")


def test_counter_and_slice_track_kinds(tmp_path: Path) -> None:
    path = write(tmp_path, base() + [event(10, COUNTER, 2, value=1.0), event(20, INSTANT, 3, name="x")])
    assert problems(path) == ["counter event at ts 10 on track 2 ('default_pg'), not a counter track",
                              "slice event at ts 20 on counter track 3 ('bytes')"]


def test_the_message_lists_problems_up_to_a_limit(tmp_path: Path) -> None:
    n = MAX_SHOWN + 7
    path = write(tmp_path, base() + [event(i, END, 2) for i in range(n)])
    with pytest.raises(TraceRuleError) as caught:
        check_trace(path)
    assert len(caught.value.problems) == n
    message = str(caught.value)
    assert message.startswith(f"{path}: {n} problem(s)")
    assert message.count("\n  - ") == MAX_SHOWN and message.endswith("... and 7 more")


# --- JSON ------------------------------------------------------------------------------------------------


def write_json(tmp_path: Path, events: list[dict], name: str = "t.json") -> Path:
    meta = [{"ph": "M", "pid": 1, "tid": 0, "name": "process_name", "args": {"name": "rank 0"}},
            {"ph": "M", "pid": 1, "tid": 2, "name": "thread_name", "args": {"name": "default_pg"}}]
    path = tmp_path / name
    path.write_bytes(orjson.dumps({"traceEvents": meta + events}))
    return path


def ev(ph: str, ts: float, **kw) -> dict:
    return {"ph": ph, "pid": 1, "tid": 2, "ts": ts, "name": kw.pop("name", ph), **kw}


def test_json_pairing_nesting_and_unclosed(tmp_path: Path) -> None:
    path = write_json(tmp_path, [ev("E", 1), ev("X", 2, dur=5, name="a"), ev("X", 4, dur=5, name="b"),
                                 ev("B", 20, name="open")])
    assert problems(path) == ["pid 1 tid 2: E at ts 1000 without a B",
                              "pid 1 tid 2: 'open' [20000, open] is never ended",
                              ("pid 1 tid 2 ('default_pg'): 'b' [4000, 9000] starts inside 'a' [2000, 7000] "
                               "and ends after it (slices on one track must nest)")]


def test_json_begin_and_complete_at_one_ts(tmp_path: Path) -> None:
    # trace_processor sorts X before B at one ts, so an X meant to be inside a B starting then is not.
    path = write_json(tmp_path, [ev("B", 10, name="outer"), ev("X", 10, dur=3, name="inner"), ev("E", 20)])
    assert problems(path) == [("pid 1 tid 2 ('default_pg'): 'outer' [10000, 20000] starts inside 'inner' "
                               "[10000, 13000] and ends after it (slices on one track must nest)")]


def test_json_flow_rules(tmp_path: Path) -> None:
    path = write_json(tmp_path, [
        ev("X", 0, dur=10, name="a"), ev("s", 0, id=1, bp="e"),
        ev("X", 20, dur=10, name="b"), ev("t", 20, id=2, bp="e"), ev("f", 25, id=2, bp="e"),
        ev("f", 40, id=3, bp="e")])
    assert problems(path) == ["flow 3 (f) at ts 40000 on pid 1 tid 2: no enclosing slice",
                              "flow 1 is on one event only ('a'@0:s)",
                              "flow 2 must start once, on its earliest event ('b'@20000:t, 'b'@20000:f)"]


def test_json_names_required(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_bytes(orjson.dumps([{"ph": "X", "pid": 5, "tid": 6, "ts": 1, "dur": 1, "name": "x"},
                                   {"ph": "i", "pid": 5, "tid": 5, "ts": 1, "name": "on the process"}]))
    assert problems(path) == ["pid 5 has events but no process_name", "pid 5 tid 6 has slices but no thread_name"]


# --- reading ---------------------------------------------------------------------------------------------


def test_format_by_content_not_suffix(tmp_path: Path) -> None:
    proto, json_, zipped = tmp_path / "really_proto.json", tmp_path / "really_json.pftrace", tmp_path / "z.bin"
    for path, make in ((proto, PerfettoWriter), (json_, ChromeJsonWriter)):
        w = make(path)
        w.process(1, pid=1, name="p")
        w.track(2, parent=1, name="t")
        w.complete(2, 1_000, 1_000, "x")
        w.close()
    zipped.write_bytes(gzip.compress(json_.read_bytes()))
    assert [read_trace(p).format for p in (proto, json_, zipped)] == ["protobuf", "json", "json"]
    assert len({tuple((e.name, e.ts, e.dur) for e in read_trace(p).events) for p in (proto, json_, zipped)}) == 1
    garbage = tmp_path / "garbage"
    garbage.write_bytes(b"\xff\xfe not a trace")
    with pytest.raises(ValueError, match="not a Perfetto protobuf trace"):
        read_trace(garbage)
    bad_json = tmp_path / "bad.json"
    bad_json.write_bytes(b'{"traceEvents": [')
    with pytest.raises(ValueError, match="not a JSON trace"):
        read_trace(bad_json)


def test_lookup_helpers(tmp_path: Path) -> None:
    path = tmp_path / "t.pftrace"
    w = PerfettoWriter(path)
    w.process(1, pid=1, name="rank 0", sort_index=0)
    w.process(2, pid=2, name="rank 1", sort_index=1)
    w.process(3, pid=3, name="rank 1", sort_index=2)
    w.track(10, parent=1, name="b", sort_index=1)
    w.track(11, parent=1, name="a", sort_index=0)
    w.counter_track(12, parent=1, name="a", sort_index=2)
    w.track(20, parent=2, name="a")
    w.complete(10, 5, 1, "on b")
    w.complete(11, 7, 1, "on a, late")
    w.complete(11, 6, 1, "on a")
    w.counter(12, 6, 3)
    w.complete(20, 1, 1, "rank 1's a")
    w.close()
    trace = check_trace(path)
    assert trace.process_named("rank 0").uuid == 1
    for missing in ("rank 9", "rank 1"):  # none, two
        with pytest.raises(KeyError):
            trace.process_named(missing)
    assert [(t.uuid, t.kind) for t in trace.tracks_of("rank 0")] == [(11, "slice"), (10, "slice"), (12, "counter")]
    assert [e.name for e in trace.events_on("a", "rank 0")] == ["on a", "a", "on a, late"]
    assert [e.name for e in trace.events_on("a", "rank 0", kind="slice")] == ["on a", "on a, late"]
    assert [e.name for e in trace.events_on("a")] == ["rank 1's a", "on a", "a", "on a, late"]
    assert {trace.process_of(e).uuid for e in trace.events} == {1, 2}
