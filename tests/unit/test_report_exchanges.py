"""report's all-to-all matrices (report/exchanges.py): the bytes each rank sent each rank, from the recorder's split
sizes or Flight Recorder's per-peer tensors (model.peer_bytes), in the JSON, the text, the HTML heat map and the
trace's slices, all from the one figure."""

from __future__ import annotations

import re
from pathlib import Path

import orjson

from comm2perfetto.load_options import REPORT
from comm2perfetto.match import load_job
from comm2perfetto.render import report_plot, report_text
from comm2perfetto.render.report_plot import render_html
from comm2perfetto.render.report_text import render_text
from comm2perfetto.report import exchanges
from comm2perfetto.report.document import ReportOptions, build
from comm2perfetto.report_doc import ReportDoc
from support.cli import run_cli
from support.factories import STEP_NS, T0_NS, EventLog, FrJob

# A planted uneven dispatch: rank r sends SPLITS[r][p] rows of 8 BFloat16 (16 bytes) to rank p.
SPLITS = {0: [1, 2, 3, 4], 1: [2, 2, 2, 2], 2: [3, 1, 0, 6], 3: [4, 3, 6, 1]}
ROW_BYTES = 8 * 2
CALL_NS = 50_000  # each call's time (EventLog's default)


def _dispatch_logs(folder: Path, calls: int = 2, wrong: dict[int, list[int]] | None = None,
                   unsized: int | None = None) -> None:
    """Four ranks each call all_to_all_single ``calls`` times with SPLITS, then (``wrong``) once with the given
    ranks' splits changed while every rank expects SPLITS; ``unsized``: a rank whose log has no sizes."""
    for r in range(4):
        log = EventLog(rank=r, world=4)
        log.group(0, "0", "default_pg", [0, 1, 2, 3])
        expected = [SPLITS[src][r] for src in range(4)]
        plan = [SPLITS[r]] * calls + ([wrong.get(r, SPLITS[r])] if wrong else [])
        for i, send in enumerate(plan):
            log.call("all_to_all_single", T0_NS + i * STEP_NS, seq=i + 1, shapes=[[sum(send), 8]],
                     dtypes=["BFloat16"], sizes=None if r == unsized else [send, expected, [sum(expected), 8]])
        log.close(T0_NS + (len(plan) + 1) * STEP_NS)
        log.write(folder)


def _report(folder: Path) -> ReportDoc:
    return build(load_job([folder], REPORT), ReportOptions())


def test_the_matrix_is_what_each_rank_sent_each_rank_to_the_byte(tmp_path):
    _dispatch_logs(tmp_path)
    (x,) = _report(tmp_path)["all_to_all"]
    sent = [[2 * k * ROW_BYTES for k in SPLITS[r]] for r in range(4)]  # two calls
    received = [sum(sent[r][p] for r in range(4)) for p in range(4)]
    assert (x["op"], x["process_group"], x["ranks"], x["count"], x["covered"], x["disagreeing"]) == (
        "all_to_all_single", "default_pg", [0, 1, 2, 3], 2, 2, 0)
    assert x["sent_bytes"] == sent and x["received_bytes"] == received == [320, 256, 352, 416]
    assert x["imbalance"] == max(received) / (sum(received) / 4) and x["hot_ranks"] == [3]
    assert x["time_s"] == [2 * CALL_NS / 1e9] * 4  # each rank's two calls; no pair is timed
    # the collectives table's bytes: each all-to-all's ranks' buffers on average (10, 8, 10, 14 rows), not rank 0's
    (row,) = [r for r in _report(tmp_path)["collectives"] if r["op"] == "all_to_all"]
    assert row["bytes"] == 2 * round(sum(sum(SPLITS[r]) * ROW_BYTES for r in range(4)) / 4) == 2 * 168


def test_the_text_the_page_and_the_trace_show_the_same_figures(tmp_path):
    _dispatch_logs(tmp_path)
    doc = _report(tmp_path)
    text = render_text(doc)
    assert "all-to-all per peer: all_to_all_single on default_pg (4 ranks): 2 of 2 collectives, imbalance 1.24 " \
           "(hot: rank 3)" in text
    assert re.search(r"\n2 +96 B +32 B +0 B +192 B +320 B +352 B +100 us\n", text)  # rank 2's row

    page = render_html(doc)
    svg = re.search(r'<svg[^>]*aria-label="bytes sent per pair of ranks, all_to_all_single".*?</svg>', page)
    assert svg is not None
    cells = re.findall(r'<rect class="cell"[^>]*fill="(#[0-9a-f]{6})"><title>rank (\d) -&gt; rank (\d): [^(]*'
                       r"\(([\d,]+) bytes\)</title>", svg.group(0))
    assert {(int(a), int(b)): int(n.replace(",", "")) for _, a, b, n in cells} == {
        (a, b): doc["all_to_all"][0]["sent_bytes"][a][b] for a in range(4) for b in range(4)}
    colours = {(int(a), int(b)): fill for fill, a, b, _ in cells}
    assert colours[(3, 2)] == "#7f0000" and colours[(2, 2)] == "#fff7ec"  # the most bytes, none

    out = tmp_path / "job.json"
    assert run_cli("merge", str(tmp_path), "-o", str(out)).code == 0
    slices = {(e["args"]["seq"], e["pid"]): e["args"] for e in orjson.loads(out.read_bytes())["traceEvents"]
              if e.get("name") == "all_to_all_single" and "bytes_to_each" in e.get("args", {})}
    assert len(slices) == 8  # two collectives on each of the four ranks
    for args in slices.values():
        sender = [r for r in range(4) if args["bytes_to_each"] == str([k * ROW_BYTES for k in SPLITS[r]])]
        assert len(sender) == 1
        assert args["bytes_from_each"] == str([SPLITS[src][sender[0]] * ROW_BYTES for src in range(4)])


def test_a_collective_whose_ranks_disagree_is_counted_apart(tmp_path):
    """Rank 1 sends 3 rows to rank 0 and 1 to rank 2, which expect 2: nothing of it is in the matrix."""
    _dispatch_logs(tmp_path, wrong={1: [3, 2, 1, 2]})
    doc = _report(tmp_path)
    (x,) = doc["all_to_all"]
    assert (x["count"], x["covered"], x["disagreeing"]) == (3, 2, 1)
    assert x["sent_bytes"][1] == [2 * k * ROW_BYTES for k in SPLITS[1]]
    assert "1 collective(s) left out: their ranks disagree on the split sizes" in render_text(doc)


def test_a_rank_without_sizes_leaves_the_matrix_empty_not_guessed(tmp_path):
    _dispatch_logs(tmp_path, unsized=2)
    doc = _report(tmp_path)
    (x,) = doc["all_to_all"]
    assert (x["count"], x["covered"], x["imbalance"], x["hot_ranks"]) == (2, 0, None, [])
    assert x["sent_bytes"] == [[0] * 4] * 4 and x["time_s"] == [None] * 4
    assert "no collective counted" in render_text(doc)
    page = render_html(doc)
    assert 'aria-label="bytes sent per pair of ranks' not in page and "no collective counted" in page


def test_flight_recorders_one_tensor_per_peer_fills_the_matrix(tmp_path):
    """all_to_all's lists, Flight Recorder alone: each input tensor is what goes to that peer."""
    job = FrJob(world=2, backend="nccl")
    for r in range(2):
        job.collective(r, "all_to_all", [[2 + r], [5]], [[2], [3]] if r == 0 else [[5], [5]])
        job.collective(r, "all_to_all", [[1, 4]], [[1, 4]])  # all_to_all_single: how it is split is unknown
    job.write(tmp_path, prefix="rank", ranks=[0, 1])
    rows = {x["op"]: x for x in _report(tmp_path)["all_to_all"]}
    # rank 0 sends [2] to itself and [5] to rank 1; rank 1 sends [3] to rank 0 and [5] to itself (Float)
    assert (rows["all_to_all"]["count"], rows["all_to_all"]["covered"]) == (2, 1)
    assert rows["all_to_all"]["sent_bytes"] == [[8, 20], [12, 20]]


def test_a_group_past_the_limit_gets_a_note_not_a_matrix(tmp_path, monkeypatch):
    monkeypatch.setattr(exchanges, "MAX_MATRIX_RANKS", 3)
    _dispatch_logs(tmp_path)
    doc = _report(tmp_path)
    assert doc["all_to_all"] == []
    assert "all-to-alls on default_pg (4 ranks): no per-peer matrix above 3 ranks" in doc["notes"]


def test_past_the_drawn_sizes_the_views_give_each_ranks_totals(tmp_path, monkeypatch):
    """The text draws the matrix up to MAX_MATRIX_SHOWN ranks, the page up to MAX_HEAT_RANKS: past them, each
    rank's sent and received bytes, and the page says where the matrix is."""
    monkeypatch.setattr(report_text, "MAX_MATRIX_SHOWN", 3)
    monkeypatch.setattr(report_plot, "MAX_HEAT_RANKS", 3)
    _dispatch_logs(tmp_path)
    doc = _report(tmp_path)
    text = render_text(doc)
    assert re.search(r"\nrank +sent +received +time\n", text) and re.search(r"\n3 +448 B +416 B +100 us\n", text)
    page = render_html(doc)
    assert 'aria-label="bytes sent per pair of ranks' not in page
    assert "the matrix of 4 ranks is in the JSON report" in page
