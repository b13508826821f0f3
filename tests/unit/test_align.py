"""Clock alignment: the recorder's start-up measurement, refined from collective ends."""

from __future__ import annotations

from statistics import median
from types import SimpleNamespace

from comm2perfetto.align import MAX_RTT_NS, MIN_SAMPLES, measured_offsets, refine
from comm2perfetto.model import RankClock


def _log(offset, rtt):
    return SimpleNamespace(clock_offset_ns=offset, clock_rtt_ns=rtt)


def test_measured_offsets_and_uncertainty():
    clock = measured_offsets({0: _log(0, 0), 1: _log(-5_000, 800)}, [0, 1, 2])
    assert dict(clock.offset_ns) == {0: 0, 1: -5_000, 2: 0}
    assert dict(clock.method) == {0: "measured", 1: "measured", 2: "assumed"}
    assert clock.uncertainty_ns[1] == 800 // 2
    assert clock.residual_skew_ns is None


def test_refinement_recovers_the_offset_left_after_measurement():
    # Rank 1's clock runs 7 us ahead of rank 0's; the start-up measurement only caught 5 us of it.
    true_lead, measured = 7_000, -5_000
    jitter = [300, -200, 100, 0, -100, 250, -50]  # ranks do not leave a collective at the exact same ns
    ends0 = {("g", s): 10**9 + s * 10**6 for s in range(len(jitter))}
    ends1 = {k: t + true_lead + j for (k, t), j in zip(ends0.items(), jitter)}
    clock = refine(measured_offsets({0: _log(0, 0), 1: _log(measured, 800)}, [0, 1]), {0: ends0, 1: ends1})
    assert clock.method[1] == "refined"
    assert clock.offset_ns[1] == -true_lead - int(median(jitter))
    residuals = [abs(j - median(jitter)) for j in jitter]
    assert clock.residual_skew_ns == int(median(residuals))
    assert clock.samples == len(jitter)


def test_too_few_matched_ends_keep_the_measurement():
    ends0 = {("g", s): s for s in range(MIN_SAMPLES - 1)}
    ends1 = {k: t + 1_000 for k, t in ends0.items()}
    base = measured_offsets({0: _log(0, 0), 1: _log(-10, 0)}, [0, 1])
    clock = refine(base, {0: ends0, 1: ends1})
    assert clock.offset_ns[1] == -10 and clock.method[1] == "measured"


def test_a_rank_clock_moves_a_column_and_keeps_what_is_missing():
    assert RankClock(10).times([1, None, 3]) == [11, None, 13]
    assert RankClock(10).times([1, -1, 3], missing=-1) == [11, -1, 13]
    assert RankClock(10, -1e-3, 1_000).times([1_000, None, 3_000, -1], missing=-1) == [1_010, None, 3_008, -1]
    assert not RankClock() and RankClock(0, 1e-6)


def test_a_measurement_whose_round_trip_was_held_up_is_not_trusted():
    """Rank 1 held the GIL at start-up: its clock exchange took 8.8 s, so its offset (-4.4 s) is ± 4.4 s."""
    logs = {1: SimpleNamespace(clock_offset_ns=-4_383_003_991, clock_rtt_ns=8_773_956_950),
            2: SimpleNamespace(clock_offset_ns=1200, clock_rtt_ns=MAX_RTT_NS)}
    clock = measured_offsets(logs, [0, 1, 2])
    assert dict(clock.offset_ns) == {0: 0, 1: 0, 2: 1200}
    assert dict(clock.method) == {0: "assumed", 1: "assumed", 2: "measured"}
