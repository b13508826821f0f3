"""A saved ``comm2perfetto report --format json``, read back for ``compare``: checked once, here.

The document is the contract of docs/report.md; a file copied around may be another tool's JSON, cut short,
hand-edited or crafted. :func:`read_report_json` returns None for JSON that is no report document (a profiler
trace: the caller reads it as one), raises :class:`ReportFormatError` for a report it cannot use, and
otherwise returns the document with every part ``compare`` reads checked for type and range: a bad row is
dropped and counted in one note, a bad value becomes None (unknown). Raw shape (abridged)::

    {"version": 1, "basis": "cpu", "world_size": 2,
     "ranks": {"0": {"span_s": 0.42, "exposed_comm_s": 0.05, ...}},
     "steps": [{"step": 3, "job": {"span_s": 0.02, ...}, "ranks": {"0": {...}}}],
     "collectives": [{"op": "all_reduce", "process_group": "default_pg", "group_uid": "0[0,1]", "group_size": 2,
                      "count": 24, "bytes": 96, "instances": {"seq": [1, 2], "step": [1, 2], ...}}],
     "groups": {"0[0,1]": {"name": "0", "desc": "default_pg", "ranks": [0, 1]}},
     "stragglers": [{"rank": 1, "matched": 76, "last_arrivals": 40, "mean_lateness_s": 0.004}],
     "modules": [{"path": "Net.seq", "pass": "backward", "op": "all_reduce", "count": 8, "bytes": 4096}],
     "notes": []}
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import orjson

from comm2perfetto.errors import Comm2PerfettoError
from comm2perfetto.report_doc import (
    INSTANCE_COLUMNS,
    VERSION,
    GroupRow,
    Instances,
    SavedCollective,
    SavedFigures,
    SavedModule,
    SavedReport,
    SavedStep,
    SavedStraggler,
)
from comm2perfetto.sources.limits import MAX_WORLD_SIZE, TooLargeError, count_ok, rank_ok, read_bounded, shown

MAX_STEP = 1 << 40  # step numbers come from counters: far below this


class ReportFormatError(Comm2PerfettoError, ValueError):
    """A report document ``compare`` cannot use (a newer version, the wrong shape): one line for the user."""


def read_report_json(path: Path) -> SavedReport | None:
    """The checked report document in ``path``, or None when the file holds JSON that is not one. Raises
    OSError, TooLargeError or ReportFormatError."""
    data = read_bounded(path)
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    if not (isinstance(doc, dict) and "version" in doc and "ranks" in doc and "job" in doc):
        return None
    return check_report(doc)


def check_report(doc: Mapping[str, Any]) -> SavedReport:
    """The parts of a report document ``compare`` reads, checked (see the module docstring)."""
    version = doc.get("version")
    if type(version) is not int or version < 1:
        raise ReportFormatError(f"'version' is {shown(version)}, not a report version")
    if version > VERSION:
        raise ReportFormatError(f"report version {version} is newer than this comm2perfetto reads ({VERSION}): "
                                "upgrade comm2perfetto")
    dropped: dict[str, int] = {}
    notes = [n for n in doc.get("notes") or [] if isinstance(n, str)] if isinstance(doc.get("notes"), list) else []
    out: SavedReport = {
        "version": version,
        "basis": doc.get("basis") if isinstance(doc.get("basis"), str) else None,
        "world_size": doc.get("world_size") if rank_ok(doc.get("world_size"), MAX_WORLD_SIZE + 1) else None,
        "job": _figures(doc.get("job")),
        "ranks": _ranks(doc.get("ranks"), dropped, "ranks"),
        "steps": _rows(doc.get("steps"), _step, dropped, "steps"),
        "collectives": _rows(doc.get("collectives"), _collective, dropped, "collectives"),
        "groups": _groups(doc.get("groups"), dropped),
        "stragglers": _rows(doc.get("stragglers"), _straggler, dropped, "stragglers"),
        "modules": _rows(doc.get("modules"), _module, dropped, "modules"),
        "notes": notes,
    }
    if dropped:
        notes.append("rows not read from the saved report (wrong types or values): "
                            + ", ".join(f"{n} of {what}" for what, n in dropped.items()))
    return out


def _number(value: Any) -> float | None:
    """A finite number, or None."""
    if type(value) in (int, float) and math.isfinite(value):
        return float(value)
    return None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and len(value) < 4096 else None


def _figures(value: Any) -> SavedFigures:
    get = value.get if isinstance(value, dict) else {}.get
    return {"span_s": _number(get("span_s")), "compute_s": _number(get("compute_s")), "comm_s": _number(get("comm_s")),
            "overlapped_comm_s": _number(get("overlapped_comm_s")), "exposed_comm_s": _number(get("exposed_comm_s")),
            "idle_s": _number(get("idle_s")), "comm_to_compute": _number(get("comm_to_compute")),
            "overlap_pct": _number(get("overlap_pct"))}


def _ranks(value: Any, dropped: dict[str, int], what: str) -> dict[str, SavedFigures]:
    if not isinstance(value, dict):
        return {}
    out = {}
    for key, row in value.items():
        if isinstance(key, str) and key.isdigit() and rank_ok(int(key)) and isinstance(row, dict):
            out[str(int(key))] = _figures(row)
        else:
            dropped[what] = dropped.get(what, 0) + 1
    return out


_Row = TypeVar("_Row")


def _rows(value: Any, check: Callable[[dict, dict[str, int]], _Row | None], dropped: dict[str, int],
          what: str) -> list[_Row]:
    out = []
    for row in value if isinstance(value, list) else []:
        checked = check(row, dropped) if isinstance(row, dict) else None
        if checked is None:
            dropped[what] = dropped.get(what, 0) + 1
        else:
            out.append(checked)
    return out


def _step(row: dict, dropped: dict[str, int]) -> SavedStep | None:
    step = row.get("step")
    if type(step) is not int or not 0 <= step <= MAX_STEP:
        return None
    return {"step": step, "job": _figures(row.get("job")), "ranks": _ranks(row.get("ranks"), dropped, "step ranks")}


def _collective(row: dict, dropped: dict[str, int]) -> SavedCollective | None:
    op, group = _text(row.get("op")), _text(row.get("process_group"))
    if op is None or group is None:
        return None
    return {"op": op, "process_group": group, "group_uid": _text(row.get("group_uid")),
            "group_size": row.get("group_size") if rank_ok(row.get("group_size"), MAX_WORLD_SIZE + 1) else None,
            "count": row.get("count") if count_ok(row.get("count")) else None,
            "bytes": row.get("bytes") if count_ok(row.get("bytes")) else None,
            "instances": _instances(row.get("instances"))}


def _instances(value: Any) -> Instances | None:
    """The columns (``INSTANCE_COLUMNS``), all of one length, each value checked; None when absent (a report
    saved before they existed) or unusable."""
    if not isinstance(value, dict):
        return None
    columns = [column for key in INSTANCE_COLUMNS if isinstance(column := value.get(key), list)]
    if len(columns) != len(INSTANCE_COLUMNS) or len({len(c) for c in columns}) != 1:
        return None
    seq, step, nbytes, duration, transfer, algbw, busbw, skew, last = columns
    return {"seq": _counts(seq), "step": [v if type(v) is int and 0 <= v <= MAX_STEP else None for v in step],
            "bytes": _counts(nbytes), "duration_s": _amounts(duration), "transfer_s": _amounts(transfer),
            "algbw_gbps": _amounts(algbw), "busbw_gbps": _amounts(busbw), "arrival_skew_s": _amounts(skew),
            "last_rank": [v if rank_ok(v) else None for v in last]}


def _counts(column: list) -> list[int | None]:
    return [v if count_ok(v) else None for v in column]


def _amounts(column: list) -> list[float | None]:
    """Times and bandwidths: finite and not negative."""
    return [v if v is not None and v >= 0 else None for v in map(_number, column)]


def _groups(value: Any, dropped: dict[str, int]) -> dict[str, GroupRow]:
    if not isinstance(value, dict):
        return {}
    out: dict[str, GroupRow] = {}
    for uid, group in value.items():
        ranks = group.get("ranks") if isinstance(group, dict) else None
        if (isinstance(uid, str) and isinstance(ranks, list) and len(ranks) <= MAX_WORLD_SIZE
                and all(rank_ok(r) for r in ranks)):
            out[uid] = {"name": _text(group.get("name")) or "", "desc": _text(group.get("desc")) or "",
                        "ranks": sorted(set(ranks))}
        else:
            dropped["groups"] = dropped.get("groups", 0) + 1
    return out


def _straggler(row: dict, _dropped: dict[str, int]) -> SavedStraggler | None:
    rank, matched, last = row.get("rank"), row.get("matched"), row.get("last_arrivals")
    if not (rank_ok(rank) and count_ok(matched) and count_ok(last)) or int(last or 0) > int(matched or 0):
        return None
    return {"rank": rank, "matched": matched, "last_arrivals": last,
            "mean_lateness_s": _number(row.get("mean_lateness_s"))}


def _module(row: dict, _dropped: dict[str, int]) -> SavedModule | None:
    path, op, count = _text(row.get("path")), _text(row.get("op")), row.get("count")
    pass_ = row.get("pass")
    if path is None or op is None or not count_ok(count) or not (pass_ is None or _text(pass_) is not None):
        return None
    return {"path": path, "pass": pass_, "op": op, "count": count,
            "bytes": row.get("bytes") if count_ok(row.get("bytes")) else None}


__all__ = ["ReportFormatError", "TooLargeError", "check_report", "read_report_json"]
