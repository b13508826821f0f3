"""The comparison document as one self-contained HTML page: the two runs side by side.

Takes the plain dict (see :mod:`comm2perfetto.compare.document`) and nothing else. No script, stylesheet or
font to fetch, so it opens offline, like the report's page (whose SVG helpers and colours it uses):

- the headline and what each side is;
- **steps side by side**: per compared step pair, BASE's bar over NEW's, stacked as the report stacks a
  rank's time (compute only, overlapped comm, exposed comm, idle), job values; each pair's ``<g
  class="pair">`` has a ``<title>`` tooltip with both steps' numbers;
- **the job's metrics**, then every other line that is not ``unchanged`` (``<tr class="VERDICT">``: regressed
  red, improved green, new blue, gone grey, inconclusive amber), and, folded, every line of each section.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from comm2perfetto.render.compare_text import (
    change_text,
    context_text,
    headline,
    interval_text,
    legend_text,
    metric_text,
    value_text,
    what_text,
)
from comm2perfetto.render.report_plot import (
    CHART_W,
    GUTTER,
    LEGEND_H,
    PLOT_W,
    SEGMENT_COLOURS,
    STYLE,
    _bar_legend,
    _e,
    _num,
    _rect,
    _svg,
    _text,
    bar_segments,
    nice_ticks,
)
from comm2perfetto.render.report_text import fmt_time

VERDICT_COLOURS = {"regressed": "#f8d0c8", "improved": "#cfeedd", "new": "#d4e4f7", "gone": "#e4e4e4",
                   "inconclusive": "#fbeac0", "unknown": "#eeeeee", "unchanged": "#ffffff"}
BAR_H = 9.0
PAIR_GAP = 8.0
COMPARE_STYLE = "".join(f"tr.{v} td {{ background: {c}; }}\n" for v, c in VERDICT_COLOURS.items()) + \
    "details { margin: 0.4em 0; } summary { cursor: pointer; }\n"

Doc = Mapping[str, Any]


def steps_svg(doc: Doc) -> str | None:
    """BASE's and NEW's bars for every paired step, as one ``<svg>``; None without paired steps."""
    steps: Sequence[Mapping[str, Any]] = doc.get("steps") or []
    if not steps:
        return None
    bars = [[bar_segments(s.get("base") or {}), bar_segments(s.get("new") or {})] for s in steps]
    top = max(sum(seconds for _, seconds in bar) for pair in bars for bar in pair)
    scale = PLOT_W / top if top > 0 else 0.0
    pitch = 2 * BAR_H + PAIR_GAP
    y0 = LEGEND_H + 4
    parts = _bar_legend()
    for i, (step, pair) in enumerate(zip(steps, bars)):
        y = y0 + i * pitch
        group = [f"<title>{_e(_pair_tooltip(step))}</title>"]
        for j, bar in enumerate(pair):
            x = float(GUTTER)
            for kind, seconds in bar:
                if seconds > 0:
                    group.append(_rect(x, y + j * BAR_H, seconds * scale, BAR_H - 1, SEGMENT_COLOURS[kind],
                                       f"seg {kind} {'base' if j == 0 else 'new'}"))
                    x += seconds * scale
        parts.append(f'<g class="pair">{"".join(group)}</g>')
        label = f"{step.get('base_step')}" if step.get("base_step") == step.get("new_step") else \
            f"{step.get('base_step')}:{step.get('new_step')}"
        parts.append(_text(GUTTER - 6, y + BAR_H + 4, label, "end"))
    axis_y = y0 + pitch * len(steps)
    parts.append(f'<line x1="{GUTTER}" y1="{_num(axis_y)}" x2="{GUTTER + PLOT_W}" y2="{_num(axis_y)}" '
                 'stroke="#444"/>')
    for tick in nice_ticks(top):
        parts.append(_text(GUTTER + tick * scale, axis_y + 16, fmt_time(tick), "middle"))
    parts.append(_text(8, y0 - 6, "step"))
    return _svg(CHART_W, axis_y + 24, "steps of BASE and NEW side by side", parts)


def _pair_tooltip(step: Mapping[str, Any]) -> str:
    texts = []
    for side, name in (("base", "BASE"), ("new", "NEW")):
        f = step.get(side) or {}
        texts.append(f"{name} step {step.get(side + '_step')}: span {fmt_time(f.get('span_s'))}, compute "
                     f"{fmt_time(f.get('compute_s'))}, comm {fmt_time(f.get('comm_s'))}, exposed "
                     f"{fmt_time(f.get('exposed_comm_s'))}, idle {fmt_time(f.get('idle_s'))}")
    return "; ".join(texts)


def lines_table(lines: Sequence[Mapping[str, Any]], with_what: bool = True) -> str:
    """The lines as an HTML table, each row classed (and coloured) by its verdict."""
    header = [*(["what"] if with_what else []), "metric", "BASE", "NEW", "change", "interval", "verdict", ""]
    left = {*range(1 + with_what), len(header) - 1}  # what, metric and the context read as text
    head = "".join(f'<th{" class=text" if i in left else ""}>{_e(h)}</th>' for i, h in enumerate(header))
    rows = []
    for line in lines:
        cells = [*([what_text(line)] if with_what else []), metric_text(line), value_text(line["base"], line["unit"]),
                 value_text(line["new"], line["unit"]), change_text(line), interval_text(line), line["verdict"],
                 context_text(line)]
        tds = "".join(f'<td{" class=text" if i in left else ""}>{_e(c)}</td>' for i, c in enumerate(cells))
        rows.append(f'<tr class="{_e(line["verdict"])}">{tds}</tr>')
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _side(role: str, side: Mapping[str, Any]) -> str:
    steps = side.get("steps") or []
    return (f"<li><b>{role}</b> {_e(side.get('path'))}: {len(side.get('ranks') or [])} ranks, basis "
            f"{_e(side.get('basis'))}, " + (f"steps {min(steps)}-{max(steps)}" if steps else "no steps") + "</li>")


def render_html(doc: Doc) -> str:
    """The self-contained page ``compare --plot`` writes."""
    lines: Sequence[Mapping[str, Any]] = doc.get("lines") or []
    job = [line for line in lines if line["section"] == "job"]
    others = [line for line in lines if line["section"] != "job"]
    changed = [line for line in others if line["verdict"] != "unchanged"]
    chart = steps_svg(doc)
    body = [
        "<h1>comm2perfetto compare</h1>",
        f"<p><b>{_e(headline(doc))}</b></p>",
        "<ul>" + _side("BASE", doc.get("base") or {}) + _side("NEW", doc.get("new") or {}) + "</ul>",
        *(f'<p class="note">layout: {_e(n)}</p>' for n in doc.get("layout") or []),
        "<h2>Steps side by side</h2>",
        '<p class="note">each step: BASE above, NEW below; compute only + overlapped comm + exposed comm + idle '
        "= step time (job values, means over ranks); hover a pair for numbers</p>",
        chart or '<p class="note">no steps paired</p>',
        "<h2>Job</h2>", lines_table(job, with_what=False) if job else '<p class="note">none</p>',
        "<h2>Changes</h2>",
        lines_table(changed) if changed else '<p class="note">every other line is unchanged</p>',
    ]
    for section in ("rank", "collective", "straggler", "module"):
        mine = [line for line in others if line["section"] == section]
        if mine:
            body.append(f"<details><summary>every {section} line ({len(mine)})</summary>{lines_table(mine)}"
                        "</details>")
    notes = [*(doc.get("notes") or []), legend_text(doc)]
    body += ["<h2>Notes</h2>", "<ul>" + "".join(f"<li>{_e(n)}</li>" for n in notes) + "</ul>"]
    return ('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f"<title>comm2perfetto compare</title><style>{STYLE}{COMPARE_STYLE}</style></head>\n<body>\n"
            + "\n".join(body) + f'\n<p class="note">compare version {_e(doc.get("version", "-"))}</p>'
            "\n</body></html>\n")


def write_html(doc: Doc, path: str | Path) -> Path:
    path = Path(path)
    path.write_text(render_html(doc), encoding="utf-8")
    return path
