"""``report`` reads the live windows the recorder left in its logs (``l`` records): each group's communication
over the run, each rank's lateness window by window, and the straggler episodes, by the live rule
(lateness.py); in the text, the JSON and a heat map of the HTML page."""

from __future__ import annotations

import json

from comm2perfetto import layout
from support.cli import run_cli
from support.factories import T0_NS, EventLog

EVERY_NS = 2_000_000_000
FIRST = T0_NS // EVERY_NS + 1  # the first whole window after the logs begin
LATE = {2: {FIRST + 1, FIRST + 2, FIRST + 3}}  # rank 2 arrives 30 ms late from the second window on


def _window(rank: int, window: int) -> list:
    """8 all-reduces 200 ms apart (every one sampled), 2 steps of 1 s, 40 ms in communication each call."""
    late_us = 30_000 if window in LATE.get(rank, ()) else 0
    seqs = [(window - FIRST) * 8 + i + 1 for i in range(8)]
    arrivals = [100_000 + i * 200_000 + late_us + 37 * rank for i in range(8)]
    return ["l", window, window * EVERY_NS, (window + 1) * EVERY_NS,
            {"steps": 2, "step_ns": 1_000_000_000, "exposed_ns": 320_000_000,
             "groups": {"0": {"issued": 8, "stride": 1, "seqs": seqs, "arrivals_us": arrivals,
                              "ops": {"all_reduce": {"n": 8, "bytes": 8 * 4096, "time_ns": 320_000_000,
                                                     "timed": 8}}}}}]


def _recording(tmp_path):
    for rank in range(3):
        log = EventLog(rank, 3)
        log.lines[0]["config"] = {"live_every_s": 2.0}
        log.group(0, "0", "default_pg", [0, 1, 2])
        log.lines.extend(_window(rank, w) for w in range(FIRST, FIRST + 4))
        log.close((FIRST + 4) * EVERY_NS)
        log.write(tmp_path)
    live = tmp_path / layout.WINDOWS_DIR  # what record wrote while it ran: not a source of the report
    live.mkdir()
    (live / "window.json").write_text("{}")
    (live / layout.METRICS_FILE).write_text("# TYPE comm2perfetto_steps gauge\n")
    return tmp_path


def test_report_shows_each_group_s_communication_and_who_was_late_window_by_window(tmp_path):
    folder = _recording(tmp_path)
    code, out, err = run_cli("report", folder, "--format", "json")
    assert code == 0, err
    doc = json.loads(out)
    live = doc["live"]
    assert live["every_s"] == 2.0 and live["windows"] == list(range(FIRST, FIRST + 4))
    (group,) = live["groups"]
    assert (group["group"], group["desc"], group["ranks"]) == ("0", "default_pg", [0, 1, 2])
    assert (group["calls"], group["bytes"], group["steps"]) == (96, 96 * 4096, 8)
    assert group["comm_s"] == 3 * 4 * 0.32 and group["comm_per_step_s"] == 0.16
    assert group["late"] == [[False] * 4, [False] * 4, [False, True, True, True]]
    assert all(29e-3 < x < 31e-3 for x in group["lateness_s"][2][1:]) and group["lateness_s"][2][0] < 1e-3
    (event,) = live["stragglers"]  # late in 2 of 3 windows from the third window
    assert (event["event"], event["rank"], event["window"], event["windows"]) == (
        "start", 2, FIRST + 2, [FIRST + 1, FIRST + 2])
    assert not any("live" in note for note in doc["notes"]), doc["notes"]  # its outputs are not skipped files

    code, text, _ = run_cli("report", folder)
    assert "live windows (every 2 s, 4 windows" in text
    assert "default_pg     96  384 KiB  3.84 s     160 ms      8  rank 2: 3 of 4 (30.1 ms)" in text
    assert "+6 s: rank 2 became a straggler of default_pg (mean lateness 30.1 ms, last at 100.0% of its" in text

    page = tmp_path / "r.html"
    assert run_cli("report", folder, "--plot", page).code == 0
    assert "<h2>Live windows</h2>" in page.read_text() and "lateness per rank and live window" in page.read_text()


def test_a_job_recorded_without_windows_has_no_live_part(tmp_path):
    log = EventLog(0, 1)
    log.group(0, "0", "default_pg", [0])
    log.call("all_reduce", T0_NS + 10**6, seq=1, shapes=[[4]], dtypes=["Float"], nbytes=16)
    log.close(T0_NS + 10**9)
    log.write(tmp_path)
    code, out, err = run_cli("report", tmp_path, "--format", "json")
    assert code == 0, err
    assert "live" not in json.loads(out)
