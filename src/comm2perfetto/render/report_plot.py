"""Charts of the report document: where each rank's time went, and who arrives late at which collective.

Takes the plain dict (see :mod:`comm2perfetto.report.document`) and nothing else. Two charts:

- **time per rank**: one stacked horizontal bar per rank, in rank order: compute only (``compute_s -
  overlapped_comm_s``), overlapped comm, exposed comm, idle, which add up to ``span_s`` (memory-only time
  aside). A missing value counts as zero in the bar and prints as ``-`` in the tooltip.
- **lateness**: ``doc["lateness_map"]``, ranks x collectives, each cell the rank's arrival minus the earliest
  arrival; no value is grey. An empty map gives a line of text instead.

:func:`write_plot` picks the format from the suffix:

- ``.html``: one self-contained page (no script, no stylesheet or font to fetch, so it opens offline on a
  cluster node): a header saying what it covers (:func:`header_facts`: folder, ranks, steps, basis, clocks),
  the job summary, both charts as inline SVG drawn here, the per-rank and per-step tables (the text's), the
  collectives table, each all-to-all's per-peer bytes as a heat map (sender by row, receiver by column; a
  ``<rect class="cell">`` per pair, its tooltip the exact bytes) with each rank's totals, the stragglers and
  modules tables, and the notes. In the SVG, a bar segment is a
  ``<rect class="seg KIND">`` (only the non-zero segments are drawn), a heat-map cell a ``<rect class="cell">``
  (horizontal runs of one colour are one rect), a legend swatch a ``<rect class="swatch">``, a rank without
  data a ``<rect class="nodata">``; each rank's ``<g class="rank">`` has a ``<title>`` tooltip with its
  numbers, each cell one with its lateness.
- ``.png`` / ``.svg``: the same two charts drawn with matplotlib (the ``plot`` extra), imported only here,
  under the page's title (:func:`plot_title`).

Ranks of the job that left no data (the document's ``world_size`` past its ranks) get a grey bar, "no data";
not those a sample left out (``sampled``: traces of 2 of 128 ranks): they were never meant to have any.

Example::

    doc = {"job": {...}, "ranks": {"0": {"span_s": 1.2, "compute_s": 0.9, "overlapped_comm_s": 0.2,
                                         "exposed_comm_s": 0.1, "idle_s": 0.2, ...}},
           "lateness_map": {"ranks": [0, 1], "collectives": ["all_reduce 0:1"], "lateness_s": [[0.0], [2e-4]]},
           "collectives": [...], "stragglers": [...], "notes": [...]}
    write_plot(doc, "report.html")
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from comm2perfetto.errors import Comm2PerfettoError
from comm2perfetto.render.report_text import (
    MISSING,
    TIME_COLUMNS,
    exchange_notes,
    exchange_title,
    fmt_bytes,
    fmt_int,
    fmt_number,
    fmt_pct,
    fmt_ratio,
    fmt_time,
    live_event_lines,
    live_rows,
    rank_sort_key,
    time_cells,
)
from comm2perfetto.report_doc import ExchangeRow, Figures, LatenessMap, LiveWindows, ReportDoc
from comm2perfetto.words import document_clock_text, ranks_text

__all__ = ["SUFFIXES", "PlotDependencyError", "header_facts", "plot_title", "render_html",
           "write_plot"]

SUFFIXES = (".html", ".png", ".svg")
MATPLOTLIB_HINT = ("writing {suffix} needs matplotlib: pip install 'comm2perfetto[plot]' "
                   "(or write --plot report.html, which needs nothing)")

# The bar's segments in drawing order, with Okabe-Ito colours (distinct under colour-vision deficiencies):
# exposed comm, the one to act on, gets the loudest (vermillion); idle the quietest.
SEGMENTS = ("compute", "overlapped", "exposed", "idle")
SEGMENT_LABELS = {"compute": "compute only", "overlapped": "overlapped comm", "exposed": "exposed comm",
                  "idle": "idle"}
SEGMENT_COLOURS = {"compute": "#0072b2", "overlapped": "#009e73", "exposed": "#d55e00", "idle": "#d9d9d9"}
MAX_NO_DATA_RANKS = 4096  # ranks without data drawn as grey bars up to this world size
HEAT_STOPS = ((255, 247, 236), (252, 141, 89), (127, 0, 0))  # no lateness -> most lateness
HEAT_LEVELS = 8
NO_DATA_COLOUR = "#a0a0a0"

# SVG geometry, in px.
CHART_W = 960
GUTTER = 64  # rank labels
RIGHT_MARGIN = 28  # the last tick label is centred on the plot's edge
PLOT_W = CHART_W - GUTTER - RIGHT_MARGIN
FONT_PX = 11
CHAR_W = 6.5  # the width of an average character at FONT_PX, for laying out text we cannot measure
LEGEND_H = 28
AXIS_H = 24
MAX_PITCH = 18.0
PLOT_H = 720.0  # rows shrink to fit this height, down to one px each
LABEL_MIN_GAP = 11.0
COLLECTIVE_LABEL_CHARS = 24
EXCHANGE_W = 480.0  # an all-to-all matrix's side, at most
MAX_HEAT_RANKS = 128  # ranks of an all-to-all matrix drawn (a rect per cell); the JSON has every one



class PlotDependencyError(Comm2PerfettoError, ImportError):
    """A ``.png`` or ``.svg`` was asked for and matplotlib is not installed."""


def write_plot(doc: ReportDoc, path: str | Path) -> Path:
    """Write the charts to ``path`` in the format its suffix names (:data:`SUFFIXES`); returns ``path``.

    ValueError for another suffix, :class:`PlotDependencyError` for ``.png``/``.svg`` without matplotlib.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise ValueError(f"cannot write a plot to {path.name!r}: use one of {', '.join(SUFFIXES)}")
    if suffix == ".html":
        path.write_text(render_html(doc), encoding="utf-8")
    else:
        _write_matplotlib(doc, path, suffix)
    return path


# --- what both renderers draw -------------------------------------------------------------------------------


def _steps_covered(doc: ReportDoc) -> str:
    steps = [s["step"] for s in doc["steps"]]
    numbered = sorted(s for s in steps if isinstance(s, int))
    if not numbered:
        return "no steps recorded"
    return f"{numbered[0]}-{numbered[-1]}" if len(numbered) > 1 else f"{numbered[0]}"


def plot_title(doc: ReportDoc) -> str:
    """``comm2perfetto report: run1 (2 ranks, steps 5-8, basis cpu)``: what a page or a picture covers."""
    paths = [str(p) for p in doc.get("paths") or []]
    count = len(doc["ranks"])
    steps = _steps_covered(doc)
    what = [f"{count} rank{'s' if count != 1 else ''}", steps if steps.startswith("no") else f"steps {steps}",
            f"basis {doc['basis'] or MISSING}"]
    return f"comm2perfetto report: {', '.join(paths) or 'a job'} ({', '.join(what)})"


def header_facts(doc: ReportDoc) -> list[tuple[str, str]]:
    """(label, text) lines saying what the report covers: folder, ranks, steps, basis, clocks."""
    ranks = doc["ranks"]
    world = doc["world_size"]
    with_data = ranks_text(sorted(ranks, key=rank_sort_key)) if ranks else "none"
    of = f" of world size {world}" if isinstance(world, int) and world > 0 else ""
    if doc["sampled"] and of:
        of += f" (a sample: {doc['sampled']} of these ranks only; the others are not drawn)"
    sources = sorted({s for r in ranks.values() for s in r["sources"] or ()})
    steps = doc["steps"]
    return [
        ("folder", ", ".join(str(p) for p in doc.get("paths") or []) or MISSING),
        ("ranks", f"{len(ranks)} with data ({with_data}){of}"),
        ("steps", _steps_covered(doc) + (f" ({len(steps)} steps)" if len(steps) > 1 else "")),
        ("basis", f"{doc['basis'] or MISSING}" + (f" ({', '.join(sources)})" if sources else "")),
        ("clocks", document_clock_text(doc["clock"]) or MISSING),
    ]


def missing_ranks(doc: ReportDoc) -> list[str]:
    """The ranks of the job (its world size) that are not in the document: they left no data. None of a sample:
    its other ranks were not traced, which is no fault of theirs."""
    world = doc["world_size"]
    ranks = doc["ranks"]
    if not isinstance(world, int) or world <= len(ranks) or world > MAX_NO_DATA_RANKS or doc["sampled"]:
        return []
    return [str(r) for r in range(world) if str(r) not in ranks]


def bar_segments(values: Mapping[str, Any]) -> list[tuple[str, float]]:
    """(kind, seconds) for each of :data:`SEGMENTS` of a report's ``Figures``, or of compare's step figures (which
    have no overlapped comm); missing values are 0, rounding noise below 0 too."""
    overlapped = values.get("overlapped_comm_s") or 0.0
    seconds = {
        "compute": (values.get("compute_s") or 0.0) - overlapped,
        "overlapped": overlapped,
        "exposed": values.get("exposed_comm_s") or 0.0,
        "idle": values.get("idle_s") or 0.0,
    }
    return [(kind, max(seconds[kind], 0.0)) for kind in SEGMENTS]


def sorted_ranks(doc: ReportDoc) -> list[str]:
    return sorted(doc["ranks"], key=rank_sort_key)


def rank_tooltip(rank: str, values: Figures) -> str:
    compute_only = dict(bar_segments(values))["compute"] if values["compute_s"] is not None else None
    return (f"rank {rank}: span {fmt_time(values['span_s'])}; "
            f"compute {fmt_time(values['compute_s'])} ({fmt_time(compute_only)} without comm); "
            f"comm {fmt_time(values['comm_s'])} = {fmt_time(values['overlapped_comm_s'])} overlapped"
            f" + {fmt_time(values['exposed_comm_s'])} exposed; idle {fmt_time(values['idle_s'])}; "
            f"comm/compute {fmt_ratio(values['comm_to_compute'])}; "
            f"overlap {fmt_pct(values['overlap_pct'])}")


def label_every(count: int, pitch: float) -> int:
    """Label every Nth row (N a power of two, so that node boundaries of 2^k GPUs get one)."""
    step = 1
    while step * pitch < LABEL_MIN_GAP and step < count:
        step *= 2
    return step


def row_pitch(count: int) -> float:
    return min(MAX_PITCH, max(1.0, PLOT_H / max(count, 1)))


def nice_ticks(limit: float, target: int = 6) -> list[float]:
    """0 and round steps (1, 2, 2.5 or 5 x 10^k) up to ``limit``."""
    if limit <= 0:
        return [0.0]
    raw = limit / target
    base = 10.0 ** math.floor(math.log10(raw))
    step = next(m * base for m in (1, 2, 2.5, 5, 10) if m * base >= raw)
    return [i * step for i in range(int(limit / step + 1e-9) + 1)]


def lateness_range(values: Sequence[Sequence[float | None]]) -> float:
    """The colour scale's top: the largest lateness (0 when there is none)."""
    return max((v for row in values for v in row if v is not None), default=0.0)


def heat_level(value: float | None, top: float) -> int:
    """The colour bin, 0 .. HEAT_LEVELS-1, of a lateness; -1 when unknown."""
    if value is None:
        return -1
    if top <= 0:
        return 0
    return min(int(HEAT_LEVELS * max(value, 0.0) / top), HEAT_LEVELS - 1)


def heat_colour(fraction: float) -> str:
    """The colour at ``fraction`` (0..1) of the scale, interpolated between :data:`HEAT_STOPS`."""
    position = min(max(fraction, 0.0), 1.0) * (len(HEAT_STOPS) - 1)
    i = min(int(position), len(HEAT_STOPS) - 2)
    t = position - i
    rgb = (round(a + (b - a) * t) for a, b in zip(HEAT_STOPS[i], HEAT_STOPS[i + 1]))
    return "#" + "".join(f"{c:02x}" for c in rgb)


def level_colour(level: int) -> str:
    return NO_DATA_COLOUR if level < 0 else heat_colour(level / (HEAT_LEVELS - 1))


# --- HTML and SVG -------------------------------------------------------------------------------------------

STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.6em; }
table { border-collapse: collapse; margin: 0.5em 0; }
th, td { padding: 2px 10px; border-bottom: 1px solid #ddd; text-align: right; white-space: nowrap; }
th { background: #f2f2f2; } td.text, th.text { text-align: left; }
table.header th { background: none; border: none; font-weight: 600; } table.header td { border: none; }
svg { max-width: 100%; height: auto; }
.note { color: #555; }
"""


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _num(x: float) -> str:
    """A coordinate: 2 decimals are sub-pixel and keep the file small."""
    return f"{x:.2f}".rstrip("0").rstrip(".")


def _rect(x: float, y: float, w: float, h: float, fill: str, cls: str, title: str | None = None) -> str:
    inner = f"<title>{_e(title)}</title>" if title else ""
    return (f'<rect class="{cls}" x="{_num(x)}" y="{_num(y)}" width="{_num(w)}" height="{_num(h)}" '
            f'fill="{fill}">{inner}</rect>')


def _text(x: float, y: float, text: str, anchor: str = "start", extra: str = "") -> str:
    return f'<text x="{_num(x)}" y="{_num(y)}" text-anchor="{anchor}"{extra}>{_e(text)}</text>'


def _bar_legend(no_data: bool = False) -> list[str]:
    parts, x = [], float(GUTTER)
    kinds = [(SEGMENT_COLOURS[k], SEGMENT_LABELS[k]) for k in SEGMENTS]
    for colour, label in kinds + ([(NO_DATA_COLOUR, "no data")] if no_data else []):
        parts.append(_rect(x, 6, 14, 14, colour, "swatch"))
        parts.append(_text(x + 19, 17, label))
        x += 34 + CHAR_W * len(label)
    return parts


def bars_svg(doc: ReportDoc) -> str:
    """The per-rank stacked bars as one ``<svg>`` element; ranks without data get a grey "no data" bar."""
    ranks = doc["ranks"]
    absent = missing_ranks(doc)
    order = sorted([*sorted_ranks(doc), *absent], key=rank_sort_key)
    pitch = row_pitch(len(order))
    bar_h = pitch * 0.8 if pitch >= 4 else pitch  # thin rows touch: a gap would be all one sees
    every = label_every(len(order), pitch)
    top = max((sum(s for _, s in bar_segments(ranks[r])) for r in order if r in ranks), default=0.0)
    scale = PLOT_W / top if top > 0 else 0.0
    y0 = LEGEND_H + 4
    height = y0 + pitch * len(order) + AXIS_H
    parts = _bar_legend(bool(absent))
    for i, rank in enumerate(order):
        y = y0 + i * pitch
        if rank not in ranks:
            parts.append(_rect(GUTTER, y + (pitch - bar_h) / 2, PLOT_W, bar_h, NO_DATA_COLOUR, "nodata",
                               f"rank {rank}: no data"))
            if i % every == 0:
                parts.append(_text(GUTTER - 6, y + pitch / 2 + 4, rank, "end"))
            continue
        row = [f"<title>{_e(rank_tooltip(rank, ranks[rank]))}</title>"]
        x = float(GUTTER)
        for kind, seconds in bar_segments(ranks[rank]):
            if seconds > 0:
                row.append(_rect(x, y + (pitch - bar_h) / 2, seconds * scale, bar_h, SEGMENT_COLOURS[kind],
                                 f"seg {kind}"))
                x += seconds * scale
        parts.append(f'<g class="rank">{"".join(row)}</g>')
        if i % every == 0:
            parts.append(_text(GUTTER - 6, y + pitch / 2 + 4, rank, "end"))
    axis_y = y0 + pitch * len(order)
    parts.append(f'<line x1="{GUTTER}" y1="{_num(axis_y)}" x2="{GUTTER + PLOT_W}" y2="{_num(axis_y)}" '
                 f'stroke="#444"/>')
    for tick in nice_ticks(top):
        parts.append(_text(GUTTER + tick * scale, axis_y + 16, fmt_time(tick), "middle"))
    parts.append(_text(8, y0 - 6, "rank"))
    return _svg(CHART_W, height, "time per rank", parts)


def _svg(width: float, height: float, label: str, parts: Sequence[str]) -> str:
    # Inline SVG in HTML needs no xmlns, so the page names no URL at all.
    return (f'<svg width="{_num(width)}" height="{_num(height)}" viewBox="0 0 {_num(width)} {_num(height)}" '
            f'font-family="sans-serif" font-size="{FONT_PX}" role="img" aria-label="{_e(label)}">'
            + "".join(parts) + "</svg>")


def _runs(row: Sequence[float | None], top: float) -> list[tuple[int, int, int]]:
    """(first column, column after the last, level) for each run of one colour in a heat-map row."""
    runs: list[tuple[int, int, int]] = []
    for col, value in enumerate(row):
        level = heat_level(value, top)
        if runs and runs[-1][2] == level:
            runs[-1] = (runs[-1][0], col + 1, level)
        else:
            runs.append((col, col + 1, level))
    return runs


def _cell_title(rank: Any, names: Sequence[str], row: Sequence[float | None], first: int, end: int) -> str:
    values = [v for v in row[first:end] if v is not None]
    where = names[first]
    if end - first > 1:
        where += f" .. {names[end - 1]} ({end - first} collectives)"
    if not values:
        what = "no data"
    elif min(values) == max(values):
        what = f"{fmt_time(values[0])} late"
    else:
        what = f"{fmt_time(min(values))} to {fmt_time(max(values))} late"
    return f"rank {rank}, {where}: {what}"


def _heat_legend(top: float, x: float, y: float) -> list[str]:
    """``lateness 0 [bins] <top>   [grey] no data``; each bin's tooltip gives its range."""
    parts = [_text(x, y + 11, "lateness 0")]
    x += CHAR_W * 10 + 6
    for level in range(HEAT_LEVELS):
        low, high = top * level / HEAT_LEVELS, top * (level + 1) / HEAT_LEVELS
        parts.append(_rect(x, y, 22, 14, level_colour(level), "swatch",
                           f"{fmt_time(low)} to {fmt_time(high)}"))
        x += 22
    parts.append(_text(x + 6, y + 11, fmt_time(top)))
    x += 6 + CHAR_W * len(fmt_time(top)) + 24
    parts.append(_rect(x, y, 14, 14, NO_DATA_COLOUR, "swatch"))
    parts.append(_text(x + 19, y + 11, "no data"))
    return parts


def heatmap_svg(lateness_map: LatenessMap, label: str = "lateness per rank and collective") -> str | None:
    """The lateness heat map as one ``<svg>`` element; None when the map is empty. Its columns are collectives,
    or the live windows (``live_heatmaps``)."""
    ranks: Sequence[Any] = lateness_map["ranks"]
    names: Sequence[str] = [str(n) for n in lateness_map["collectives"]]
    values: Sequence[Sequence[float | None]] = lateness_map["lateness_s"]
    if not ranks or not names or not values:
        return None
    top = lateness_range(values)
    pitch = row_pitch(len(ranks))
    cell_w = PLOT_W / len(names)  # at most 200 columns: never thinner than 4 px
    y0 = LEGEND_H + 4
    parts = _heat_legend(top, GUTTER, 6)
    every = label_every(len(ranks), pitch)
    for i, (rank, row) in enumerate(zip(ranks, values)):
        y = y0 + i * pitch
        for first, end, level in _runs(row, top):
            parts.append(_rect(GUTTER + first * cell_w, y, (end - first) * cell_w, pitch, level_colour(level),
                               "cell", _cell_title(rank, names, row, first, end)))
        if i % every == 0:
            parts.append(_text(GUTTER - 6, y + pitch / 2 + 4, str(rank), "end"))
    labels_y = y0 + pitch * len(ranks) + 6
    for col in range(0, len(names), label_every(len(names), cell_w)):
        x = GUTTER + (col + 0.5) * cell_w + 4
        parts.append(_text(x, labels_y, _short(names[col]), "end",
                           f' transform="rotate(-90 {_num(x)} {_num(labels_y)})"'))
    parts.append(_text(8, y0 - 6, "rank"))
    longest = max(len(_short(n)) for n in names)
    return _svg(CHART_W, labels_y + CHAR_W * longest + 8, label, parts)


def live_heatmaps(live: LiveWindows) -> list[str]:
    """Per group, its ranks' mean lateness in each live window (the columns: seconds after the first began)."""
    first, every = (live["windows"] or [0])[0], live["every_s"] or 0
    names = [f"+{(w - first) * every:g} s" for w in live["windows"]]
    out = []
    for g in live["groups"]:
        svg = heatmap_svg({"ranks": g["ranks"], "collectives": names, "lateness_s": g["lateness_s"]},
                          f"lateness per rank and live window on {g['desc'] or g['group']}")
        if svg is not None:
            out += [f"<h3>{_e(g['desc'] or g['group'])}</h3>", svg]
    return out


def _bytes_legend(top: int, x: float, y: float) -> list[str]:
    """``bytes 0 [bins] <top>``; each bin's tooltip gives its range."""
    parts = [_text(x, y + 11, "bytes 0")]
    x += CHAR_W * 7 + 6
    for level in range(HEAT_LEVELS):
        parts.append(_rect(x, y, 22, 14, level_colour(level), "swatch",
                           f"{fmt_bytes(top * level / HEAT_LEVELS)} to {fmt_bytes(top * (level + 1) / HEAT_LEVELS)}"))
        x += 22
    parts.append(_text(x + 6, y + 11, fmt_bytes(top)))
    return parts


def exchange_svg(x: ExchangeRow) -> str | None:
    """One all-to-all matrix as a heat map: a row per sender, a column per receiver, each cell's colour the
    bytes it sent there (``<rect class="cell">``, its tooltip the exact bytes); None past
    :data:`MAX_HEAT_RANKS` ranks or when nothing was counted."""
    ranks, sent = x["ranks"], x["sent_bytes"]
    if not x["covered"] or not ranks or len(ranks) > MAX_HEAT_RANKS:
        return None
    top = max(max(row) for row in sent)
    n = len(ranks)
    cell = max(min(MAX_PITCH * 2, EXCHANGE_W / n), 1.0)
    x0, y0 = GUTTER, LEGEND_H + 4 + AXIS_H
    parts = _bytes_legend(top, GUTTER, 6)
    every = label_every(n, cell)
    for a, (sender, row) in enumerate(zip(ranks, sent)):
        for b, value in enumerate(row):
            parts.append(_rect(x0 + b * cell, y0 + a * cell, cell, cell, level_colour(heat_level(value, top)),
                               "cell", f"rank {sender} -> rank {ranks[b]}: {fmt_bytes(value)} ({value:,} bytes)"))
        if a % every == 0:
            parts.append(_text(x0 - 6, y0 + a * cell + cell / 2 + 4, str(sender), "end"))
    for b in range(0, n, every):
        parts.append(_text(x0 + (b + 0.5) * cell, y0 - 6, str(ranks[b]), "middle"))
    parts.append(_text(8, y0 - 6, "from \\ to"))
    legend_w = CHAR_W * (7 + len(fmt_bytes(top))) + 12 + 22 * HEAT_LEVELS
    return _svg(x0 + max(n * cell, legend_w) + RIGHT_MARGIN, y0 + n * cell + 8,
                f"bytes sent per pair of ranks, {x['op']}", parts)


def _exchange_section(x: ExchangeRow) -> list[str]:
    """A matrix's heading, heat map and per-rank totals (the text's rows, without the matrix)."""
    header = ["rank", "sent", "received", "time"]
    rows = [[str(r), fmt_bytes(sum(x["sent_bytes"][a])), fmt_bytes(x["received_bytes"][a]), fmt_time(x["time_s"][a])]
            for a, r in enumerate(x["ranks"])]
    svg = exchange_svg(x)
    parts = [f"<h3>{_e(exchange_title(x))}</h3>", *(f'<p class="note">{_e(n)}</p>' for n in exchange_notes(x))]
    if svg is None and x["covered"]:
        parts.append(f'<p class="note">the matrix of {len(x["ranks"]):,} ranks is in the JSON report</p>')
    return [*parts, svg or "", _html_table(header, rows)]


def _short(name: str) -> str:
    return name if len(name) <= COLLECTIVE_LABEL_CHARS else name[: COLLECTIVE_LABEL_CHARS - 2] + ".."


def _html_table(header: Sequence[str], rows: Sequence[Sequence[str]], text_columns: int = 0) -> str:
    def cells(tag: str, values: Sequence[str]) -> str:
        return "".join(f'<{tag}{" class=text" if i < text_columns else ""}>{_e(v)}</{tag}>'
                       for i, v in enumerate(values))

    body = "".join(f"<tr>{cells('td', r)}</tr>" for r in rows)
    return f"<table><thead><tr>{cells('th', header)}</tr></thead><tbody>{body}</tbody></table>"


def _summary_table(doc: ReportDoc) -> str:
    job = doc["job"]
    header = ["ranks", "basis", "span", "compute", "comm", "overlapped comm", "exposed comm", "idle",
              "comm/compute", "overlap"]
    row = [fmt_int(job["ranks"]), str(doc["basis"] or MISSING), fmt_time(job["span_s"]),
           fmt_time(job["compute_s"]), fmt_time(job["comm_s"]), fmt_time(job["overlapped_comm_s"]),
           fmt_time(job["exposed_comm_s"]), fmt_time(job["idle_s"]),
           fmt_ratio(job["comm_to_compute"]), fmt_pct(job["overlap_pct"])]
    return _html_table(header, [row])


def _header(doc: ReportDoc) -> str:
    rows = "".join(f'<tr><th class="text">{_e(label)}</th><td class="text">{_e(text)}</td></tr>'
                   for label, text in header_facts(doc))
    return f'<table class="header">{rows}</table>'


def _ranks_table(doc: ReportDoc) -> str:
    """Every rank's numbers (the text's ranks table, none left out), then the job's row."""
    ranks = doc["ranks"]
    header = ["rank", "basis", *(h for h, _, _ in TIME_COLUMNS)]
    rows = [[r, str(ranks[r]["basis"] or MISSING), *time_cells(ranks[r])] for r in sorted_ranks(doc)]
    rows.append(["job", str(doc["basis"] or MISSING), *time_cells(doc["job"])])
    return _html_table(header, rows, text_columns=2)


def _steps_table(doc: ReportDoc) -> str:
    """The job's values per step (the text's steps table), every step."""
    header = ["step", *(h for h, _, _ in TIME_COLUMNS)]
    rows = [[fmt_int(s["step"]), *time_cells(s["job"])] for s in doc["steps"]]
    return _html_table(header, rows)


def _queued(doc: ReportDoc) -> bool:
    """Whether a trace showed the queue delay of some collective (GPU kernels): only then its column."""
    return any(c["queue_mean_s"] is not None for c in doc["collectives"])


def _collectives_table(doc: ReportDoc) -> str:
    queued = _queued(doc)
    header = ["op", "group", "n", "count", "timed", "bytes", "total", "mean", "p50", "p99", "algbw GB/s",
              "busbw GB/s", "arrival skew", *(["queue"] if queued else [])]
    rows = [[str(c["op"] or MISSING), str(c["process_group"] or MISSING), fmt_int(c["group_size"]),
             fmt_int(c["count"]), fmt_int(c["timed"]), fmt_bytes(c["bytes"]),
             fmt_time(c["total_s"]), fmt_time(c["mean_s"]), fmt_time(c["p50_s"]),
             fmt_time(c["p99_s"]), fmt_number(c["algbw_gbps"]), fmt_number(c["busbw_gbps"]),
             fmt_time(c["arrival_skew_mean_s"]), *([fmt_time(c["queue_mean_s"])] if queued else [])]
            for c in doc["collectives"]]
    return _html_table(header, rows, text_columns=2)


def _stragglers_table(doc: ReportDoc) -> str:
    header = ["rank", "matched", "last arrivals", "mean lateness", "p99 lateness"]
    rows = [[fmt_int(s["rank"]), fmt_int(s["matched"]), fmt_int(s["last_arrivals"]),
             fmt_time(s["mean_lateness_s"]), fmt_time(s["p99_lateness_s"])]
            for s in doc["stragglers"]]
    return _html_table(header, rows)


def _modules_table(doc: ReportDoc) -> str:
    header = ["module", "pass", "op", "count", "bytes", "ranks"]
    rows = [[str(m["path"] or MISSING), str(m["pass"] or MISSING), str(m["op"] or MISSING),
             fmt_int(m["count"]), fmt_bytes(m["bytes"]), fmt_int(m["ranks"])]
            for m in doc["modules"]]
    return _html_table(header, rows, text_columns=3)


def render_html(doc: ReportDoc) -> str:
    """The self-contained page :func:`write_plot` writes for ``.html``."""
    heatmap = heatmap_svg(doc["lateness_map"])
    body = [
        f"<h1>{_e(plot_title(doc))}</h1>", _header(doc),
        "<h2>Job (times: mean per rank)</h2>", _summary_table(doc),
        "<h2>Time per rank</h2>",
        '<p class="note">compute only + overlapped comm + exposed comm + idle = span; the numbers are in the table '
        "below, and on each bar when hovered</p>",
        bars_svg(doc) if doc["ranks"] else '<p class="note">no ranks</p>',
        _ranks_table(doc) if doc["ranks"] else "",
        "<h2>Steps (job values: times are means over ranks)</h2>",
        _steps_table(doc) if doc["steps"] else '<p class="note">no steps recorded</p>',
        "<h2>Lateness at each collective</h2>",
        '<p class="note">a rank\'s arrival minus the earliest arrival (on a GPU: its first kernel\'s begin)</p>',
        heatmap or '<p class="note">no lateness data (it needs collectives timed on two or more ranks)</p>',
        "<h2>Collectives (by total time)</h2>",
        '<p class="note">on a GPU, times are the collective\'s kernels; queue: mean of (first kernel begin - '
        "CPU enqueue)</p>" if _queued(doc) else "",
        _collectives_table(doc) if doc["collectives"] else '<p class="note">none</p>',
    ]
    exchanges = doc.get("all_to_all") or []
    if exchanges:
        body += ["<h2>All-to-all per peer</h2>",
                 '<p class="note">bytes each rank (row) sent to each rank (column) over the collectives counted; '
                 "time: each rank's own in them (nothing times a pair)</p>"]
        body += [part for x in exchanges for part in _exchange_section(x)]
    if doc["stragglers"]:
        body += ["<h2>Stragglers</h2>", _stragglers_table(doc)]
    live = doc.get("live")
    if live is not None:
        header, rows = live_rows(live)
        body += ["<h2>Live windows</h2>",
                 '<p class="note">what each rank\'s recorder summed up every --live-every seconds: communication '
                 "per group, and each rank's mean lateness at its group's collectives in each window (late: beyond "
                 "the window's noise, docs/live.md)</p>",
                 _html_table(header, rows, text_columns=1), *live_heatmaps(live),
                 "<ul>" + "".join(f"<li>{_e(line)}</li>" for line in live_event_lines(live)) + "</ul>"
                 if live["stragglers"] else ""]
    if doc["modules"]:
        body += ["<h2>Collectives per module</h2>", _modules_table(doc)]
    if doc["notes"]:
        body += ["<h2>Notes</h2>", "<ul>" + "".join(f"<li>{_e(n)}</li>" for n in doc["notes"]) + "</ul>"]
    return ('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f"<title>{_e(plot_title(doc))}</title><style>{STYLE}</style></head>\n<body>\n"
            + "\n".join(b for b in body if b)
            + f'\n<p class="note">report version {_e(doc.get("version", MISSING))}</p>\n</body></html>\n')


# --- matplotlib ---------------------------------------------------------------------------------------------


def _load_matplotlib(suffix: str) -> tuple[Any, Any]:
    """(Figure, FigureCanvasAgg): imported only when a chart is asked for, matplotlib being optional."""
    try:
        import matplotlib  # noqa: F401  (first, so that a blocked or missing package fails here)
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        raise PlotDependencyError(MATPLOTLIB_HINT.format(suffix=suffix)) from e
    return Figure, FigureCanvasAgg


def _time_formatter() -> Any:
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda value, _pos: fmt_time(value))


def _draw_bars(ax: Any, doc: ReportDoc) -> None:
    from matplotlib.collections import PolyCollection

    ranks = doc["ranks"]
    order = sorted_ranks(doc)
    if not order:
        ax.axis("off")
        ax.text(0.5, 0.5, "no ranks", ha="center", va="center", transform=ax.transAxes)
        return
    half = 0.4 if len(order) <= 64 else 0.5
    left = [0.0] * len(order)
    # One collection of rectangles per kind: barh would make a patch per bar, seconds for 1024 ranks.
    for kind in SEGMENTS:
        widths = [dict(bar_segments(ranks[r]))[kind] for r in order]
        boxes = [[(x, y - half), (x + w, y - half), (x + w, y + half), (x, y + half)]
                 for y, (x, w) in enumerate(zip(left, widths)) if w > 0]
        ax.add_collection(PolyCollection(boxes, facecolors=SEGMENT_COLOURS[kind], linewidths=0,
                                         label=SEGMENT_LABELS[kind]))
        left = [a + b for a, b in zip(left, widths)]
    ax.set_xlim(0, max(max(left), 1e-9) * 1.02)
    ax.set_ylim(len(order) - 0.5, -0.5)  # rank 0 on top, as in the HTML
    every = label_every(len(order), 500.0 / len(order))
    ax.set_yticks(range(0, len(order), every), order[::every])
    ax.set_ylabel("rank")
    ax.xaxis.set_major_formatter(_time_formatter())
    ax.set_title("time per rank", loc="left")
    ax.legend(loc="lower right", bbox_to_anchor=(1, 1), ncol=len(SEGMENTS), frameon=False, fontsize="small")


def _draw_heatmap(ax: Any, fig: Any, lateness_map: LatenessMap) -> None:
    import numpy as np
    from matplotlib.colors import LinearSegmentedColormap

    ranks = list(lateness_map["ranks"])
    names = [str(n) for n in lateness_map["collectives"]]
    values = lateness_map["lateness_s"]
    ax.set_title("lateness at each collective (arrival - earliest arrival)", loc="left")
    if not ranks or not names or not values:
        ax.axis("off")
        ax.text(0.5, 0.5, "no lateness data (it needs collectives timed on two or more ranks)", ha="center",
                va="center", transform=ax.transAxes)
        return
    data = np.array([[np.nan if v is None else v for v in row] for row in values], dtype=float)
    colours = [tuple(c / 255 for c in stop) for stop in HEAT_STOPS]
    cmap = LinearSegmentedColormap.from_list("lateness", colours).with_extremes(bad=NO_DATA_COLOUR)
    top = lateness_range(values)
    image = ax.imshow(np.ma.masked_invalid(data), aspect="auto", interpolation="nearest", cmap=cmap,
                      vmin=0.0, vmax=top if top > 0 else 1e-9)
    fig.colorbar(image, ax=ax, format=_time_formatter(), label="lateness (grey: no data)")
    row_every = label_every(len(ranks), 400.0 / len(ranks))
    col_every = label_every(len(names), 800.0 / len(names))
    ax.set_yticks(range(0, len(ranks), row_every), [str(r) for r in ranks[::row_every]])
    ax.set_xticks(range(0, len(names), col_every), names[::col_every], rotation=90,
                  fontsize="small" if len(names) <= 40 else "x-small")
    ax.set_ylabel("rank")


def _write_matplotlib(doc: ReportDoc, path: Path, suffix: str) -> None:
    figure_cls, canvas_cls = _load_matplotlib(suffix)
    from matplotlib import rc_context

    n_ranks = len(doc["ranks"])
    n_rows = len((doc["lateness_map"])["ranks"])
    bars_h = min(14.0, max(2.5, 0.22 * n_ranks + 1.5))
    longest = max((len(str(n)) for n in (doc["lateness_map"])["collectives"]), default=0)
    heat_h = min(14.0, max(2.5, 0.22 * n_rows + 1.5)) + 0.08 * longest  # room for the rotated labels
    # A fixed hash salt makes the SVG's element ids the same on every run.
    with rc_context({"svg.hashsalt": "comm2perfetto", "svg.fonttype": "none"}):
        fig = figure_cls(figsize=(12, bars_h + heat_h), layout="constrained")
        canvas_cls(fig)  # Agg: never a window, whatever backend the user configured
        fig.suptitle(plot_title(doc), x=0.01, ha="left", fontsize="large")
        bars_ax, heat_ax = fig.subplots(2, 1, height_ratios=[bars_h, heat_h])
        _draw_bars(bars_ax, doc)
        _draw_heatmap(heat_ax, fig, doc["lateness_map"])
        metadata = {"Date": None} if suffix == ".svg" else None
        fig.savefig(path, format=suffix[1:], dpi=100, metadata=metadata, bbox_inches="tight")
