"""The comparison document's tables as CSV: ``lines`` (every line, every verdict) and ``steps``.

Takes the plain dict (see :mod:`comm2perfetto.compare.document`) and nothing else. Column names are the
document's keys; a line's size bucket is two columns (``size_min``, ``size_max``: ``[min, max)`` bytes, both
``all`` for a (group, op)'s totals); an unknown value is an empty cell; numbers at full precision, as the
report's CSV writes them::

    render_csv(doc)["lines"]  # 'section,group,op,size_min,size_max,rank,path,pass,metric,unit,...'
    write_csv(doc, "cmp.csv")  # [Path('cmp.lines.csv'), Path('cmp.steps.csv')]
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from comm2perfetto.render.report_csv import csv_text, write_tables

LINE_COLUMNS = ("section", "group", "op", "size_min", "size_max", "rank", "path", "pass", "metric", "unit", "base",
                "new", "base_n", "new_n", "change", "low", "high", "relative", "relative_low", "relative_high",
                "scale", "verdict")
STEP_FIGURES = ("span_s", "compute_s", "comm_s", "exposed_comm_s", "idle_s", "overlap_pct")
STEP_COLUMNS = ("base_step", "new_step", *(f"{side}_{k}" for k in STEP_FIGURES for side in ("base", "new")))

Doc = Mapping[str, Any]


def _line_row(line: Mapping[str, Any]) -> dict[str, Any]:
    size = line.get("size")
    low, high = (size, size) if isinstance(size, str) else (size or (None, None))
    return {**line, "size_min": low, "size_max": high}


def _step_row(step: Mapping[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = {"base_step": step.get("base_step"), "new_step": step.get("new_step")}
    for side in ("base", "new"):
        figures = step.get(side) or {}
        row.update({f"{side}_{k}": figures.get(k) for k in STEP_FIGURES})
    return row


def render_csv(doc: Doc) -> dict[str, str]:
    """Table name -> CSV text: ``lines``, and ``steps`` when steps were paired."""
    tables = {"lines": csv_text(LINE_COLUMNS, [_line_row(line) for line in doc.get("lines") or []])}
    if doc.get("steps"):
        tables["steps"] = csv_text(STEP_COLUMNS, [_step_row(s) for s in doc["steps"]])
    return tables


def render_csv_stdout(doc: Doc) -> str:
    """What ``--format csv`` without ``-o`` prints: the lines table."""
    return render_csv(doc)["lines"]


def write_csv(doc: Doc, path: str | Path) -> list[Path]:
    """Write each table next to ``path`` (``cmp.csv`` -> ``cmp.lines.csv``, ``cmp.steps.csv``)."""
    return write_tables(render_csv(doc), path)
