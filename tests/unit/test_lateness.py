"""The lateness rule (lateness.py) on arrivals made up to the microsecond: who is late beyond noise, and the
straggler episodes it makes window after window."""

from __future__ import annotations

import random

from comm2perfetto.lateness import (
    LATE_IN,
    MAX_RTT_NS,
    MIN_LATE_NS,
    MIN_MATCHED,
    SPREAD_FACTOR,
    RankLateness,
    StragglerTracker,
    clock_trusted,
    group_lateness,
)

MS = 1_000_000


def _arrivals(n: int, ranks: int, late: dict[int, float] | None = None, jitter_ms: float = 0.2,
              seed: int = 0) -> dict[int, dict[int, int]]:
    """``n`` collectives 100 ms apart; each rank arrives with a uniform jitter, plus ``late[rank]`` ms: rank ->
    {seq: arrival}."""
    rng = random.Random(seed)
    late = late or {}
    by_seq = {seq: {r: seq * 100 * MS + int((rng.uniform(0, jitter_ms) + late.get(r, 0.0)) * MS)
                    for r in range(ranks)} for seq in range(1, n + 1)}
    return {r: {seq: at[r] for seq, at in by_seq.items()} for r in range(ranks)}


def _clocks(ranks: int, uncertainty_ns: int = 0) -> dict[int, int]:
    return dict.fromkeys(range(ranks), uncertainty_ns)


def test_a_rank_30_ms_late_every_time_is_late_and_nobody_else():
    result = group_lateness(_arrivals(40, 4, {2: 30}), _clocks(4))
    assert result is not None and result.matched == 40
    assert [r for r, v in result.ranks.items() if v.late] == [2]
    late = result.ranks[2]
    assert 29.5 * MS < late.mean_ns < 30.5 * MS and late.last_share == 1.0
    assert 29 * MS < late.excess_ns < 31 * MS
    # The spread is the jitter (0.2 ms uniform: σ about 0.06 ms), not the late rank's offset.
    assert result.spread_ns < 0.2 * MS and late.threshold_ns == MIN_LATE_NS


def test_a_rank_late_only_at_the_first_of_each_step_s_collectives_is_late():
    """Three collectives a step: rank 2 arrives 30 ms late at the first, where the others wait for it, and all
    arrive together at the next two. Late at a third of them, 10 ms on average: a median would say on time."""
    arrivals = _arrivals(42, 4)
    for seq in range(1, 43, 3):
        arrivals[2][seq] += 30 * MS
    result = group_lateness(arrivals, _clocks(4))
    assert result is not None and [r for r, v in result.ranks.items() if v.late] == [2]
    assert 9 * MS < result.ranks[2].excess_ns < 11 * MS


def test_one_hiccup_in_a_window_is_not_late():
    arrivals = _arrivals(40, 4)
    arrivals[1][17] += 30 * MS  # rank 1 held up once
    result = group_lateness(arrivals, _clocks(4))
    assert result is not None and not any(v.late for v in result.ranks.values())


def test_jitter_alone_makes_nobody_late_however_it_falls():
    for seed in range(20):
        result = group_lateness(_arrivals(60, 8, jitter_ms=5.0, seed=seed), _clocks(8))
        assert result is not None and not any(v.late for v in result.ranks.values()), seed


def test_two_ranks_the_late_one_is_late_the_other_is_not():
    """With two members the typical lateness is halfway: the late rank's excess is +15 ms, the other's -15 ms;
    the spread is each rank's variation around its own, so neither offset inflates it."""
    result = group_lateness(_arrivals(20, 2, {1: 30}), _clocks(2))
    assert result is not None
    assert (result.ranks[0].late, result.ranks[1].late) == (False, True)
    assert 14 * MS < result.ranks[1].excess_ns < 16 * MS and result.ranks[0].excess_ns < 0


def test_lateness_within_the_spread_is_noise():
    """A rank 3 ms late where arrivals vary by ±10 ms from one collective to the next is not told apart."""
    result = group_lateness(_arrivals(60, 4, {1: 3}, jitter_ms=20.0, seed=3), _clocks(4))
    assert result is not None and not result.ranks[1].late
    threshold = result.ranks[1].threshold_ns
    assert threshold > 3 * MS and abs(threshold - SPREAD_FACTOR * result.spread_ns) <= SPREAD_FACTOR  # rounding


def test_lateness_within_the_clocks_uncertainty_is_not_late():
    """4 ms late, but the late rank's clock is known to 3 ms and another's to 2 ms: 5 ms could be the clocks."""
    clocks = {0: 0, 1: 2 * MS, 2: 3 * MS, 3: 0}
    result = group_lateness(_arrivals(40, 4, {2: 4}), clocks)
    assert result is not None and result.ranks[2].threshold_ns == 5 * MS and not result.ranks[2].late
    assert group_lateness(_arrivals(40, 4, {2: 8}), clocks).ranks[2].late


def test_too_few_collectives_give_no_verdict():
    result = group_lateness(_arrivals(MIN_MATCHED - 1, 4, {2: 30}), _clocks(4))
    assert result is not None and result.matched == MIN_MATCHED - 1
    assert all(v.late is None for v in result.ranks.values())
    assert result.ranks[2].mean_ns > 29 * MS  # the figures are given all the same


def test_only_collectives_every_compared_member_arrived_at_count():
    arrivals = _arrivals(10, 3, {1: 30})
    for seq in (3, 4, 5):
        del arrivals[2][seq]  # rank 2 had not issued them yet
    result = group_lateness(arrivals, _clocks(3))
    assert result is not None and result.matched == 7
    # A member left out of the comparison (its clock not trusted) does not hold the others' back.
    assert group_lateness(arrivals, {0: 0, 1: 0}).matched == 10
    assert group_lateness(arrivals, {0: 0}) is None  # one member: nothing to compare
    assert group_lateness({}, _clocks(3)) is None


def test_a_clock_measurement_is_trusted_up_to_the_bound():
    assert clock_trusted(0) and clock_trusted(MAX_RTT_NS)
    assert not clock_trusted(MAX_RTT_NS + 1) and not clock_trusted(None) and not clock_trusted(-1)


def _late(late: bool | None, mean_ms: float = 30.0) -> RankLateness:
    return RankLateness(int(mean_ms * MS), int(mean_ms * MS), 1.0 if late else 0.2, MIN_LATE_NS, late)


def test_a_straggler_starts_at_two_late_windows_of_three_and_ends_below():
    tracker = StragglerTracker()
    seen = []
    pattern = [True, False, True, True, False, True, False, False, True]
    for window, late in enumerate(pattern, 100):
        seen += [(e["event"], window, e["windows"]) for e in tracker.update(window, "0", "default_pg",
                                                                           {3: _late(late)})]
    # Late in 100 and 102: a straggler from 102 on; at 104 and 105 two of the last three are still late; at 106
    # only 105 is: it ends. 108 is one late window of three.
    assert seen == [("start", 102, [100, 102]), ("end", 106, [100, 102, 103, 105])]
    assert LATE_IN == 2 and tracker.active() == []


def test_straggler_events_carry_the_episode_magnitude():
    tracker = StragglerTracker()
    tracker.update(1, "3", "mesh_tp", {5: _late(True, 20.0)})
    (start,) = tracker.update(2, "3", "mesh_tp", {5: _late(True, 40.0)})
    assert start == {"event": "start", "rank": 5, "group": "3", "group_desc": "mesh_tp", "mean_lateness_s": 0.03,
                     "last_share": 1.0, "windows": [1, 2], "threshold_s": 0.002}
    assert tracker.active() == [(5, "3", 1)]


def test_windows_without_a_verdict_do_not_count_either_way():
    tracker = StragglerTracker()
    assert tracker.update(1, "0", "", {2: _late(True)}) == []
    assert tracker.update(2, "0", "", {2: _late(None)}) == []  # too few collectives: unknown
    (start,) = tracker.update(3, "0", "", {2: _late(True)})
    assert start["windows"] == [1, 3]
    for window in (4, 5, 6):
        assert tracker.update(window, "0", "", {2: _late(None)}) == []
    assert tracker.active() == [(2, "0", 1)]  # no evidence it ended


def test_the_state_lets_another_rank_take_over():
    tracker = StragglerTracker()
    tracker.update(1, "0", "default_pg", {2: _late(True), 0: _late(False)})
    taken_over = StragglerTracker(tracker.state())
    (start,) = taken_over.update(2, "0", "default_pg", {2: _late(True), 0: _late(False)})
    assert (start["rank"], start["windows"]) == (2, [1, 2])
    again = StragglerTracker(taken_over.state())
    assert again.active() == [(2, "0", 1)]
    again.update(3, "0", "default_pg", {2: _late(False)})
    (end,) = again.update(4, "0", "default_pg", {2: _late(False)})
    assert (end["event"], end["windows"]) == ("end", [1, 2])
    # Ranks never late are not kept: the state stays as small as the stragglers.
    assert [key[:2] for key in taken_over.state()["history"]] == [[2, "0"]]
