"""A gathered window (sources/live_window.py) as Prometheus metrics: the text exposition format that
node_exporter's textfile collector reads (``metrics.prom``). Figures of the last window; a figure that is not
known (a call whose completion was not seen, a rank whose clock is not trusted) has no sample, never a 0.

Every sample is labelled ``rank`` and ``host``; per group ``group`` (c10d's name) and ``group_desc``; per op
``op`` (the torch.distributed function). Only the ranks of the folder that wrote the window (its host's) are
exported, so summing over a cluster's nodes counts each rank once. docs/live.md lists the metrics::

    # HELP comm2perfetto_comm_seconds Time in the calls that completed in the last window (their completion seen)
    # TYPE comm2perfetto_comm_seconds gauge
    comm2perfetto_comm_seconds{rank="2",host="node1",group="0",group_desc="default_pg",op="all_reduce"} 0.566132
"""

from __future__ import annotations

from collections.abc import Iterable

from comm2perfetto.model import op_family
from comm2perfetto.report.bandwidth import bus_factor
from comm2perfetto.sources.live_window import Window

PREFIX = "comm2perfetto_"
# name -> help; the order they are written in
METRICS = {
    "window_end_timestamp_seconds": "When the last gathered window ended (Unix time, the job's clock)",
    "window_seconds": "Length of the rank's last window",
    "steps": "Training steps that began in the last window",
    "step_seconds": "Median step time in the last window",
    "comm_calls": "Communication calls that completed in the last window",
    "comm_bytes": "Input bytes of those calls",
    "comm_seconds": "Time in the calls that completed in the last window (their completion seen)",
    "bus_bandwidth_bytes_per_second": "nccl-tests bus bandwidth of those calls, from this rank's own time in them",
    "exposed_comm_share": "Share of the last window the training thread waited in communication",
    "lateness_seconds": "Mean arrival at the group's collectives after the earliest member, last window",
    "last_arrival_share": "Share of the group's collectives this rank arrived last at, last window",
    "straggler": "1 while the rank is a straggler of the group (late in 2 of its last 3 windows), else 0",
}
_GATHERED = ("gather", "all_gather")  # S, as nccl-tests counts it, is n x each rank's input


def metrics_text(window: Window) -> str:
    """The metrics of the window's detail ranks (the writing folder's), in the exposition format."""
    mine = sorted({row.rank for row in window.detail})
    ranks = {r.rank: r for r in window.ranks if r.rank in mine}
    samples: dict[str, list[tuple[dict[str, str], float]]] = {name: [] for name in METRICS}
    if window.end_ns is not None:
        samples["window_end_timestamp_seconds"].append(({}, window.end_ns / 1e9))
    for rank, row in ranks.items():
        labels = {"rank": str(rank), "host": row.host}
        if row.window_s is not None:
            samples["window_seconds"].append((labels, row.window_s))
            if row.exposed_s is not None and row.window_s > 0:
                samples["exposed_comm_share"].append((labels, min(row.exposed_s / row.window_s, 1.0)))
        if row.steps is not None:
            samples["steps"].append((labels, row.steps))
        if row.step_s is not None:
            samples["step_seconds"].append((labels, row.step_s))
    sizes = window.group_sizes()
    for op in window.detail:
        host = ranks[op.rank].host if op.rank in ranks else ""
        labels = {"rank": str(op.rank), "host": host, "group": op.group, "group_desc": op.desc, "op": op.op}
        samples["comm_calls"].append((labels, op.calls))
        if op.bytes is not None:
            samples["comm_bytes"].append((labels, op.bytes))
        if op.time_s is not None:
            samples["comm_seconds"].append((labels, op.time_s))
            n = sizes.get(op.group, 0)
            factor = bus_factor(op.op, n)
            if op.bytes is not None and op.time_s > 0 and factor is not None:
                size = op.bytes * n if op_family(op.op) in _GATHERED else op.bytes
                samples["bus_bandwidth_bytes_per_second"].append((labels, size / op.time_s * factor))
    active = {(rank, group) for rank, group, _ in window.stragglers}
    for group in window.groups:
        for m in group.members:
            if m.rank not in ranks:
                continue
            labels = {"rank": str(m.rank), "host": ranks[m.rank].host, "group": group.group,
                      "group_desc": group.desc}
            if m.mean_s is not None:
                samples["lateness_seconds"].append((labels, m.mean_s))
            if m.last_share is not None:
                samples["last_arrival_share"].append((labels, m.last_share))
            if m.late is not None or (m.rank, group.group) in active:
                samples["straggler"].append((labels, 1 if (m.rank, group.group) in active else 0))
    return "".join(_family(name, values) for name, values in samples.items() if values)


def _family(name: str, samples: Iterable[tuple[dict[str, str], float]]) -> str:
    lines = [f"# HELP {PREFIX}{name} {METRICS[name]}\n", f"# TYPE {PREFIX}{name} gauge\n"]
    for labels, value in samples:
        text = ",".join(f'{key}="{_escaped(v)}"' for key, v in labels.items())
        lines.append(f"{PREFIX}{name}{{{text}}} {_number(value)}\n" if text else f"{PREFIX}{name} {_number(value)}\n")
    return "".join(lines)


def _number(value: float) -> str:
    """A sample value: an integer as one, else to the nanosecond.

    >>> _number(86), _number(1795908640.0), _number(0.566131676), _number(1 / 3)
    ('86', '1795908640', '0.566131676', '0.333333333')
    """
    if float(value).is_integer():
        return str(int(value))
    return repr(round(value, 9))


def _escaped(value: str) -> str:
    """A label value as the exposition format writes it: backslash, double quote and newline escaped.

    >>> _escaped('a"b\\\\c\\nd')
    'a\\\\"b\\\\\\\\c\\\\nd'
    """
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
