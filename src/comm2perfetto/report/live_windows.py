"""The live windows after the run: what every rank's recorder summed up each ``--live-every`` seconds (the logs'
``l`` records, docs/live.md), over the whole run and with no profiler: each group's communication per step, and
who arrived late at its collectives window after window, by the rule the live gatherer applies (lateness.py).

Unlike the gatherer, which sees one window at a time, the report has every window: a collective belongs to the
window in which its first member arrived, so a late rank's arrival in the next window still counts. The
result (``report --format json``'s ``live``, docs/report.md)::

    {"every_s": 5.0, "windows": [359181722, 359181723],
     "groups": [{"group": "0", "desc": "default_pg", "ranks": [0, 1], "calls": 174, "bytes": 696000,
                 "comm_s": 1.13, "steps": 18, "comm_per_step_s": 0.0314, "timed": true,
                 "lateness_s": [[0.0007, 0.0008], [0.0305, 0.0311]], "late": [[false, false], [true, true]]}],
     "stragglers": [{"event": "start", "rank": 1, "group": "0", "group_desc": "default_pg", "window": 359181723,
                     "mean_lateness_s": 0.0308, "last_share": 1.0, "windows": [359181722, 359181723],
                     "threshold_s": 0.002}]}

``lateness_s`` and ``late`` are per rank (``ranks``, the members whose clock is trusted) and window; None where
a window had no verdict or the rank no collective of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from comm2perfetto.lateness import StragglerTracker, clock_trusted, group_lateness
from comm2perfetto.report_doc import LiveGroup, LiveWindows

if TYPE_CHECKING:
    from comm2perfetto.sources.event_log import RankLog

__all__ = ["live_windows"]


def live_windows(logs: Mapping[int, RankLog]) -> LiveWindows | None:
    """The live windows of the job's logs (on the job's clock: ``match.build_job`` shifted them); None when no
    rank wrote one (windows off, or a recorder before them)."""
    logs = {rank: log for rank, log in logs.items() if log.windows}
    if not logs:
        return None
    every = next((log.header.get("config", {}).get("live_every_s") for log in logs.values()), None)
    windows = sorted({w.window for log in logs.values() for w in log.windows})
    column = {w: i for i, w in enumerate(windows)}
    uncertainty = {rank: log.clock_rtt_ns // 2 for rank, log in logs.items()
                   if log.clock_rtt_ns is not None and clock_trusted(log.clock_rtt_ns)}
    tracker = StragglerTracker()
    events: list[dict] = []
    groups: list[LiveGroup] = []
    for name in sorted({g for log in logs.values() for w in log.windows for g in w.groups}, key=_group_order):
        desc, members = _declared(logs, name)
        compared = sorted(r for r in members if r in uncertainty and r in logs)
        by_window = _arrivals_by_window(logs, name)
        lateness: list[list[float | None]] = [[None] * len(windows) for _ in compared]
        late: list[list[bool | None]] = [[None] * len(windows) for _ in compared]
        for window in windows:
            result = group_lateness(by_window.get(window, {}), {r: uncertainty[r] for r in compared})
            if result is None:
                continue
            for i, rank in enumerate(compared):
                verdict = result.ranks[rank]
                lateness[i][column[window]] = round(verdict.mean_ns / 1e9, 6)
                late[i][column[window]] = verdict.late
            events += [dict(e, window=window) for e in tracker.update(window, name, desc, result.ranks)]
        calls, nbytes, comm_s, steps, per_step, timed = _communication(logs, name)
        groups.append({"group": name, "desc": desc, "ranks": compared, "calls": calls, "bytes": nbytes,
                       "comm_s": comm_s, "steps": steps, "comm_per_step_s": per_step, "timed": timed,
                       "lateness_s": lateness, "late": late})
    return {"every_s": every if isinstance(every, (int, float)) else None, "windows": windows, "groups": groups,
            "stragglers": events}


def _group_order(name: str) -> tuple[int, str]:
    return (0, f"{int(name):012d}") if name.isdigit() else (1, name)


def _declared(logs: Mapping[int, RankLog], name: str) -> tuple[str, list[int]]:
    """The group's description and members, as the first log that declared it says (c10d's name is the key
    the windows use)."""
    for log in logs.values():
        for group in log.groups.values():
            if group.name == name:
                return group.desc, list(group.ranks)
    return "", sorted(r for r, log in logs.items() if any(name in w.groups for w in log.windows))


def _arrivals_by_window(logs: Mapping[int, RankLog], name: str) -> dict[int, dict[int, dict[int, int]]]:
    """window -> rank -> {seq: arrival_ns}: each sampled collective in the window its first arrival fell in."""
    at: dict[int, dict[int, tuple[int, int]]] = {}  # seq -> rank -> (arrival, the window of that rank's record)
    for rank, log in logs.items():
        for w in log.windows:
            g = w.groups.get(name)
            if g is not None:
                for seq, us in zip(g.seqs, g.arrivals_us):
                    at.setdefault(seq, {})[rank] = (w.t0_ns + us * 1000, w.window)
    out: dict[int, dict[int, dict[int, int]]] = {}
    for seq, ranks in at.items():
        window = min(ranks.values())[1]
        into = out.setdefault(window, {})
        for rank, (arrival, _) in ranks.items():
            into.setdefault(rank, {})[seq] = arrival
    return out


def _communication(logs: Mapping[int, RankLog],
                   name: str) -> tuple[int, int | None, float | None, int, float | None, bool]:
    """The group's calls and bytes over the run, its ranks' communication time and per step (a mean over the
    ranks of each rank's time over its steps) where every call's completion was seen, the most steps a rank
    counted, and whether every call was timed."""
    calls, nbytes, time_ns, timed, per_step = 0, 0, 0, True, []
    bytes_known = True
    for log in logs.values():
        rank_ns, rank_steps, seen = 0, 0, False
        for w in log.windows:
            rank_steps += w.steps
            g = w.groups.get(name)
            if g is None:
                continue
            for op in g.ops.values():
                seen = True
                calls += op.n
                bytes_known = bytes_known and op.nbytes is not None
                nbytes += op.nbytes or 0
                rank_ns += op.time_ns
                timed = timed and op.timed == op.n
        time_ns += rank_ns
        if seen and rank_steps:
            per_step.append(rank_ns / rank_steps)
    steps = max((sum(w.steps for w in log.windows) for log in logs.values()), default=0)
    return (calls, nbytes if bytes_known else None, round(time_ns / 1e9, 6) if timed else None, steps,
            round(sum(per_step) / len(per_step) / 1e9, 6) if timed and per_step else None, timed)
