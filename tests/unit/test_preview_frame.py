"""The preview draws the part of the recording that matters: a 7.6 ms profiled window was 2 px of a 6 s picture,
all "no data"; a stall at the end a sliver. The frame is the stall and what led to it, else where compute was
measured, else the collectives, and the picture's header says it."""

from __future__ import annotations

import json
from pathlib import Path

from comm2perfetto.trace import preview
from comm2perfetto.trace.preview import PreviewRow
from comm2perfetto.trace.preview_frame import MIN_LEAD, preview_frame
from support.cli import run_cli
from support.png import preview_compute_s, preview_window, read_png

S, MS = 1_000_000_000, 1_000_000
NCCL = Path(__file__).parent.parent / "data" / "nccl"


def test_a_stall_is_framed_with_as_much_time_before_it_as_it_lasted():
    rows = [PreviewRow("rank 0", [(0, 60 * S, "nodata"), (1 * S, 2 * S, "compute"), (57 * S, 60 * S, "stalled")]),
            PreviewRow("rank 1", [(0, 60 * S, "comm")], [(58 * S, "missing")])]
    f = preview_frame(rows, 0, 60 * S)
    # 3 s before the stall for its 3 s, padded by 1 % of that; compute at 1 s is not framed
    assert (f.t0, f.t1) == (54 * S - 60 * MS, 60 * S)
    assert f.note == ("time axis: 6.06 s from 53.9 s, of 60.0 s recorded: the stall or fault diagnose found, and the "
                      "time before it")
    # a mark at the very end still gets some time before it
    f = preview_frame([PreviewRow("rank 0", [(0, 60 * S, "comm")], [(60 * S, "mismatch")])], 0, 60 * S)
    lead = int(60 * S * MIN_LEAD)
    assert (f.t0, f.t1) == (60 * S - lead - lead // 100, 60 * S)


def test_without_a_fault_compute_frames_it_else_the_collectives_else_nothing():
    compute = PreviewRow("rank 0", [(0, 6 * S, "nodata"), (5 * S, 5 * S + 10 * MS, "compute"),
                                    (5 * S + 5 * MS, 5 * S + 12 * MS, "comm"), (10, 6 * S, "comm")])
    f = preview_frame([compute], 0, 6 * S)
    assert (f.t0, f.t1) == (5 * S - 100_000, 5 * S + 10 * MS + 100_000)  # padded by 1 % of 10 ms each side
    assert f.why == "where compute was measured"
    f = preview_frame([PreviewRow("rank 0", [(0, 6 * S, "nodata"), (2 * S, 3 * S, "comm")])], 0, 6 * S)
    assert (f.t0, f.t1, f.why) == (2 * S - 10 * MS, 3 * S + 10 * MS, "the collectives")
    # most of the recording anyway, or nothing measured: the whole of it, and no line in the header
    for spans in ([(S // 2, 6 * S, "comm")], [(0, 6 * S, "nodata")]):
        f = preview_frame([PreviewRow("rank 0", spans)], 0, 6 * S)
        assert (f.t0, f.t1, f.note) == (0, 6 * S, None)


def test_the_userprof_recording_is_drawn_over_its_profiled_steps(tmp_path, monkeypatch):
    """tests/data/nccl/userprof: steps 2-4 profiled, 7.6 ms of a 6 s recording. The picture was 100 % "no data";
    it now spans the profiled window, shows the report's compute to within a column of 5 us, and says so."""
    headers: list[list[str]] = []
    render = preview.render_preview

    def noting(path, rows, t0, t1, *, title, notes=()):
        headers.append(list(notes))
        return render(path, rows, t0, t1, title=title, notes=notes)

    monkeypatch.setattr(preview, "render_preview", noting)
    png = tmp_path / "job.png"
    code, _, err = run_cli("merge", str(NCCL / "userprof"), "-o", str(tmp_path / "job.pftrace"), "--preview",
                           str(png))
    assert code == 0, err
    (header,) = headers
    assert header[-1] == "time axis: 7.56 ms from 5.49 s, of 6.00 s recorded: where compute was measured", header
    t0, t1 = preview_window(read_png(png))
    assert 7 * MS < t1 - t0 < 8 * MS
    code, out, _ = run_cli("report", str(NCCL / "userprof"), "--format", "json")
    report = json.loads(out)["ranks"]["0"]["compute_s"]
    shown, column_s = preview_compute_s(png, [0])
    assert column_s < 6e-6 and report > 0 and abs(shown[0] - report) <= column_s, (shown, report, column_s)
