"""Who arrives late at a process group's collectives, window after window: the one rule the live gatherer
(record/gather.py) and ``report`` (the window summaries of the event logs) apply. Never imports torch.

The input is one process group's collectives in one window, each (by its sequence number) with every member's
arrival on the job's clock: when the rank's CPU issued it (its ``b`` record), moved by the rank's clock offset.
For a collective c and a member r:

- lateness ``l(r, c)`` = arrival(r, c) − the earliest arrival at c;
- excess ``e(r, c)`` = l(r, c) − the median lateness of c's members: how much later than the typical member.

Per member over the window's collectives: ``mean_ns`` (the mean lateness), ``excess_ns`` (the mean excess: what
the others waited for it beyond the typical member, per collective) and ``last_share`` (the share of the
collectives it arrived last at). The window's **spread** is how much the arrival order varies from one
collective to the next: for each member the median absolute deviation of its excesses from its own median
excess, the median of those over the members, times 1.4826 (σ for a normal spread; a rank that is late by the
same amount every time adds nothing to it, nor one late at a few of the collectives only).

The excess is a mean, not a median: a training step often issues several collectives, and a slow rank is late
only at the first of them (the others wait for it there, then all go on together), which a median would not
see. A one-off hiccup moves the mean by its length over the collectives matched, and a straggler must be late
in 2 of 3 windows.

A member is **late** in the window when at least ``MIN_MATCHED`` collectives were matched and its excess
exceeds all of: ``SPREAD_FACTOR`` × the spread; its clock uncertainty plus the largest of the other members'
(half the round trip of each rank's start-up clock measurement, record/clock.py); and ``MIN_LATE_NS``.
A rank whose clock is not trusted (no measurement, or one whose round trip exceeded ``MAX_RTT_NS``) is left
out of the comparison: its lateness is unknown, never a guess.

A rank is a **straggler** of a group while it was late in at least ``LATE_IN`` of the last ``WINDOWS`` windows
in which its lateness was known (``StragglerTracker``): one event when that starts, one when it ends.

>>> arrivals = {0: {seq: 1000 * seq for seq in range(1, 11)},
...             1: {seq: 1000 * seq + 50_000 for seq in range(1, 11)},
...             2: {seq: 1000 * seq + 30_000_000 + 7 * seq for seq in range(1, 11)}}
>>> result = group_lateness(arrivals, {0: 0, 1: 20_000, 2: 20_000})
>>> result.matched, result.ranks[2].late, result.ranks[1].late
(10, True, False)
>>> round(result.ranks[2].mean_ns / 1e6, 3), result.ranks[2].last_share
(30.0, 1.0)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import repeat
from operator import itemgetter, sub
from typing import Any, NamedTuple

# A start-up clock measurement whose round trip took longer than this was held up (its rank frozen, holding
# the GIL, or the store overloaded): half of it, its uncertainty, is larger than any clock difference it could
# correct (align.py reads the logs' measurements by the same bound).
MAX_RTT_NS = 100_000_000

MIN_MATCHED = 5  # collectives of a group in a window, fewer: no verdict for it
SPREAD_FACTOR = 3.0  # late beyond this many times the window's spread
MIN_LATE_NS = 2_000_000  # and beyond 2 ms, whatever the spread: below it, a rank's wake-up and scheduling
WINDOWS = 3  # a straggler: late in at least LATE_IN of the last WINDOWS windows where its lateness was known
LATE_IN = 2
MAD_TO_SIGMA = 1.4826


class RankLateness(NamedTuple):
    """One member of a group in one window. ``late`` is None when too few collectives were matched."""

    mean_ns: int
    excess_ns: int
    last_share: float
    threshold_ns: int
    late: bool | None


class GroupLateness(NamedTuple):
    matched: int  # collectives every compared member arrived at
    spread_ns: int
    ranks: dict[int, RankLateness]
    seqs: frozenset[int]  # those collectives


def clock_trusted(rtt_ns: int | None) -> bool:
    """Whether a start-up clock measurement (its round trip; None: none made) can place a rank's arrivals."""
    return rtt_ns is not None and 0 <= rtt_ns <= MAX_RTT_NS


def group_lateness(arrivals: Mapping[int, Mapping[int, int]],
                   uncertainty_ns: Mapping[int, int]) -> GroupLateness | None:
    """The rule above for one group's window. ``arrivals``: rank -> {seq: arrival_ns}; ``uncertainty_ns``: the
    compared members (the ranks with a trusted clock) -> their clock uncertainty. Only the collectives every
    compared member arrived at count; None when fewer than two members are compared or none matched.

    Column by column (a rank's arrivals, a collective's firsts), so that the work per arrival runs in C: 1,024
    ranks of 64 collectives each are some 65,000 arrivals a window."""
    ranks = sorted(uncertainty_ns)
    if len(ranks) < 2 or any(r not in arrivals for r in ranks):
        return None
    common = set(arrivals[ranks[0]]).intersection(*(arrivals[r] for r in ranks[1:]))
    if not common:
        return None
    seqs = sorted(common)
    pick = itemgetter(*seqs) if len(seqs) > 1 else lambda d: (d[seqs[0]],)
    columns = [pick(arrivals[r]) for r in ranks]  # per rank, its arrivals in seq order
    rows = list(zip(*columns))  # per collective, every rank's arrival
    firsts = [min(row) for row in rows]
    typical = [_median(sorted(row)) for row in rows]  # the median arrival: excess = arrival - it
    last = [0] * len(ranks)
    for row in rows:
        last[row.index(max(row))] += 1
    matched = len(seqs)
    first_sum = sum(firsts)
    own, spreads = [], []
    for column in columns:
        excess = sorted(map(sub, column, typical))
        own.append(sum(excess) / matched)  # the rank's mean excess
        median = _median(excess)
        spreads.append(_median(sorted(map(abs, map(sub, excess, repeat(median))))))  # its deviation from its own
    spread = MAD_TO_SIGMA * _median(sorted(spreads))
    clocks = sorted(uncertainty_ns.values(), reverse=True)
    out = {}
    for i, rank in enumerate(ranks):
        others = clocks[1] if uncertainty_ns[rank] == clocks[0] else clocks[0]  # the largest of the others'
        threshold = max(SPREAD_FACTOR * spread, uncertainty_ns[rank] + others, MIN_LATE_NS)
        out[rank] = RankLateness(
            mean_ns=round((sum(columns[i]) - first_sum) / matched), excess_ns=round(own[i]),
            last_share=last[i] / matched, threshold_ns=round(threshold),
            late=own[i] > threshold if matched >= MIN_MATCHED else None)
    return GroupLateness(matched, round(spread), out, frozenset(common))


def _median(ordered: Sequence[float]) -> float:
    """The median of an ordered sequence."""
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


class StragglerTracker:
    """Each (rank, group)'s last ``WINDOWS`` known verdicts, and the stragglers they make. Its state is plain
    JSON (``state()``, ``StragglerTracker(state)``), so another rank can take over the gathering.

    >>> tracker = StragglerTracker()
    >>> late = RankLateness(30_000_000, 29_000_000, 1.0, 2_000_000, True)
    >>> tracker.update(7, "0", "default_pg", {2: late})
    []
    >>> [(e["event"], e["rank"], e["windows"]) for e in tracker.update(8, "0", "default_pg", {2: late})]
    [('start', 2, [7, 8])]
    >>> on_time = late._replace(mean_ns=0, excess_ns=0, last_share=0.3, late=False)
    >>> tracker.update(9, "0", "default_pg", {2: on_time}), tracker.active()
    ([], [(2, '0', 7)])
    >>> [(e["event"], e["windows"]) for e in tracker.update(10, "0", "default_pg", {2: on_time})]
    [('end', [7, 8])]
    """

    MAX_EPISODE_WINDOWS = 1000

    def __init__(self, state: Mapping[str, Any] | None = None) -> None:
        # (rank, group) -> [[window, late, mean_ns, last_share], ...], the last WINDOWS known verdicts
        self._history: dict[tuple[int, str], list[list[Any]]] = {}
        # (rank, group) -> the current episode: {"desc", "since", "windows", "mean_ns", "last_share"} (sums)
        self._active: dict[tuple[int, str], dict[str, Any]] = {}
        if state:
            for rank, group, history in state.get("history", ()):
                self._history[(rank, group)] = [list(h) for h in history][-WINDOWS:]
            for rank, group, episode in state.get("active", ()):
                self._active[(rank, group)] = dict(episode)

    def update(self, window: int, group: str, desc: str, verdicts: Mapping[int, RankLateness]) -> list[dict[str, Any]]:
        """Take one window's verdicts of one group; return the events they cause (starts and ends)."""
        events = []
        for rank, verdict in sorted(verdicts.items()):
            key = (rank, group)
            if verdict.late is None or (not verdict.late and key not in self._history):
                continue  # unknown; or on time and nothing to age out (as if never seen: see below)
            history = self._history.setdefault(key, [])
            history.append([window, verdict.late, verdict.mean_ns, verdict.last_share])
            del history[:-WINDOWS]
            late = [h for h in history if h[1]]
            episode = self._active.get(key)
            if episode is None and len(late) >= LATE_IN:
                episode = self._active[key] = {"desc": desc, "since": late[0][0], "windows": [], "mean_ns": 0,
                                               "last_share": 0.0}
                for h in late:
                    _add_window(episode, h)
                events.append(_event("start", rank, group, episode, verdict))
            elif episode is not None and verdict.late:
                _add_window(episode, history[-1])
            elif episode is not None and len(late) < LATE_IN:
                del self._active[key]
                events.append(_event("end", rank, group, episode, verdict))
            if not late and episode is None:
                del self._history[key]  # nothing to remember: as if never seen
        return events

    def active(self) -> list[tuple[int, str, int]]:
        """The stragglers now: (rank, group, the first late window of the episode)."""
        return [(rank, group, episode["since"]) for (rank, group), episode in sorted(self._active.items())]

    def state(self) -> dict[str, Any]:
        return {"history": [[rank, group, history] for (rank, group), history in sorted(self._history.items())],
                "active": [[rank, group, episode] for (rank, group), episode in sorted(self._active.items())]}


def _add_window(episode: dict[str, Any], verdict: list[Any]) -> None:
    if len(episode["windows"]) < StragglerTracker.MAX_EPISODE_WINDOWS:
        episode["windows"].append(verdict[0])
        episode["mean_ns"] += verdict[2]
        episode["last_share"] += verdict[3]


def _event(kind: str, rank: int, group: str, episode: dict[str, Any], now: RankLateness) -> dict[str, Any]:
    """A straggler event (docs/live.md): the windows it was late in during the episode, and its mean lateness
    and share of last arrivals over them."""
    n = len(episode["windows"]) or 1
    return {"event": kind, "rank": rank, "group": group, "group_desc": episode["desc"],
            "mean_lateness_s": round(episode["mean_ns"] / n / 1e9, 6),
            "last_share": round(episode["last_share"] / n, 4), "windows": list(episode["windows"]),
            "threshold_s": round(now.threshold_ns / 1e9, 6)}
