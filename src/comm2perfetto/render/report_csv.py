"""The report document's tables as CSV: one file per table, for spreadsheets and pandas.

Takes the plain dict (see :mod:`comm2perfetto.report.document`) and nothing else. Tables: ``ranks`` and
``collectives`` always, ``steps`` and ``modules`` when the document has rows for them. Column names are the
document's keys, whose suffixes carry the units (``span_s`` seconds, ``overlap_pct`` percent, ``algbw_gbps``
GB/s, ``bytes``); numbers are written at full precision (``repr``), so they read back to the same floats; an
unknown value is an empty cell.

Example::

    doc = {"ranks": {"0": {"span_s": 1.2, "compute_s": 0.9, ..., "basis": "gpu", "sources": ["kineto"]}},
           "collectives": [{"op": "all_reduce", "process_group": "0 (default_pg)", "group_size": 2, ...}], ...}
    render_csv(doc)["ranks"]  # 'rank,basis,span_s,compute_s,...\\n0,gpu,1.2,0.9,...\\n'
    write_csv(doc, "out.csv")  # [Path('out.ranks.csv'), Path('out.collectives.csv')]
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from comm2perfetto.render.report_text import rank_sort_key
from comm2perfetto.report_doc import FIGURES, ReportDoc

__all__ = ["COLLECTIVE_COLUMNS", "MODULE_COLUMNS", "RANK_COLUMNS", "STEP_COLUMNS", "render_csv", "render_csv_stdout",
           "write_csv"]

RANK_COLUMNS = ("rank", "basis", *FIGURES, "sources")
STEP_COLUMNS = ("step", "rank", *FIGURES)
COLLECTIVE_COLUMNS = ("op", "process_group", "group_size", "count", "timed", "bytes", "total_s", "mean_s",
                      "p50_s", "p99_s", "transfer_s", "algbw_gbps", "busbw_gbps", "arrival_skew_mean_s",
                      "queue_mean_s")
MODULE_COLUMNS = ("path", "pass", "op", "count", "bytes", "ranks")
SOURCES_SEPARATOR = "; "  # a rank's sources are a list: one cell, joined



def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)  # the shortest text that reads back to the same float
    return str(value)


def csv_text(columns: Sequence[str], rows: Iterable[Mapping[str, Any]]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(columns)
    writer.writerows([_cell(row.get(c)) for c in columns] for row in rows)
    return buffer.getvalue()


def _rank_rows(doc: ReportDoc) -> list[dict[str, Any]]:
    ranks = doc["ranks"]
    return [{**ranks[r], "rank": r, "sources": SOURCES_SEPARATOR.join(ranks[r]["sources"])}
            for r in sorted(ranks, key=rank_sort_key)]


def _step_rows(doc: ReportDoc) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for step in doc["steps"]:
        rows.append({**step["job"], "step": step["step"], "rank": "job"})
        per_rank = step["ranks"]
        rows.extend({**per_rank[r], "step": step["step"], "rank": r} for r in sorted(per_rank, key=rank_sort_key))
    return rows


def render_csv(doc: ReportDoc) -> dict[str, str]:
    """Table name -> CSV text (header row first, ``\\n`` line ends): ranks, collectives[, steps][, modules]."""
    tables = {
        "ranks": csv_text(RANK_COLUMNS, _rank_rows(doc)),
        "collectives": csv_text(COLLECTIVE_COLUMNS, doc["collectives"]),
    }
    if doc["steps"]:
        tables["steps"] = csv_text(STEP_COLUMNS, _step_rows(doc))
    if doc["modules"]:
        tables["modules"] = csv_text(MODULE_COLUMNS, doc["modules"])
    return tables


def render_csv_stdout(doc: ReportDoc) -> str:
    """What ``--format csv`` without ``-o`` prints: the ranks table, a blank line, the collectives table."""
    tables = render_csv(doc)
    return tables["ranks"] + "\n" + tables["collectives"]


def table_paths(path: str | Path, names: Iterable[str]) -> dict[str, Path]:
    """``out.csv`` -> ``{"ranks": out.ranks.csv, ...}``, next to ``path`` (a name without ``.csv`` keeps it)."""
    path = Path(path)
    stem = path.name[: -len(".csv")] if path.name.lower().endswith(".csv") else path.name
    return {name: path.with_name(f"{stem}.{name}.csv") for name in names}


def write_csv(doc: ReportDoc, path: str | Path) -> list[Path]:
    """Write every table of :func:`render_csv` to its own file next to ``path``; the paths written, in order."""
    return write_tables(render_csv(doc), path)


def write_tables(tables: Mapping[str, str], path: str | Path) -> list[Path]:
    """Each CSV text to ``<stem>.<name>.csv`` next to ``path``; the paths written, in order."""
    paths = table_paths(path, tables)
    for name, text in tables.items():
        paths[name].write_text(text, encoding="utf-8", newline="")
    return list(paths.values())
