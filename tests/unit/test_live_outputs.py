"""What a gathered window becomes outside the job: read and checked (sources/live_window.py), the Prometheus
metrics (render/prometheus.py), ``comm2perfetto top``, and record's watcher (metrics.prom, stragglers.jsonl,
--on-straggler). Also the ``l`` record as the event log's reader checks it."""

from __future__ import annotations

import io
import json
import re
import sys
from pathlib import Path

import orjson
import pytest

from comm2perfetto import layout
from comm2perfetto.cli import main
from comm2perfetto.lateness import StragglerTracker
from comm2perfetto.record.gather import window_doc
from comm2perfetto.render.prometheus import metrics_text
from comm2perfetto.render.window_text import table
from comm2perfetto.sources.event_log import read_event_log
from comm2perfetto.sources.live_window import LiveWindowError, read_window
from comm2perfetto.window_watch import WindowWatcher

S = 1_000_000_000
MS = 1_000_000


def _summary(rank: int, window: int, late_ms: float = 0.0, host: str = "node0", timed: bool = True,
             rtt_ns: int | None = 1000) -> dict:
    t0 = window * 5 * S
    seqs = list(range(1, 21))
    arrivals = [(seq * 200 * MS + int(late_ms * MS) + rank * 7_000) // 1000 for seq in seqs]
    return {"steps": 10, "step_ns": 500 * MS, "exposed_ns": 400 * MS if timed else None, "rank": rank, "host": host,
            "folder": "/runs/r1", "window": window, "t0_ns": t0, "t1_ns": t0 + 5 * S, "clock_rtt_ns": rtt_ns,
            "pid": 100 + rank,
            "groups": {"0": {"issued": 20, "desc": "default_pg", "ranks_span": [0, 4], "stride": 1,
                             "seqs": seqs, "arrivals_us": arrivals,
                             "ops": {"all_reduce": {"n": 20, "bytes": 4000, "time_ns": 400 * MS,
                                                    "timed": 20 if timed else 3},
                                     "all_gather_into_tensor": {"n": 2, "bytes": 1000, "time_ns": 10 * MS,
                                                                "timed": 2}}}}}


def _windows(tmp_path: Path, late: dict[int, float], count: int = 2, detail=(0, 1, 2, 3), **kw) -> Path:
    """Write ``count`` consecutive gathered windows (the last one stays) as the copying rank writes them."""
    tracker = StragglerTracker()
    carry: dict = {}
    path = tmp_path / layout.LIVE_WINDOW_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    for window in range(7, 7 + count):
        summaries = [_summary(r, window, late.get(r, 0.0), **kw) for r in range(4)]
        doc, carry = window_doc(window, 5.0, 4, summaries, tracker, carry)
        path.write_bytes(orjson.dumps(dict(doc, detail=[s for s in summaries if s["rank"] in detail])))
    return path


def test_a_gathered_window_reads_back_checked(tmp_path):
    window = read_window(_windows(tmp_path, {2: 30.0}))
    assert (window.window, window.every_s, window.world_size, window.end_ns) == (8, 5.0, 4, 45 * S)
    assert [(r.rank, r.step_s, r.comm_s, r.exposed_s, r.clock) for r in window.ranks][:1] == \
        [(0, 0.5, 0.41, 0.4, "measured")]
    (group,) = window.groups
    assert [m.rank for m in group.members if m.late] == [2] and window.stragglers == ((2, "0", 7),)
    (event,) = window.events
    assert (event["event"], event["rank"], event["format"]) == ("start", 2, "comm2perfetto-straggler")
    assert {(op.rank, op.op, op.calls, op.bytes, op.time_s) for op in window.detail if op.rank == 0} == {
        (0, "all_reduce", 20, 4000, 0.4), (0, "all_gather_into_tensor", 2, 1000, 0.01)}


def test_damaged_parts_of_a_window_are_left_out_and_a_file_that_is_not_one_is_refused(tmp_path):
    path = _windows(tmp_path, {2: 30.0})
    doc = orjson.loads(path.read_bytes())
    doc["ranks"][1]["rank"] = 99  # not a rank of the 4-rank job
    doc["ranks"][2]["step_s"] = "fast"
    doc["groups"][0]["ranks"][0]["late"] = "yes"
    doc["events"][0]["windows"] = "7, 8"
    doc["detail"][0]["groups"]["0"]["ops"]["all_reduce"]["n"] = -1
    path.write_bytes(orjson.dumps(doc))
    window = read_window(path)
    assert [r.rank for r in window.ranks] == [0, 2, 3] and window.ranks[1].step_s is None
    assert window.groups[0].members[0].late is None and window.events == ()
    assert {(op.rank, op.op) for op in window.detail if op.rank == 0} == {(0, "all_gather_into_tensor")}
    for content, message in ((b"{}", "not a comm2perfetto window"), (b"\x00garbage", "unreadable"),
                             (orjson.dumps(dict(doc, version=2)), "version 2 is not 1"),
                             (orjson.dumps(dict(doc, every_s=-5)), "bad world_size, window or every_s")):
        path.write_bytes(content)
        with pytest.raises(LiveWindowError, match=re.escape(message)):
            read_window(path)


_SAMPLE = re.compile(r'^comm2perfetto_[a-z_]+(\{([a-z_]+="([^"\\]|\\.)*",?)*\})? -?[0-9.e+-]+$')


def _samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list] = {}
    families = []
    for line in text.splitlines():
        if line.startswith("# "):
            kind, name = line.split()[1:3]
            assert kind in ("HELP", "TYPE")
            if kind == "TYPE":
                assert line.endswith(" gauge")
                families.append(name)
            continue
        assert _SAMPLE.match(line), line
        name, _, value = line.rpartition(" ")
        metric, _, labels = name.partition("{")
        assert metric == families[-1]  # every sample under its family's TYPE
        out.setdefault(metric.removeprefix("comm2perfetto_"), []).append(
            (dict(re.findall(r'([a-z_]+)="((?:[^"\\]|\\.)*)"', labels)), float(value)))
    assert len(families) == len(set(families))
    return out


def test_metrics_are_the_exposition_format_labelled_by_rank_group_op_and_host(tmp_path):
    window = read_window(_windows(tmp_path, {2: 30.0}))
    metrics = _samples(metrics_text(window))
    comm = {(s["rank"], s["op"]): v for s, v in metrics["comm_seconds"]}
    assert comm[("2", "all_reduce")] == 0.4
    labels, _ = metrics["comm_seconds"][0]
    assert set(labels) == {"rank", "host", "group", "group_desc", "op"} and labels["host"] == "node0"
    # all_reduce's bus bandwidth: 4000 B in 0.4 s x 2(n-1)/n; all_gather's message is n x its input.
    busbw = {(s["rank"], s["op"]): v for s, v in metrics["bus_bandwidth_bytes_per_second"]}
    assert busbw[("0", "all_reduce")] == pytest.approx(4000 / 0.4 * 1.5)
    assert busbw[("0", "all_gather_into_tensor")] == pytest.approx(4000 / 0.01 * 0.75)
    assert {s["rank"]: v for s, v in metrics["straggler"]} == {"0": 0, "1": 0, "2": 1, "3": 0}
    assert dict((s["rank"], v) for s, v in metrics["lateness_seconds"])["2"] > 0.029
    assert metrics["exposed_comm_share"][0][1] == 0.08 and metrics["window_end_timestamp_seconds"] == [({}, 45.0)]


def test_unknown_figures_have_no_sample_and_only_the_folders_ranks_are_exported(tmp_path):
    window = read_window(_windows(tmp_path, {}, timed=False, detail=(0, 1)))
    metrics = _samples(metrics_text(window))
    assert {s["rank"] for s, _ in metrics["comm_calls"]} == {"0", "1"}
    # all_reduce: 3 of 20 calls timed, so its time is unknown; all_gather's is known.
    assert {s["op"] for s, _ in metrics["comm_seconds"]} == {"all_gather_into_tensor"}
    assert "exposed_comm_share" not in metrics


def test_top_shows_stragglers_first_then_by_lateness(tmp_path, capsys):
    window = read_window(_windows(tmp_path, {2: 30.0, 1: 1.0}))
    text = table(window, "run1", now_ns=45 * S + 3 * S)
    lines = text.splitlines()
    assert lines[0].startswith("run1  window 8 (5 s, ended ") and "(3.00 s ago), gathered by rank 0): 4 of 4 ranks" \
        in lines[0]
    assert lines[1] == "stragglers: rank 2 on default_pg"
    header, *rows = lines[3:]
    assert header.split() == ["RANK", "HOST", "STEP", "COMM", "EXPOSED", "LATENESS", "LAST", "STRAGGLER"]
    assert [row.split()[0] for row in rows] == ["2", "1", "3", "0"]
    assert rows[0].split()[2:] == ["500", "ms", "8%", "8%", "30.0", "ms", "100%", "default_pg"]
    assert main(["top", str(tmp_path), "--once"]) == 0
    assert "stragglers: rank 2 on default_pg" in capsys.readouterr().out


def test_top_says_when_no_window_was_gathered(tmp_path, capsys):
    assert main(["top", str(tmp_path), "--once"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no window gathered" in err and "--live-every" in err


HOOK = """
import json, os, sys
event = json.load(sys.stdin)
with open(os.path.join(sys.argv[1], "hook." + os.environ["COMM2PERFETTO_EVENT"] + ".json"), "w") as f:
    json.dump(event, f)
"""


def test_record_writes_the_metrics_the_events_and_runs_the_hook_once_per_window(tmp_path):
    (tmp_path / "hook.py").write_text(HOOK)
    metrics_dir = tmp_path / "textfile"
    err = io.StringIO()
    watcher = WindowWatcher(str(tmp_path), str(metrics_dir), f"{sys.executable} {tmp_path / 'hook.py'} {tmp_path}",
                            err=err)
    _windows(tmp_path, {2: 30.0})
    watcher.poll()
    watcher.poll()  # the same window again: nothing twice
    watcher.stop()
    assert 'rank="2"' in (metrics_dir / layout.METRICS_FILE).read_text()
    assert not (tmp_path / layout.WINDOWS_DIR / layout.METRICS_FILE).exists()
    (line,) = (tmp_path / layout.STRAGGLERS_FILE).read_text().splitlines()
    event = json.loads(line)
    assert {k: event[k] for k in ("event", "rank", "group", "windows")} == \
        {"event": "start", "rank": 2, "group": "0", "windows": [7, 8]}
    assert set(event) >= {"mean_lateness_s", "last_share", "windows", "event", "rank", "group"}
    assert json.loads((tmp_path / "hook.straggler-start.json").read_text()) == event
    assert err.getvalue().count("straggler: rank 2 on default_pg (group 0) arrives 3") == 1


def test_a_window_file_that_is_not_one_is_said_once(tmp_path):
    err = io.StringIO()
    watcher = WindowWatcher(str(tmp_path), err=err)
    path = tmp_path / layout.LIVE_WINDOW_FILE
    path.parent.mkdir()
    path.write_text("{}")
    watcher.poll()
    path.write_text("{} ")  # rewritten, as damaged
    watcher.poll()
    watcher.stop()
    assert err.getvalue().count("not a comm2perfetto window") == 1
    assert not (tmp_path / layout.WINDOWS_DIR / layout.METRICS_FILE).exists()


def test_the_event_log_reads_window_records_and_skips_a_damaged_one(tmp_path):
    header = {"kind": "header", "format": "comm2perfetto-events", "version": 1, "rank": 0, "world_size": 2,
              "wall_ns": 1795908611000000000}
    good = ["l", 359181722, 1795908611820665957, 1795908614999925456,
            {"steps": 6, "step_ns": 512000000, "exposed_ns": None,
             "groups": {"0": {"issued": 71, "stride": 1, "seqs": [1, 2], "arrivals_us": [53518, 128019],
                              "ops": {"all_reduce": {"n": 56, "bytes": 224000, "time_ns": 314809424, "timed": 56}}}}}]
    bad = [*good[:4], {**good[4], "groups": {"0": {"issued": 1, "ops": {"all_reduce": {"n": 1, "bytes": 4,
                                                                                        "time_ns": 5, "timed": 2}}}}}]
    late = [*good[:4], {**good[4], "groups": {"0": {"issued": 1, "ops": {}, "seqs": [3], "arrivals_us": [10**9]}}}]
    lines = [header, good, bad, late, ["z", 1795908615000000000, 0, "exit"]]
    path = tmp_path / "rank0.events.jsonl"
    path.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
    log = read_event_log(path)
    (window,) = log.windows
    assert (window.window, window.steps, window.exposed_ns) == (359181722, 6, None)
    assert (window.groups["0"].seqs, window.groups["0"].arrivals_us) == ((1, 2), (53518, 128019))
    assert window.groups["0"].ops["all_reduce"].timed == 56
    (problem,) = log.problems  # the damaged record and the one with an arrival after its window's end
    assert problem.startswith("rank0.events.jsonl: 2 bad lines skipped (first at line 3: 'l' record's 'all_reduce' "
                              "on group '0': {'n': 1, ")
    log.shift(-1000)
    assert window.t0_ns == 1795908611820664957  # the arrivals stay relative to it
