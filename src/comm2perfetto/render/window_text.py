"""The last gathered window (sources/live_window.py) as ``comm2perfetto top`` shows it: each rank's median step
time, the share of the window it spent in communication and waited in it (exposed), its lateness (its mean
arrival after the earliest member of its latest group) and the share of that group's collectives it arrived
last at; stragglers first, then by lateness. Unknown figures show ``-``::

    run1  window 359181722 (5 s, ended 23:30:15 (2.10 s ago), gathered by rank 0): 4 of 4 ranks
    stragglers: rank 2 on default_pg

    RANK  HOST  STEP    COMM  EXPOSED  LATENESS  LAST  STRAGGLER
       2  vm    52.1 ms  10%      10%   32.9 ms  100%  default_pg
       1  vm    52.0 ms  63%      63%   1.28 ms    0%  -
"""

from __future__ import annotations

import time

from comm2perfetto.sources.live_window import Window
from comm2perfetto.words import duration


def _share(part: float | None, whole: float | None) -> str:
    return f"{part / whole:.0%}" if part is not None and whole else "-"


def table(window: Window, folder: str = "", now_ns: int | None = None) -> str:
    """The window as ``top`` prints it."""
    now_ns = time.time_ns() if now_ns is None else now_ns
    ended = ""
    if window.end_ns is not None:
        ended = f", ended {time.strftime('%H:%M:%S', time.localtime(window.end_ns / 1e9))} " \
                f"({duration(max(now_ns - window.end_ns, 0))} ago)"
    gathered = f", gathered by rank {window.gathered_by}" if window.gathered_by is not None else ""
    attempt = f", attempt {window.attempt}" if window.attempt else ""
    missing = f", no summary from rank{'s' if len(window.missing) > 1 else ''} " + \
        ", ".join(map(str, window.missing[:16])) if window.missing else ""
    lines = [f"{folder}  window {window.window} ({window.every_s:g} s{ended}{gathered}{attempt}): "
             f"{len(window.ranks)} of {window.world_size} ranks{missing}"]
    desc = {g.group: g.desc or f"group {g.group}" for g in window.groups}
    stragglers: dict[int, list[str]] = {}
    for rank, group, _since in window.stragglers:
        stragglers.setdefault(rank, []).append(desc.get(group, f"group {group}"))
    if stragglers:
        lines.append("stragglers: " + "; ".join(f"rank {rank} on {', '.join(groups)}"
                                                for rank, groups in sorted(stragglers.items())))
    else:
        lines.append("stragglers: none")
    # Each rank's most late group: its lateness and share of last arrivals there.
    worst: dict[int, tuple[float, float | None]] = {}
    for g in window.groups:
        for m in g.members:
            if m.mean_s is not None and (m.rank not in worst or m.mean_s > worst[m.rank][0]):
                worst[m.rank] = (m.mean_s, m.last_share)
    header = ("RANK", "HOST", "STEP", "COMM", "EXPOSED", "LATENESS", "LAST", "STRAGGLER")
    rows = []
    for r in sorted(window.ranks, key=lambda r: (r.rank not in stragglers, -worst.get(r.rank, (-1.0, None))[0],
                                                 r.rank)):
        late, last = worst.get(r.rank, (None, None))
        rows.append((str(r.rank), r.host, duration(r.step_s * 1e9) if r.step_s is not None else "-",
                     _share(r.comm_s, r.window_s), _share(r.exposed_s, r.window_s),
                     duration(late * 1e9) if late is not None else "-",
                     f"{last:.0%}" if last is not None else "-",
                     ", ".join(stragglers.get(r.rank, ())) or "-"))
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines.append("")
    for row in [header, *rows]:
        lines.append("  ".join(cell.rjust(w) if i in (0, 2, 3, 4, 5, 6) else cell.ljust(w)
                               for i, (cell, w) in enumerate(zip(row, widths))).rstrip())
    return "\n".join(lines) + "\n"
