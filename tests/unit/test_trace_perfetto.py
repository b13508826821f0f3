"""PerfettoWriter: what it writes decodes (with perfetto's own protos) to exactly what was written."""

from __future__ import annotations

import io
import random
import zlib
from pathlib import Path

import pytest
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from comm2perfetto.trace import perfetto as perfetto_module
from comm2perfetto.trace.check import check_trace, read_trace
from comm2perfetto.trace.perfetto import GROUP_UUID_BIT, PerfettoWriter
from support.trace_scenario import ARGS, T0, expected_args, write_scenario


def packets(data: bytes) -> list[pb.TracePacket]:
    """Every TracePacket of a trace, compressed ones inflated, in file order."""
    out = []
    for packet in pb.Trace.FromString(data).packet:
        if packet.HasField("compressed_packets"):
            out += packets(zlib.decompress(packet.compressed_packets))
        else:
            out.append(packet)
    return out


@pytest.mark.parametrize("compress", [True, False])
def test_round_trip(tmp_path: Path, compress: bool) -> None:
    path = tmp_path / "t.pftrace"
    w = PerfettoWriter(path, compress=compress)
    expected = write_scenario(w)
    stats = w.close()
    assert stats.path == str(path) and stats.bytes == path.stat().st_size
    assert {k: getattr(stats, k) for k in expected} == expected
    trace = check_trace(path)

    assert [(p.name, p.pid, p.description, p.sort_index) for p in trace.tracks.values() if p.kind == "process"] == [
        ("job", 100, "3 ranks", -1), ("rank 0", 4242, "host a, pid 4242", 0), ("rank 1", 4343, "host b, pid 4343", 1)]
    assert [(t.name, t.kind, t.unit) for t in trace.tracks_of("rank 0")] == [
        ("default_pg", "slice", None), ("nvtx", "slice", None), ("bytes in flight", "counter", "bytes")]
    assert trace.tracks[10].description == "collectives of the default group"
    assert trace.tracks[21].unit == "requests"
    assert all(trace.tracks[t].parent == 2 for t in (10, 11, 12))  # group tracks folded away

    first = trace.events_on("default_pg", "rank 0", kind="slice")
    assert [(e.name, e.ts, e.dur, e.category) for e in first] == [
        ("all_reduce", T0 + 1_000, 8_000, "collective"), ("broadcast", T0 + 10_000, 500, "collective")]
    assert first[0].args == expected_args(ARGS)
    assert {k: type(v) for k, v in first[0].args.items()} == {k: type(v) for k, v in expected_args(ARGS).items()}
    nvtx = trace.events_on("nvtx", "rank 0")
    assert [(e.name, e.ts, e.dur, e.args) for e in nvtx] == [
        ("step 1", T0, 30_000, {"step": 1}), ("forward", T0 + 10_100, 9_900, {"layer": "attn"})]
    stalled = trace.events_on("default_pg", "rank 1")[-1]
    assert (stalled.dur, stalled.args["state"]) == (None, "stalled")
    [instant] = trace.events_on("findings", "job")
    assert (instant.kind, instant.dur, instant.args) == ("instant", 0, {"stack": "train.py:57 step"})
    assert [(e.ts, e.value) for e in trace.events_on("bytes in flight", kind="counter")] == [
        (T0 + 1_000, 16), (T0 + 9_000, 0)]
    assert [(e.value, type(e.value)) for e in trace.events_on("queue")] == [(2.5, float)]

    assert {fid: [(trace.process_of(e).name, e.name) for e in evs] for fid, evs in trace.flows.items()} == {
        7: [("rank 0", "all_reduce"), ("rank 1", "all_reduce"), ("job", "missing broadcast (default_pg seq 4)")],
        8: [("rank 0", "broadcast"), ("job", "missing broadcast (default_pg seq 4)")]}
    assert instant.terminating_flow_ids == (7, 8)


def test_compression_changes_bytes_not_content(tmp_path: Path) -> None:
    plain, packed = tmp_path / "plain.pftrace", tmp_path / "packed.pftrace"
    for path, compress in ((plain, False), (packed, True)):
        w = PerfettoWriter(path, compress=compress)
        write_scenario(w)
        w.close()
    outer = pb.Trace.FromString(packed.read_bytes()).packet
    assert outer and all(p.HasField("compressed_packets") for p in outer)
    assert all(p.compressed_packets[:1] == b"\x78" for p in outer)  # zlib format, as deflateInit writes
    assert not any(p.HasField("compressed_packets") for p in pb.Trace.FromString(plain.read_bytes()).packet)
    assert packets(packed.read_bytes()) == packets(plain.read_bytes())
    a, b = read_trace(plain), read_trace(packed)
    assert (a.tracks, a.events, a.flows) == (b.tracks, b.events, b.flows)


def test_one_sequence_flags_and_interning(tmp_path: Path) -> None:
    path = tmp_path / "t.pftrace"
    w = PerfettoWriter(path, compress=False)
    w.process(1, pid=1, name="rank 0")
    w.track(2, parent=1, name="default_pg")
    names, groups = ["all_reduce", "broadcast", "all_gather"], ["default_pg", "tp", "dp"]
    n = 300
    for i in range(n):
        w.complete(2, T0 + i * 1000, 500, names[i % 3], {"seq": i % 7, "pg": groups[i % 3], "ok": i % 2 == 0,
                                                          "op": names[i % 3]}, category="collective")
    w.close()
    all_packets = packets(path.read_bytes())
    assert {p.trusted_packet_sequence_id for p in all_packets} == {1}
    assert all_packets[0].sequence_flags == 1  # SEQ_INCREMENTAL_STATE_CLEARED first
    events = [p for p in all_packets if p.HasField("track_event")]
    begins = [p for p in events if p.track_event.type == pb.TrackEvent.TYPE_SLICE_BEGIN]
    assert len(begins) == n and all(p.sequence_flags == 2 for p in begins)  # SEQ_NEEDS_INCREMENTAL_STATE
    interned = pb.InternedData()
    for p in all_packets:
        interned.MergeFrom(p.interned_data)
    # Each string interned once, in the first packet that uses it, whatever the number of events.
    assert sorted(e.name for e in interned.event_names) == sorted(names)
    assert [e.name for e in interned.event_categories] == ["collective"]
    assert sorted(e.name for e in interned.debug_annotation_names) == ["ok", "op", "pg", "seq"]
    assert sorted(e.str.decode() for e in interned.debug_annotation_string_values) == sorted(set(groups + names))
    iids = [e.iid for e in interned.event_names]
    assert iids == list(range(1, len(iids) + 1))
    assert all(not p.track_event.HasField("name") for p in begins)  # no inline strings
    trace = check_trace(path)
    assert [e.args for e in trace.events] == [{"seq": i % 7, "pg": groups[i % 3], "ok": i % 2 == 0,
                                               "op": names[i % 3]} for i in range(n)]


def test_realtime_anchor_clock_snapshot(tmp_path: Path) -> None:
    path = tmp_path / "t.pftrace"
    w = PerfettoWriter(path, realtime_anchor_ns=T0)
    w.process(1, pid=1, name="rank 0")
    w.close()
    [snapshot] = [p for p in packets(path.read_bytes()) if p.HasField("clock_snapshot")]
    assert {(c.clock_id, c.timestamp) for c in snapshot.clock_snapshot.clocks} == {
        (pb.BUILTIN_CLOCK_BOOTTIME, T0), (pb.BUILTIN_CLOCK_REALTIME, T0)}
    assert read_trace(path).realtime_anchor_ns == T0
    no_anchor = tmp_path / "n.pftrace"
    PerfettoWriter(no_anchor).close()
    assert not any(p.HasField("clock_snapshot") for p in packets(no_anchor.read_bytes()))


def _descriptors(path: Path) -> dict[int, pb.TrackDescriptor]:
    return {p.track_descriptor.uuid: p.track_descriptor for p in packets(path.read_bytes())
            if p.HasField("track_descriptor")}


def test_process_order_from_root_descriptor_and_ranks(tmp_path: Path) -> None:
    path = tmp_path / "t.pftrace"
    w = PerfettoWriter(path)
    for rank in (2, 0, 1):
        w.process(rank + 1, pid=1000 + rank, name=f"rank {rank}", sort_index=rank)
    w.close()
    descriptors = _descriptors(path)
    assert descriptors[0].process_ordering == pb.TrackDescriptor.PROCESS_ORDERING_EXPLICIT
    assert {u: d.sibling_order_rank for u, d in descriptors.items() if u} == {3: 2, 1: 0, 2: 1}


def test_tracks_in_order_by_default_through_a_group_track(tmp_path: Path) -> None:
    path = tmp_path / "t.pftrace"
    w = PerfettoWriter(path)
    w.process(1, pid=1, name="rank 0")
    w.process(5, pid=2, name="rank 1")
    w.process(9, pid=3, name="no tracks")
    w.track(2, parent=1, name="nvtx", sort_index=0)
    w.track(3, parent=1, name="default_pg", sort_index=1)
    w.complete(2, T0, 1, "x")
    w.counter_track(4, parent=1, name="bytes", sort_index=2)  # declared after events: fine too
    w.track(6, parent=5, name="a", sort_index=0)  # a single track, in order by itself: grouped too
    w.counter(4, T0, 1)
    w.close()
    descriptors = _descriptors(path)
    group, group5 = GROUP_UUID_BIT | 1, GROUP_UUID_BIT | 5
    assert {u for u in descriptors if u & GROUP_UUID_BIT} == {group, group5}
    assert descriptors[group].parent_uuid == 1 and descriptors[group].name == "rank 0"
    assert descriptors[group].child_ordering == pb.TrackDescriptor.EXPLICIT
    assert {u: (descriptors[u].parent_uuid, descriptors[u].sibling_order_rank) for u in (2, 3, 4, 6)} == {
        2: (group, 0), 3: (group, 1), 4: (group, 2), 6: (group5, 0)}
    assert all(descriptors[u].sibling_merge_behavior == pb.TrackDescriptor.SIBLING_MERGE_BEHAVIOR_NONE
               for u in (2, 3, 6))
    trace = check_trace(path)
    assert [t.name for t in trace.tracks_of("rank 0")] == ["nvtx", "default_pg", "bytes"]
    assert set(trace.groups) == {group, group5}
    assert {trace.process_of(e).name for e in trace.events} == {"rank 0"}


def test_flat_tracks_in_name_order(tmp_path: Path) -> None:
    path = tmp_path / "t.pftrace"
    w = PerfettoWriter(path, group_tracks=False)
    w.process(1, pid=1, name="rank 0")
    w.track(2, parent=1, name="z", sort_index=0)
    w.track(3, parent=1, name="a", sort_index=1)
    w.close()
    descriptors = _descriptors(path)
    assert not any(u & GROUP_UUID_BIT for u in descriptors)
    assert {u: descriptors[u].parent_uuid for u in (2, 3)} == {2: 1, 3: 1}
    assert [t.name for t in check_trace(path).tracks_of("rank 0")] == ["z", "a"]  # sort_index kept as rank


def test_groups_only_where_names_would_misorder(tmp_path: Path) -> None:
    path = tmp_path / "t.pftrace"
    w = PerfettoWriter(path, group_tracks=None)
    w.process(1, pid=1, name="in order")
    w.track(2, parent=1, name="a collectives", sort_index=0)
    w.counter_track(3, parent=1, name="b bytes", sort_index=1)
    w.process(5, pid=2, name="out of order")
    w.track(6, parent=5, name="nvtx", sort_index=0)
    w.track(7, parent=5, name="default_pg", sort_index=1)
    w.process(8, pid=3, name="same names")
    w.track(9, parent=8, name="pg", sort_index=0)
    w.track(10, parent=8, name="pg", sort_index=1)
    w.complete(2, T0, 1, "x")  # decides for process 1 (its tracks are all declared by now)
    w.track(4, parent=1, name="c nvtx", sort_index=2)  # after the decision: written at once, beside them
    w.complete(6, T0, 1, "y")
    w.close()  # decides for process 8, which had no event
    descriptors = _descriptors(path)
    assert {u for u in descriptors if u & GROUP_UUID_BIT} == {GROUP_UUID_BIT | 5, GROUP_UUID_BIT | 8}
    assert {u: descriptors[u].parent_uuid for u in (2, 3, 4, 6, 7)} == {
        2: 1, 3: 1, 4: 1, 6: GROUP_UUID_BIT | 5, 7: GROUP_UUID_BIT | 5}
    trace = check_trace(path)
    assert [t.name for t in trace.tracks_of("out of order")] == ["nvtx", "default_pg"]
    assert [t.uuid for t in trace.tracks_of("same names")] == [9, 10]


def test_arg_types_stay_apart_in_the_cache(tmp_path: Path) -> None:
    # (name, True), (name, 1) and (name, 1.0) are one dict key; each must keep its own type.
    path = tmp_path / "t.pftrace"
    w = PerfettoWriter(path)
    w.process(1, pid=1, name="p")
    w.track(2, parent=1, name="t")
    values = [1, True, 1, 0, False, 7, 7, 2.5, 7, 1.0, "1", True, 0, 1]
    for i, value in enumerate(values):
        w.instant(2, T0 + i, "e", {"v": value, "w": value})
    w.close()
    decoded = [e.args["v"] for e in read_trace(path).events]
    assert [(v, type(v)) for v in decoded] == [(v, type(v)) for v in values]


def test_timestamps_exact_across_varint_boundaries(tmp_path: Path) -> None:
    rng = random.Random(5)
    edges = [0, 1, 127, 128, 16383, 16384, 2**28 - 1, 2**28, 2**28 + 1, 2**35, 2**42 - 1, 2**49, 2**56, 2**62,
             T0, T0 + 2**28, 2**63 - 1]
    times = sorted(edges + [rng.randrange(2**63 - 10**6) for _ in range(300)])
    path = tmp_path / "t.pftrace"
    w = PerfettoWriter(path)
    w.process(1, pid=1, name="p")
    w.track(2, parent=1, name="t")
    w.counter_track(3, parent=1, name="c")
    for ts in times:
        w.complete(2, ts, 0, "e")
        w.counter(3, ts, ts)
    w.close()
    trace = check_trace(path)
    assert [e.ts for e in trace.events if e.kind == "slice"] == times
    assert [e.value for e in trace.events if e.kind == "counter"] == times


def test_many_chunks_and_random_args_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(perfetto_module, "CHUNK_BYTES", 16 << 10)
    rng = random.Random(11)
    words = ["completed", "started", "scheduled", "Float", "BFloat16", "default_pg", "tp", "[[4096]]"]

    def value():
        kind = rng.randrange(5)
        if kind == 0:
            return rng.choice(words) + str(rng.randrange(40))
        if kind == 1:
            return rng.randrange(-(2**40), 2**40)
        if kind == 2:
            return rng.randrange(100)
        if kind == 3:
            return rng.random() * 1e6
        return rng.random() < 0.5

    path = tmp_path / "t.pftrace"
    w = PerfettoWriter(path)
    ranks = 8
    for r in range(ranks):
        w.process(100 + r, pid=r, name=f"rank {r}", sort_index=r)
        w.track(200 + r, parent=100 + r, name="default_pg")
    written = []
    for i in range(6000):
        r = i % ranks
        args = {f"a{j}": value() for j in range(rng.randrange(12))}
        ts = T0 + i * 10_000
        w.complete(200 + r, ts, 5_000, f"op{i % 13}", args, category="collective")
        written.append((200 + r, ts, 5_000, f"op{i % 13}", args))
    stats = w.close()
    assert stats.bytes > 0 and stats.slices == len(written)
    assert len(pb.Trace.FromString(path.read_bytes()).packet) > 10  # many compressed chunks
    trace = check_trace(path)
    assert [(e.track, e.ts, e.dur, e.name, e.args) for e in trace.events] == written


def test_file_object_left_open(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    w = PerfettoWriter(buffer)
    w.process(1, pid=1, name="p")
    stats = w.close()
    assert not buffer.closed and stats.bytes == len(buffer.getvalue()) > 0
    assert w.close() is stats  # closing twice is harmless


def test_errors(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        PerfettoWriter(tmp_path / "missing" / "t.pftrace")
    with pytest.raises(OSError):
        PerfettoWriter(tmp_path)  # a folder
    w = PerfettoWriter(tmp_path / "t.pftrace")
    w.process(1, pid=1, name="p")
    w.track(2, parent=1, name="t")
    w.counter_track(3, parent=1, name="c")
    with pytest.raises(ValueError, match="not a declared process"):
        w.track(4, parent=99, name="orphan")
    with pytest.raises(ValueError, match="declared twice"):
        w.track(2, parent=1, name="again")
    for call in (lambda: w.begin(9, T0, "x"), lambda: w.end(9, T0), lambda: w.complete(9, T0, 1, "x"),
                 lambda: w.instant(9, T0, "x"), lambda: w.counter(9, T0, 1)):
        with pytest.raises(ValueError, match="undeclared track 9"):
            call()
    with pytest.raises(ValueError, match="counter track"):
        w.complete(3, T0, 1, "x")
    with pytest.raises(ValueError, match="not a counter track"):
        w.counter(2, T0, 1)
    with pytest.raises(ValueError, match="no open slice"):
        w.end(2, T0)
    with pytest.raises(ValueError, match="negative"):
        w.complete(2, T0, -1, "x")
    with pytest.raises(ValueError, match="negative timestamp"):
        w.instant(2, -5, "x")
    with pytest.raises(ValueError, match="unsigned 64-bit"):
        w.instant(2, 2**64, "x")
    with pytest.raises(ValueError, match="int32"):
        w.track(8, parent=1, name="x", sort_index=2**31)
    w.complete(2, T0, 1, "x")
    stats = w.close()
    for call in (lambda: w.instant(5, T0, "x"), lambda: w.complete(2, T0, 1, "x"), lambda: w.end(2, T0),
                 lambda: w.counter(3, T0, 1), lambda: w.process(7, pid=7, name="late")):
        with pytest.raises(ValueError, match="closed"):
            call()
    assert stats.slices == 1 and w.close() is stats


def test_caches_stay_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(perfetto_module, "CACHE_LIMIT", 64)
    monkeypatch.setattr(perfetto_module, "PER_NAME_CACHE", 16)
    monkeypatch.setattr(perfetto_module, "INTERN_LIMIT", 50)
    path = tmp_path / "t.pftrace"
    w = PerfettoWriter(path)
    w.process(1, pid=1, name="p")
    w.track(2, parent=1, name="t")
    written = []
    for i in range(400):
        args = {"seq": i % 40, "text": f"s{i % 90}", "unique": f"u{i}", "n": i}
        w.instant(2, T0 + i, f"name{i % 70}", args, category=f"cat{i % 60}")
        written.append((f"name{i % 70}", f"cat{i % 60}", args))
        assert len(w._args_cache) <= 64 and len(w._string_iids) <= 50
    w.close()
    # Past the intern limit strings go inline: still the same trace.
    assert [(e.name, e.category, e.args) for e in check_trace(path).events] == written
