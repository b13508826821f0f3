"""The comparison document (see :mod:`comm2perfetto.compare.document`) as text for a terminal or a CI log.

Takes the plain dict and nothing else. A headline first (``REGRESSED``, ``CHANGED`` or ``UNCHANGED``, with the
count of lines per verdict), what each side is and how their layouts differ, then the job's metrics, then
the lines of the ranks, collectives, stragglers and modules that are not ``unchanged`` (every line is in
``--format json``), the steps side by side, and a legend. The formatters are the report's, so a figure reads
the same in both::

    REGRESSED: 3 regressed, 1 improved; 58 unchanged
    BASE base (2 ranks, basis cpu, steps 2-21)   NEW late (2 ranks, basis cpu, steps 2-21)

    job (per step)
    metric          BASE     NEW   change  interval           verdict
    step_time     25.0ms  55.3ms  +121.1%  +118.2% .. +124.0%  regressed
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

from comm2perfetto.render.report_text import (
    MAX_STEPS_SHOWN,
    MISSING,
    STEPS_EACH_END,
    Row,
    fmt_bytes,
    fmt_int,
    fmt_number,
    fmt_pct,
    fmt_time,
    table,
)

UNMEASURED = "unmeasured"
Doc = Mapping[str, Any]
Line = Mapping[str, Any]
SECTION_TITLES = {"rank": "ranks", "collective": "collectives",
                  "straggler": "stragglers (wait_caused: how long the others waited for the rank in a step)",
                  "module": "modules (collectives per step issued inside each nn.Module)"}
LEGEND = ("change: the median shift between the runs (Hodges-Lehmann) and its {confidence} interval; as % of "
          "BASE's step time for times (step_time, compute, comm, exposed_comm, idle, duration, skew, wait_caused), "
          "as % of the BASE value for busbw, count and bytes, as it is for overlap (points) and comm_to_compute. "
          "{margin} is the smallest change that counts: a line is regressed or improved only when its whole "
          "interval lies beyond it. A communication time (comm, exposed_comm, duration) that moved the way compute "
          "did is judged on what moved beyond compute's (the largest shift of any rank's compute, taken off NEW's "
          "samples: beyond compute's +D). "
          "unknown (unmeasured): measured in no compared step of either run, which is not "
          "0; n counts the steps that measured a metric.")


def value_text(value: float | None, unit: str) -> str:
    """A metric's value in the report's units: 12.3ms, 1.00MB, 45.6%, 3.25 (GB/s, counts, ratios)."""
    if value is None:
        return MISSING
    if unit == "s":
        return fmt_time(value)
    if unit == "B":
        return fmt_bytes(value)
    if unit == "%":
        return fmt_pct(value)
    return fmt_number(value)


def _signed(text: str, value: float) -> str:
    return text if value < 0 or text.startswith("-") else "+" + text


def change_text(line: Line, which: str = "") -> str:
    """The change (``which`` ''), or an end of its interval (``low``/``high``), as the line measures it."""
    absolute = line[which or "change"]
    relative = line["relative" + (f"_{which}" if which else "")]
    if absolute is None:
        return MISSING
    if line["scale"] == "absolute":
        return f"{absolute:+.1f}pp" if line["unit"] == "%" else f"{absolute:+.3g}"
    if relative is not None:
        return f"{100 * relative:+.1f}%"
    return _signed(value_text(absolute, line["unit"]), absolute)


def interval_text(line: Line) -> str:
    if line["low"] is None or line["high"] is None:
        return MISSING
    if line["low"] == line["high"] == line["change"]:
        return "exact"
    return f"{change_text(line, 'low')} .. {change_text(line, 'high')}"


def context_text(line: Line) -> str:
    """What a line shows beside its metric: a duration's p99, the rank most often last at a collective."""
    context = line.get("context") or {}
    beyond = context.get("beyond_compute_s")
    load = f"beyond compute's {'+' if beyond > 0 else '-'}{fmt_time(abs(beyond))}; " if beyond else ""
    return load + _context_text(line, context)


def _context_text(line: Line, context: Mapping[str, Any]) -> str:
    if line["metric"] == "duration" and context.get("base_p50") is not None:
        return (f"one: p50 {fmt_time(context.get('base_p50'))} -> {fmt_time(context.get('new_p50'))}, "
                f"p99 {fmt_time(context.get('base_p99'))} -> {fmt_time(context.get('new_p99'))}")
    if line["metric"] == "skew" and context:
        return f"waited for: {_last_text(context.get('base_last'))} -> {_last_text(context.get('new_last'))}"
    if line["metric"] == "wait_caused" and (context.get("base") or context.get("new")):
        return f"last at {_share_text(context.get('base'))} -> {_share_text(context.get('new'))}"
    return ""


def _last_text(last: Mapping[str, Any] | None) -> str:
    return MISSING if not last else f"rank {last['rank']} ({fmt_pct(last['share_pct'])})"


def _share_text(row: Mapping[str, Any] | None) -> str:
    if not row or not row.get("matched"):
        return MISSING
    return fmt_pct(100.0 * row["last_arrivals"] / row["matched"])


def size_text(size: Any) -> str:
    """``[524288, 1048576]`` -> ``512KB-1MB``; ``all`` -> ``all sizes``."""
    if size == "all":
        return "all sizes"
    if not isinstance(size, list | tuple) or len(size) != 2:
        return "size unknown"
    return f"{_power_of_two(size[0])}-{_power_of_two(size[1])}"


def _power_of_two(n: int) -> str:
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g}{unit}"
    return f"{n}B"


def what_text(line: Line) -> str:
    """What a line is about: ``default_pg all_reduce 512KB-1MB``, ``rank 3``, ``Net.seq backward all_reduce``."""
    section = line["section"]
    if section == "collective":
        once = " (one-off: per run)" if line.get("per") == "run" else ""
        return f"{line['group']} {line['op']} {size_text(line['size'])}{once}"
    if section == "module":
        return f"{line['path']} {line['pass'] or '(no pass)'} {line['op']}"
    if section in ("rank", "straggler"):
        return f"rank {line['rank']}"
    return "job"


def metric_text(line: Line) -> str:
    return str(line["metric"])


def _row(line: Line, with_what: bool) -> list[str]:
    cells = [what_text(line)] if with_what else []
    if line["verdict"] == "unknown":  # measured nowhere: not a 0
        return [*cells, metric_text(line), UNMEASURED, UNMEASURED, MISSING, MISSING, "unknown", ""]
    return [*cells, metric_text(line), value_text(line["base"], line["unit"]), value_text(line["new"], line["unit"]),
            change_text(line), interval_text(line), str(line["verdict"]), context_text(line)]


def _table(lines: Sequence[Line], with_what: bool) -> list[str]:
    header = [*(["what"] if with_what else []), "metric", "BASE", "NEW", "change", "interval", "verdict", ""]
    aligns = ("<" if with_what else "") + "<>>>><<"
    rows: list[Row] = [_row(line, with_what) for line in lines]
    return table(header, rows, aligns)  # nothing cut: a long line loses nothing


def headline(doc: Doc) -> str:
    summary = doc.get("summary") or {}
    counts = {v: summary.get(v, 0) for v in ("regressed", "improved", "new", "gone", "inconclusive", "unknown")}
    shown = ", ".join(f"{n} {v}" for v, n in counts.items() if n)
    unchanged = summary.get("unchanged", 0)
    if counts["regressed"]:
        head = "REGRESSED"
    elif counts["improved"] or counts["new"] or counts["gone"]:
        head = "CHANGED"
    else:
        head = "UNCHANGED"
    tail = f"{unchanged} unchanged" + (f", {shown}" if shown and head == "UNCHANGED" else "")
    cause = f" -- {doc['cause']}" if doc.get("cause") else ""
    return f"{head}{cause}: {shown}; {tail}" if head != "UNCHANGED" else (
        f"UNCHANGED: no change beyond noise and the {doc.get('min_change_pct', 0):g}% margin ({tail}){cause}")


def _side_text(role: str, side: Mapping[str, Any]) -> str:
    ranks = side.get("ranks") or []
    steps = side.get("steps") or []
    parts = [f"{len(ranks)} rank{'s' if len(ranks) != 1 else ''}"]
    if side.get("world_size") is not None and side["world_size"] != len(ranks):
        parts.append(f"world size {side['world_size']}")
    parts.append(f"basis {side.get('basis') or MISSING}")
    parts.append(f"steps {min(steps)}-{max(steps)}" if steps else "no steps")
    return f"{role} {side.get('path')} ({', '.join(parts)})"


def _header(doc: Doc, width: int) -> list[str]:
    lines = [headline(doc), _side_text("BASE", doc.get("base") or {}), _side_text("NEW", doc.get("new") or {})]
    for note in doc.get("layout") or []:
        lines += textwrap.wrap(f"layout: {note}", width, subsequent_indent="  ")
    return lines


def _job_section(lines: Sequence[Line], per_step: bool) -> list[str]:
    job = [line for line in lines if line["section"] == "job"]
    if not job:
        return []
    title = "job (median per step)" if per_step else "job (whole run: one value per side)"
    return [title, *_table(job, False)]


def _changes_section(section: str, lines: Sequence[Line]) -> list[str]:
    mine = [line for line in lines if line["section"] == section]
    shown = [line for line in mine if line["verdict"] != "unchanged"]
    if not mine:
        return []
    title = SECTION_TITLES[section]
    if not shown:
        return [f"{title}: {_lines(len(mine))}, all unchanged" if len(mine) > 1 else f"{title}: 1 line, unchanged"]
    quiet = len(mine) - len(shown)
    unknown = sum(1 for line in shown if line["verdict"] == "unknown")
    others = [f"{quiet} unchanged"] * bool(quiet) + [f"{unknown} unknown"] * bool(unknown)
    return [f"{title}: {len(shown) - unknown} of {_lines(len(mine))} changed"
            + (f" ({', '.join(others)})" if others else ""), *_table(shown, True)]


def _lines(n: int) -> str:
    return f"{n} line{'s' if n != 1 else ''}"


def _steps_section(doc: Doc) -> list[str]:
    steps: Sequence[Mapping[str, Any]] = doc.get("steps") or []
    if not steps:
        return []
    rows: list[Row] = []
    for s in steps:
        b, n = s.get("base") or {}, s.get("new") or {}
        rows.append([fmt_int(s.get("base_step")), fmt_int(s.get("new_step")), fmt_time(b.get("span_s")),
                     fmt_time(n.get("span_s")), fmt_time(b.get("exposed_comm_s")), fmt_time(n.get("exposed_comm_s"))])
    if len(rows) > MAX_STEPS_SHOWN:
        hidden = len(rows) - 2 * STEPS_EACH_END
        rows = [*rows[:STEPS_EACH_END], f"  ... {hidden} steps in between", *rows[-STEPS_EACH_END:]]
    header = ["BASE step", "NEW step", "step time", "NEW", "exposed comm", "NEW"]
    return ["steps side by side (job values, means over ranks)", *table(header, rows, ">" * 6)]


def _notes(doc: Doc, width: int) -> list[str]:
    notes: Sequence[str] = doc.get("notes") or []
    lines = ["notes"] if notes else []
    for note in notes:
        lines += textwrap.wrap(str(note), width, initial_indent="- ", subsequent_indent="  ")
    return lines


def legend_text(doc: Doc) -> str:
    return LEGEND.format(confidence=f"{100 * (doc.get('confidence') or 0):g}%",
                         margin=f"{doc.get('min_change_pct', 0):g}% (or points)")


def render_text(doc: Doc, *, width: int = 120) -> str:
    """The whole comparison as text, sections separated by blank lines, ending with a newline."""
    lines: Sequence[Line] = doc.get("lines") or []
    per_step = bool((doc.get("base") or {}).get("steps")) and bool((doc.get("new") or {}).get("steps"))
    sections = [_header(doc, width), _job_section(lines, per_step),
                *(_changes_section(s, lines) for s in SECTION_TITLES),
                _steps_section(doc), _notes(doc, width), textwrap.wrap(legend_text(doc), width)]
    text = "\n\n".join("\n".join(line.rstrip() for line in s) for s in sections if s)
    return text + "\n"

