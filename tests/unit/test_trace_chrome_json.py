"""ChromeJsonWriter: legacy JSON that decodes to what was written, gzipped when asked."""

from __future__ import annotations

import gzip
from pathlib import Path

import orjson
import pytest

from comm2perfetto.trace import chrome_json
from comm2perfetto.trace.check import check_trace, read_trace
from comm2perfetto.trace.chrome_json import ChromeJsonWriter
from support.trace_scenario import ARGS, T0, expected_args, write_scenario


def events_of(path: Path) -> tuple[dict, list[dict]]:
    data = path.read_bytes()
    doc = orjson.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)
    return doc, doc["traceEvents"]


@pytest.mark.parametrize("name, gzipped", [("t.json", False), ("t.json.gz", True)])
def test_round_trip(tmp_path: Path, name: str, gzipped: bool) -> None:
    path = tmp_path / name
    w = ChromeJsonWriter(path, time_origin_ns=T0)
    expected = write_scenario(w)
    stats = w.close()
    assert stats.bytes == path.stat().st_size and (path.read_bytes()[:2] == b"\x1f\x8b") == gzipped
    assert {k: getattr(stats, k) for k in expected} == expected
    trace = check_trace(path)
    assert trace.format == "json" and trace.time_origin_ns == T0

    assert [(p.name, p.pid, p.description, p.sort_index) for p in trace.tracks.values() if p.kind == "process"] == [
        ("job", 100, "3 ranks", -1), ("rank 0", 4242, "host a, pid 4242", 0), ("rank 1", 4343, "host b, pid 4343", 1)]
    assert [(t.name, t.kind) for t in trace.tracks_of("rank 0") if t.kind == "slice"] == [
        ("default_pg", "slice"), ("nvtx", "slice")]
    first = trace.events_on("default_pg", "rank 0", kind="slice")
    assert [(e.name, e.ts, e.dur, e.category) for e in first] == [
        ("all_reduce", T0 + 1_000, 8_000, "collective"), ("broadcast", T0 + 10_000, 500, "collective")]
    assert first[0].args == expected_args(ARGS)
    assert [(e.name, e.ts, e.dur) for e in trace.events_on("nvtx", "rank 0")] == [
        ("step 1", T0, 30_000), ("forward", T0 + 10_100, 9_900)]
    stalled = trace.events_on("default_pg", "rank 1")[-1]
    assert (stalled.dur, stalled.args["state"]) == (None, "stalled")
    assert [(e.ts, e.value) for e in trace.events_on("bytes in flight", kind="counter")] == [
        (T0 + 1_000, 16), (T0 + 9_000, 0)]
    assert [e.value for e in trace.events_on("queue")] == [2.5]
    assert {fid: [(trace.process_of(e).name, e.name) for e in evs] for fid, evs in trace.flows.items()} == {
        7: [("rank 0", "all_reduce"), ("rank 1", "all_reduce"), ("job", "missing broadcast (default_pg seq 4)")],
        8: [("rank 0", "broadcast"), ("job", "missing broadcast (default_pg seq 4)")]}


def test_document_shape(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    w = ChromeJsonWriter(path, time_origin_ns=T0)
    write_scenario(w)
    w.close()
    doc, events = events_of(path)
    assert doc["displayTimeUnit"] == "ns" and doc["otherData"] == {"time_origin_ns": T0}
    meta = {(e["name"], e["pid"], e["tid"]): e["args"] for e in events if e["ph"] == "M"}
    assert meta[("process_name", 4242, 0)] == {"name": "rank 0"}
    assert meta[("process_sort_index", 4242, 0)] == {"sort_index": 0}
    assert meta[("process_labels", 4242, 0)] == {"labels": "host a, pid 4242"}
    assert meta[("thread_name", 4242, 11)] == {"name": "nvtx"}
    assert meta[("thread_sort_index", 4242, 11)] == {"sort_index": 1}
    x = next(e for e in events if e["ph"] == "X")
    assert (x["ts"], x["dur"], x["tid"], x["cat"]) == (1.0, 8.0, 10, "collective")
    flows = [e for e in events if e["ph"] in "stf"]
    assert {(e["ph"], e["id"]) for e in flows} == {("s", 7), ("t", 7), ("s", 8), ("f", 7), ("f", 8)}
    assert all(e["bp"] == "e" and e["cat"] == chrome_json.FLOW_CATEGORY and e["name"] == chrome_json.FLOW_NAME
               for e in flows)
    # Each flow event follows the slice it binds to, at its ts, on its pid/tid.
    for i, e in enumerate(events):
        if e["ph"] in "stf":
            owner = next(o for o in reversed(events[:i]) if o["ph"] not in "stf")
            assert (owner["ph"], owner["pid"], owner["tid"], owner["ts"]) == ("X" if e["ph"] != "f" else "i",
                                                                               e["pid"], e["tid"], e["ts"])
    instant = next(e for e in events if e["ph"] == "i")
    assert instant["s"] == "t" and instant["tid"] == 30
    counter = next(e for e in events if e["ph"] == "C")
    assert (counter["name"], counter["args"], counter["pid"]) == ("bytes in flight", {"value": 16}, 4242)
    assert (next(e for e in events if e["ph"] == "B")["ph"], next(e for e in events if e["ph"] == "E")["ph"]) == (
        "B", "E")


def test_ns_precision_needs_an_origin(tmp_path: Path) -> None:
    times = [T0 + 1, T0 + 999, T0 + 123_456_789, T0 + 86_400 * 10**9 + 7]
    exact, absolute = tmp_path / "exact.json", tmp_path / "absolute.json"
    for path, origin in ((exact, T0), (absolute, 0)):
        w = ChromeJsonWriter(path, time_origin_ns=origin)
        w.process(1, pid=1, name="p")
        w.track(2, parent=1, name="t")
        for ts in times:
            w.complete(2, ts, 3, "x")
        w.close()
    assert [e.ts for e in read_trace(exact).events] == times
    assert [e.dur for e in read_trace(exact).events] == [3] * len(times)
    # Absolute microseconds of today are floats with ~0.25 us steps: ts = ns / 1000 as written.
    assert [e["ts"] for e in events_of(absolute)[1] if e["ph"] == "X"] == [t / 1000 for t in times]
    assert all(abs(e.ts - t) < 1000 for e, t in zip(read_trace(absolute).events, times))


def test_gzip_chosen_by_flag_and_read_by_content(tmp_path: Path) -> None:
    for name, flag in (("zipped.json", True), ("plain.json.gz", False)):
        path = tmp_path / name
        w = ChromeJsonWriter(path, gzip=flag)
        w.process(1, pid=1, name="p")
        w.track(2, parent=1, name="t")
        w.complete(2, 5_000, 1_000, "x", {"n": 1})
        w.close()
        assert (path.read_bytes()[:2] == b"\x1f\x8b") == flag
        assert [(e.name, e.ts, e.dur, e.args) for e in check_trace(path).events] == [("x", 5_000, 1_000, {"n": 1})]


def test_many_events_stream_in_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chrome_json, "_CHUNK_BYTES", 4096)
    for name in ("t.json", "t.json.gz"):
        path = tmp_path / name
        w = ChromeJsonWriter(path)
        w.process(1, pid=1, name="p")
        w.track(2, parent=1, name="t")
        written = [(i * 1000, f"op{i % 7}", {"i": i, "s": f"v{i % 5}"}) for i in range(2000)]
        for ts, op, args in written:
            w.complete(2, ts, 500, op, args)
        w.close()
        assert [(e.ts, e.name, e.args) for e in check_trace(path).events] == written


def test_huge_ints_and_odd_values(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    w = ChromeJsonWriter(path)
    w.process(1, pid=1, name="p")
    w.track(2, parent=1, name="t")
    w.counter_track(3, parent=1, name="c")
    w.instant(2, 1_000, "x", {"huge": 2**70, "ok": 2**64 - 1, "list": [1, [2, 3]], "flag": True})
    w.counter(3, 1_000, True)
    w.close()
    [event, counter] = read_trace(path).events
    assert event.args == {"huge": str(2**70), "ok": 2**64 - 1, "list": "[1, [2, 3]]", "flag": True}
    assert counter.value == 1


def test_track_uuids_that_cannot_be_tids(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    w = ChromeJsonWriter(path)
    w.process(1, pid=7, name="p")
    for uuid in (7, 2**40, 9):  # the pid itself, not a uint32, a fine one
        w.track(uuid, parent=1, name=f"track {uuid}")
        w.complete(uuid, 1_000, 10, f"on {uuid}")
    w.instant(1, 2_000, "on the process")
    w.close()
    tids = {e["args"]["name"]: e["tid"] for e in events_of(path)[1] if e["name"] == "thread_name"}
    assert tids["track 9"] == 9 and len(set(tids.values())) == 3 and 7 not in tids.values()
    assert all(0 < t < 2**32 for t in tids.values())
    trace = check_trace(path)
    assert {trace.tracks[e.track].name: e.name for e in trace.events} == {
        "track 7": "on 7", f"track {2**40}": f"on {2**40}", "track 9": "on 9", "p": "on the process"}


def test_errors(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        ChromeJsonWriter(tmp_path / "missing" / "t.json")
    w = ChromeJsonWriter(tmp_path / "t.json", time_origin_ns=1_000)
    w.process(1, pid=1, name="p")
    w.track(2, parent=1, name="t")
    w.counter_track(3, parent=1, name="c")
    with pytest.raises(ValueError, match="not a declared process"):
        w.track(4, parent=99, name="orphan")
    for call in (lambda: w.begin(9, 5_000, "x"), lambda: w.end(9, 5_000), lambda: w.complete(9, 5_000, 1, "x"),
                 lambda: w.instant(9, 5_000, "x"), lambda: w.counter(9, 5_000, 1)):
        with pytest.raises(ValueError, match="undeclared track 9"):
            call()
    with pytest.raises(ValueError, match="counter track"):
        w.complete(3, 5_000, 1, "x")
    with pytest.raises(ValueError, match="not a counter track"):
        w.counter(2, 5_000, 1)
    with pytest.raises(ValueError, match="no open slice"):
        w.end(2, 5_000)
    with pytest.raises(ValueError, match="before time_origin_ns"):
        w.instant(2, 999, "x")
    assert w.close().slices == 0
