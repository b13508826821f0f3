"""The PNG preview: decoded here with zlib + struct and checked pixel by pixel against the published layout."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from comm2perfetto.trace import preview
from comm2perfetto.trace.preview import (
    COLOURS,
    INSTANT_W,
    KINDS,
    LINE_H,
    MARK_MIN_H,
    MARK_W,
    PreviewRow,
    render_preview,
    time_ticks,
)
from support.png import read_png

T0 = 1_795_313_447_000_000_000  # a realistic CLOCK_REALTIME: the maths must not lean on small numbers
S = 1_000_000_000
IDLE = {COLOURS["idle"], COLOURS["grid"]}  # idle columns of a row: grid lines continue the time ticks
STALLED = {COLOURS["stalled"], COLOURS["stripe"]}  # hatched


def render(tmp_path: Path, rows: list[PreviewRow], t0: int = T0, t1: int = T0 + 10 * S, **kw):
    kw.setdefault("title", "test job")
    stats = render_preview(tmp_path / "p.png", rows, t0, t1, **kw)
    img = read_png(tmp_path / "p.png")
    return stats, stats.layout, img


def mid(lay, i: int) -> int:
    y0, y1 = lay.row_y(i)
    return (y0 + y1) // 2


# --- the file ---------------------------------------------------------------------------------------------


def test_writes_a_valid_png_of_the_stated_size(tmp_path):
    stats, lay, img = render(tmp_path, [PreviewRow("rank 0", [(T0, T0 + S, "compute")])], width=900)
    assert (img.width, img.height) == (stats.width, stats.height) == (900, lay.height)
    assert stats.bytes == (tmp_path / "p.png").stat().st_size
    assert stats.path == str(tmp_path / "p.png")
    # Everything the layout places lies inside the picture.
    assert lay.plot_x + lay.plot_w <= img.width and lay.plot_y + lay.plot_h < img.height


# --- spans ------------------------------------------------------------------------------------------------


def _columns(lay, b: int, e: int) -> float:
    """The span's length in plot columns."""
    return (e - b) * lay.plot_w / (lay.t1 - lay.t0)


def test_compute_and_comm_spans_fill_as_many_columns_as_they_last(tmp_path):
    """One run of columns from the span's first column (or the next, when it covers less than half of it), as
    many as the span lasts in columns, to the nearest one."""
    rows = [
        PreviewRow("rank 0", [(T0 + 1 * S, T0 + 3 * S, "compute")]),
        PreviewRow("rank 1", [(T0 + 5 * S + 3_333_333, T0 + 6 * S + 123_457, "comm")]),
    ]
    _, lay, img = render(tmp_path, rows)
    for i, row in enumerate(rows):
        b, e, kind = row.spans[0]
        x0, x1 = lay.span_x(b, e)
        assert x1 - x0 > 10
        y0, y1 = lay.row_y(i)
        for y in (y0, y1 - 1):  # the whole bar is coloured, top to bottom
            line = img.line(y, lay.plot_x, lay.plot_x + lay.plot_w)
            coloured = [lay.plot_x + k for k, c in enumerate(line) if c == COLOURS[kind]]
            assert coloured[0] in (x0, x0 + 1) and coloured[-1] in (x1 - 2, x1 - 1)
            assert coloured == list(range(coloured[0], coloured[-1] + 1))
            assert len(coloured) == int(_columns(lay, b, e) + 0.5)
            assert {c for c in line if c != COLOURS[kind]} <= IDLE
    assert COLOURS["compute"] != COLOURS["comm"]


def test_finely_cut_work_is_drawn_in_proportion_to_its_time(tmp_path):
    """Kernels far shorter than a column, 30 % of the time: about 30 % of the columns, to the column, not every
    column they touch (which would read as 100 % compute)."""
    t1 = T0 + 10 * S
    period = 10 * S // 15_700  # about a tenth of a column
    spans = [(t, t + period * 3 // 10, "compute") for t in range(T0, t1 - period, period)]
    _, lay, img = render(tmp_path, [PreviewRow("r", spans)], t1=t1)
    line = img.line(mid(lay, 0), lay.plot_x, lay.plot_x + lay.plot_w)
    total = sum(_columns(lay, b, e) for b, e, _ in spans)
    assert abs(line.count(COLOURS["compute"]) - total) <= 1
    assert abs(total - 0.3 * lay.plot_w) < 2
    # and spread along the row, not piled at one end
    halves = line[:lay.plot_w // 2].count(COLOURS["compute"]), line[lay.plot_w // 2:].count(COLOURS["compute"])
    assert abs(halves[0] - halves[1]) <= 2
def test_column_mapping_follows_the_window(tmp_path):
    _, lay, _ = render(tmp_path, [PreviewRow("r", [])])
    assert lay.x_of(lay.t0) == lay.plot_x
    assert lay.x_of(lay.t1) == lay.plot_x + lay.plot_w - 1
    assert lay.x_of(T0 + 5 * S) == lay.plot_x + lay.plot_w // 2
    assert lay.span_x(T0 - 5 * S, T0 + 20 * S) == (lay.plot_x, lay.plot_x + lay.plot_w)  # clipped
    assert lay.span_x(T0 - 5 * S, T0 - S) is None and lay.span_x(T0 + 11 * S, T0 + 12 * S) is None
    x0, x1 = lay.span_x(T0 + 2 * S, T0 + 2 * S)
    assert x1 - x0 == 1  # an instant still gets a column


def test_spans_outside_the_window_are_not_drawn_and_partial_ones_are_clipped(tmp_path):
    rows = [PreviewRow("r", [(T0 - 3 * S, T0 - S, "comm"), (T0 + 11 * S, T0 + 12 * S, "comm"),
                             (T0 - S, T0 + S, "compute"), (T0 + 9 * S, T0 + 15 * S, "compute")])]
    _, lay, img = render(tmp_path, rows)
    line = img.line(mid(lay, 0), lay.plot_x, lay.plot_x + lay.plot_w)
    assert COLOURS["comm"] not in line
    assert line[0] == line[-1] == COLOURS["compute"]
    assert line.count(COLOURS["compute"]) == sum(x1 - x0 for x0, x1 in (
        lay.span_x(T0 - S, T0 + S), lay.span_x(T0 + 9 * S, T0 + 15 * S)))


def test_an_instant_span_is_drawn_a_few_columns_wide_even_at_the_end_of_the_window(tmp_path):
    """A collective without a duration (gloo's) still shows: INSTANT_W columns, kept inside the plot."""
    rows = [PreviewRow("r", [(T0 + 10 * S, T0 + 10 * S, "comm"), (T0 + 5 * S, T0 + 5 * S, "comm")])]
    _, lay, img = render(tmp_path, rows)
    line = img.line(mid(lay, 0), lay.plot_x, lay.plot_x + lay.plot_w)
    coloured = [k for k, c in enumerate(line) if c == COLOURS["comm"]]
    end = list(range(lay.plot_w - INSTANT_W, lay.plot_w))
    middle = lay.x_of(T0 + 5 * S) - lay.plot_x
    assert coloured == list(range(middle, middle + INSTANT_W)) + end
    assert INSTANT_W >= 2


def test_memory_and_no_data_fill_what_compute_and_comm_leave(tmp_path):
    """No data (a rank's data does not cover that time) is grey; compute drawn over it wins; memory copies
    show where neither compute nor comm does."""
    rows = [PreviewRow("r", [(T0, T0 + 4 * S, "nodata"), (T0 + 2 * S, T0 + 3 * S, "compute"),
                             (T0 + 6 * S, T0 + 7 * S, "memory"), (T0 + 6 * S, T0 + 6 * S + S // 2, "comm")]),
            PreviewRow("rank without data", [(T0, T0 + 10 * S, "nodata")])]
    _, lay, img = render(tmp_path, rows)
    y = mid(lay, 0)
    assert img.px(lay.x_of(T0 + S), y) == COLOURS["nodata"]
    assert img.px(lay.x_of(T0 + 2 * S + S // 2), y) == COLOURS["compute"]
    assert img.px(lay.x_of(T0 + 6 * S + S // 4), y) == COLOURS["comm"]
    assert img.px(lay.x_of(T0 + 6 * S + 3 * S // 4), y) == COLOURS["memory"]
    assert img.px(lay.x_of(T0 + 5 * S), y) in IDLE
    assert set(img.line(mid(lay, 1), lay.plot_x, lay.plot_x + lay.plot_w)) == {COLOURS["nodata"]}
    assert len({COLOURS[k] for k in ("nodata", "idle", "grid", "memory", "compute", "comm")}) == 6


def test_overlap_of_compute_and_comm_splits_the_row(tmp_path):
    compute, comm = (T0 + 1 * S, T0 + 4 * S), (T0 + 3 * S, T0 + 6 * S)
    _, lay, img = render(tmp_path, [PreviewRow("r", [(*compute, "compute"), (*comm, "comm")])])
    cx0, cx1 = lay.span_x(*compute)
    mx0, mx1 = lay.span_x(*comm)
    both = range(max(cx0, mx0), min(cx1, mx1))
    assert len(both) > 10
    y0, y1 = lay.row_y(0)
    split = lay.split_y(0)
    assert y0 < split < y1
    for x in (both[0], both[len(both) // 2], both[-1]):
        assert {img.px(x, y) for y in range(y0, split)} == {COLOURS["compute"]}
        assert {img.px(x, y) for y in range(split, y1)} == {COLOURS["comm"]}
    # Outside the overlap, each kind fills the whole bar.
    assert {img.px(cx0, y) for y in range(y0, y1)} == {COLOURS["compute"]}
    assert {img.px(mx1 - 1, y) for y in range(y0, y1)} == {COLOURS["comm"]}


def test_overlap_in_rows_too_thin_to_split_has_its_own_colour(tmp_path):
    rows = [PreviewRow(f"rank {r}", [(T0, T0 + 4 * S, "compute"), (T0 + 2 * S, T0 + 6 * S, "comm")])
            for r in range(1000)]
    _, lay, img = render(tmp_path, rows)
    assert lay.bar_h == 1 and lay.split_y(0) is None
    y = lay.row_y(500)[0]
    assert img.px(lay.x_of(T0 + 3 * S), y) == COLOURS["overlap"]
    assert img.px(lay.x_of(T0 + 1 * S), y) == COLOURS["compute"]
    assert img.px(lay.x_of(T0 + 5 * S), y) == COLOURS["comm"]
    assert len({COLOURS[k] for k in ("compute", "comm", "overlap")}) == 3


def test_stalled_span_reaches_the_right_edge_over_compute_and_is_hatched(tmp_path):
    rows = [PreviewRow("r", [(T0, T0 + 10 * S, "compute"), (T0 + 6 * S, T0 + 7 * S, "stalled")])]
    _, lay, img = render(tmp_path, rows)
    x0, _ = lay.span_x(T0 + 6 * S, T0 + 7 * S)
    y0, y1 = lay.row_y(0)
    seen = set()
    for y in range(y0, y1):
        line = img.line(y, lay.plot_x, lay.plot_x + lay.plot_w)
        assert set(line[x0 - lay.plot_x:]) <= STALLED  # from the stall's start to the last column
        assert set(line[:x0 - lay.plot_x]) == {COLOURS["compute"]}
        seen |= set(line[x0 - lay.plot_x:])
    assert seen == STALLED  # both the base colour and its stripes show


def test_a_stall_that_began_before_the_window_fills_the_row(tmp_path):
    _, lay, img = render(tmp_path, [PreviewRow("r", [(T0 - 5 * S, T0 - 4 * S, "stalled")])])
    assert set(img.line(mid(lay, 0), lay.plot_x, lay.plot_x + lay.plot_w)) == STALLED


def test_missing_and_mismatch_spans_are_drawn_over_a_stall(tmp_path):
    rows = [PreviewRow("r", [(T0 + 2 * S, T0 + 3 * S, "stalled"), (T0 + 4 * S, T0 + 5 * S, "missing"),
                             (T0 + 6 * S, T0 + 7 * S, "mismatch")])]
    _, lay, img = render(tmp_path, rows)
    for kind, t in (("missing", T0 + 4 * S), ("mismatch", T0 + 6 * S)):
        x0, x1 = lay.span_x(t, t + S)
        assert set(img.line(mid(lay, 0), x0, x1)) == {COLOURS[kind]}


# --- marks ------------------------------------------------------------------------------------------------


def _runs(line: list, colour) -> list[int]:
    """Lengths of the runs of ``colour`` in ``line``."""
    runs, n = [], 0
    for c in [*line, None]:
        if c == colour:
            n += 1
        elif n:
            runs.append(n)
            n = 0
    return runs


@pytest.mark.parametrize("n_rows", [3, 1000])
def test_a_missing_mark_at_t1_is_visible_at_the_right_edge(tmp_path, n_rows):
    t1 = T0 + 10 * S
    target = n_rows // 2
    rows = [PreviewRow(f"rank {r}", [(T0, t1, "compute")], [(t1, "missing")] if r == target else ())
            for r in range(n_rows)]
    _, lay, img = render(tmp_path, rows, t1=t1)
    x0, x1 = lay.mark_x(t1)
    assert x1 == lay.plot_x + lay.plot_w and x1 - x0 == MARK_W >= 3
    my0, my1 = lay.mark_y(target)
    assert my1 - my0 >= MARK_MIN_H >= 3  # even a 1 px row's mark is 3 px tall
    for y in range(my0, my1):
        line = img.line(y, lay.plot_x, lay.plot_x + lay.plot_w)
        assert _runs(line, COLOURS["missing"]) == [MARK_W]
        assert img.line(y, x0, x1) == [COLOURS["missing"]] * MARK_W
        assert img.px(x0 - 1, y) == COLOURS["outline"]  # a black edge, so it stands out on any colour
    assert COLOURS["missing"] not in img.line(my1, lay.plot_x, lay.plot_x + lay.plot_w)


def test_a_mismatch_mark_at_t0_and_one_mid_row_are_drawn_on_top(tmp_path):
    t = T0 + 3 * S
    rows = [PreviewRow("r", [(T0, T0 + 10 * S, "comm"), (T0, T0 + 10 * S, "stalled")],
                       [(T0, "mismatch"), (t, "missing")])]
    _, lay, img = render(tmp_path, rows)
    y = mid(lay, 0)
    x0, x1 = lay.mark_x(T0)
    assert x0 == lay.plot_x
    assert img.line(y, x0, x1) == [COLOURS["mismatch"]] * MARK_W
    x0, x1 = lay.mark_x(t)
    assert x0 < lay.x_of(t) < x1 - 1  # centred on its column
    assert img.line(y, x0 - 1, x1 + 1) == [COLOURS["outline"], *[COLOURS["missing"]] * MARK_W,
                                           COLOURS["outline"]]


def test_marks_outside_the_window_are_skipped(tmp_path):
    rows = [PreviewRow("r", [], [(T0 - S, "missing"), (T0 + 11 * S, "mismatch")])]
    _, lay, img = render(tmp_path, rows)
    line = img.line(mid(lay, 0), lay.plot_x, lay.plot_x + lay.plot_w)
    assert set(line) <= IDLE


# --- layout -----------------------------------------------------------------------------------------------


def test_rows_scale_down_for_many_rows_and_labels_thin_out(tmp_path):
    few = preview.preview_layout([PreviewRow(f"rank {r}", []) for r in range(10)], T0, T0 + S)
    many = preview.preview_layout([PreviewRow(f"rank {r}", []) for r in range(1000)], T0, T0 + S)
    assert 12 <= few.row_pitch <= 16 and few.label_every == 1
    assert many.row_pitch <= 2 and many.plot_h == 1000 * many.row_pitch
    assert many.label_every > 1 and many.label_every * many.row_pitch >= LINE_H  # labels do not collide
    # The picture stays a reasonable size either way.
    assert few.height < 400 and many.height < 1400

    rows = [PreviewRow(f"rank {r}", [(T0, T0 + S, "compute")]) for r in range(1000)]
    _, lay, img = render(tmp_path, rows, t1=T0 + S)
    assert lay == many and img.height == many.height
    assert img.px(lay.plot_x, lay.row_y(999)[0]) == COLOURS["compute"]  # the last row is drawn


def test_row_labels_are_drawn_in_the_gutter(tmp_path):
    rows = [PreviewRow(f"rank {r}", []) for r in range(300)]
    _, lay, img = render(tmp_path, rows)
    gx0, gx1 = lay.gutter
    ink = COLOURS["text"]
    for i in (0, lay.label_every, 2 * lay.label_every):
        y = lay.label_y(i)
        assert any(ink in img.line(yy, gx0, gx1) for yy in range(y, y + 7)), i
    # The label text stays in the gutter: nothing of it spills into the plot.
    assert all(ink not in img.line(y, lay.plot_x, lay.plot_x + lay.plot_w)
               for y in range(lay.plot_y, lay.plot_y + lay.plot_h))


def test_long_and_non_ascii_labels_are_cut_and_still_drawn(tmp_path):
    rows = [PreviewRow("rank 0 on a-very-long-host-name.example.com", []), PreviewRow("rang é 1", [])]
    _, lay, img = render(tmp_path, rows)
    assert lay.label_chars == preview.MAX_LABEL_CHARS
    assert any(COLOURS["text"] in img.line(y, *lay.gutter) for y in range(lay.label_y(1), lay.label_y(1) + 7))


def test_title_legend_and_notes_are_drawn(tmp_path):
    _, lay, img = render(tmp_path, [PreviewRow("r", [])], notes=["showing 1 of 1 ranks", "second note"])
    ink = COLOURS["text"]

    def has_ink(y0: int, y1: int) -> bool:
        return any(ink in img.line(y, 0, img.width) for y in range(y0, y1))

    assert has_ink(lay.title_y, lay.legend_y)
    assert has_ink(lay.notes_y, lay.notes_y + LINE_H) and has_ink(lay.notes_y + LINE_H, lay.notes_y + 2 * LINE_H)
    legend = {c for y in range(lay.legend_y, lay.notes_y) for c in img.line(y, 0, img.width)}
    for name in (*KINDS, "stripe", "idle", "outline"):
        assert COLOURS[name] in legend, name


def test_time_axis_is_labelled_with_the_time_from_t0(tmp_path):
    _, lay, img = render(tmp_path, [PreviewRow("r", [])], t1=T0 + 3 * S, width=800)
    ticks = time_ticks(lay)
    labels = [label for _, label in ticks]
    assert labels[:3] == ["0 s", "500 ms", "1.00 s"] and "1.50 s" in labels and labels[-1] == "3.00 s"
    unit_ns = {"s": S, "ms": S // 10**3, "us": S // 10**6, "ns": 1}
    for x, label in ticks:
        number, unit = label.split()
        t = T0 + round(float(number) * unit_ns[unit])
        assert x == lay.x_of(t)
        assert img.px(x, lay.plot_y - 2) == COLOURS["axis"]  # the tick mark above the rows
    assert all(b - a >= preview.TICK_SPACING for (a, _), (b, _) in itertools.pairwise(ticks))
    assert any(COLOURS["text"] in img.line(y, lay.plot_x, img.width)
               for y in range(lay.axis_label_y, lay.axis_label_y + 7))


def test_legend_wraps_in_a_narrow_picture(tmp_path):
    narrow = preview.preview_layout([PreviewRow("r", [])], T0, T0 + S, width=200)
    wide = preview.preview_layout([PreviewRow("r", [])], T0, T0 + S, width=1600)
    assert narrow.legend_lines > 1 == wide.legend_lines
    render(tmp_path, [PreviewRow("r", [(T0, T0 + S // 2, "compute")])], t1=T0 + S, width=200)


def test_font_covers_printable_ascii():
    glyphs = preview._GLYPHS
    assert set(glyphs) == {chr(c) for c in range(32, 127)}
    assert glyphs[" "] == () and all(glyphs[c] for c in map(chr, range(33, 127)))
    assert len(set(glyphs.values())) == 95  # every glyph is its own


# --- bad input --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("rows", "t1", "match"), [
    ([], T0 + S, "no rows"),
    ([PreviewRow("r", [])], T0, "t1"),
    ([PreviewRow("r", [])], T0 - 1, "t1"),
    ([PreviewRow("r", [(T0, T0 + 1, "kernel")])], T0 + S, "unknown span kind 'kernel'"),
    ([PreviewRow("r", [], [(T0, "oops")])], T0 + S, "unknown mark kind 'oops'"),
    ([PreviewRow("r", [(T0 + 5, T0 + 2, "comm")])], T0 + S, "ends before it begins"),
])
def test_bad_input_is_a_value_error(tmp_path, rows, t1, match):
    with pytest.raises(ValueError, match=match):
        render_preview(tmp_path / "p.png", rows, T0, t1, title="x")
    assert not (tmp_path / "p.png").exists()


def test_a_width_too_small_for_the_plot_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match="width"):
        render_preview(tmp_path / "p.png", [PreviewRow("r", [])], T0, T0 + S, title="x", width=60)


def test_an_unwritable_path_raises_os_error(tmp_path):
    with pytest.raises(OSError):
        render_preview(tmp_path / "no" / "such" / "dir.png", [PreviewRow("r", [])], T0, T0 + S, title="x")
    with pytest.raises(OSError):
        render_preview(tmp_path, [PreviewRow("r", [])], T0, T0 + S, title="x")  # a directory
