"""Clocks that drift over a long ring: an offset and a rate fitted per rank from collective ends, the residual
per rank, and ranks the fit does not describe called uncalibrated."""

from __future__ import annotations

import html
from statistics import mean, median

from comm2perfetto.align import (
    DRIFT_WINDOWS,
    MAX_DRIFT,
    MIN_SAMPLES,
    UNCALIBRATED_FLOOR_NS,
    fit_differences,
    measured_offsets,
    refine,
)
from comm2perfetto.match import load_job
from comm2perfetto.model import ClockFit
from comm2perfetto.report.stragglers import straggler_table
from comm2perfetto.trace.check import check_trace
from comm2perfetto.words import UNCALIBRATED_LEGEND
from support.cli import run_cli
from support.factories import T0_NS, FrJob

SECOND = 10**9
JITTER = (0, 15_000, -10_000, 5_000, -20_000, 10_000, -5_000)  # ns: ranks do not leave at the same instant


def _ends(drift: float, lead_ns: int, n: int, every_ns: int) -> tuple[dict, dict]:
    """Rank 0's and rank 1's local end times of ``n`` collectives ``every_ns`` apart, rank 1's clock ``lead_ns``
    ahead at the first and gaining ``drift`` (1e-4: 100 ppm)."""
    true = [T0_NS + i * every_ns for i in range(n)]
    ends0 = {("g", i): t for i, t in enumerate(true)}
    ends1 = {("g", i): t + lead_ns + round(drift * (t - T0_NS)) + JITTER[i % len(JITTER)]
             for i, t in enumerate(true)}
    return ends0, ends1


def _left(clock, ends0: dict, ends1: dict) -> list[int]:
    """Rank 1's ends minus rank 0's on the job's clock: what alignment left."""
    to_job = clock.of(1)
    return [to_job(ends1[k]) - ends0[k] for k in ends0]


def test_a_clock_100_ppm_fast_over_ten_minutes_is_fitted_with_its_drift():
    """One offset leaves the ends of a ten-minute run up to 30 ms apart; the drift fitted leaves the jitter."""
    ends0, ends1 = _ends(1e-4, 3_000_000, 600, SECOND)
    clock = refine(measured_offsets({}, [0, 1]), {0: ends0, 1: ends1})
    assert clock.fit[1] == ClockFit.DRIFT and round(clock.drifts_ppm()[1]) == 100
    left = _left(clock, ends0, ends1)
    assert max(map(abs, left)) < 2 * max(map(abs, JITTER))  # the line is off by microseconds at the run's ends
    assert clock.residual_ns[1] == clock.residual_skew_ns <= 10_000
    assert 1 not in clock.uncalibrated
    # The same ends with one offset (the old fit: their median) are 30 ms off at the ends of the run.
    one_offset = median(ends1[k] - ends0[k] for k in ends0)
    before = [ends1[k] - ends0[k] - one_offset for k in ends0]
    assert max(map(abs, before)) > 29_000_000 and median(map(abs, before)) > 10**3 * clock.residual_ns[1]


def test_without_a_drift_one_offset_is_fitted_and_said():
    ends0, ends1 = _ends(0.0, -2_000_000, 600, SECOND)
    clock = refine(measured_offsets({}, [0, 1]), {0: ends0, 1: ends1})
    assert clock.fit[1] == ClockFit.OFFSET and not clock.drifts_ppm()
    assert clock.offset_ns[1] == 2_000_000 - median(JITTER) and max(map(abs, _left(clock, ends0, ends1))) <= 20_000


def test_ends_too_few_for_a_drift_fall_back_to_one_offset():
    """Fewer ends than three stretches of the run: an offset only, and the fit says so, however they drift."""
    n = 3 * MIN_SAMPLES - 1
    ends0, ends1 = _ends(1e-4, 0, n, 60 * SECOND)
    clock = refine(measured_offsets({}, [0, 1]), {0: ends0, 1: ends1})
    assert clock.fit[1] == ClockFit.OFFSET_ONLY and not clock.drifts_ppm() and clock.method[1] == "refined"
    assert clock.residual_ns[1] > UNCALIBRATED_FLOOR_NS  # 100 ppm over 13 minutes: left in the residual


def test_a_clock_stepped_mid_run_is_uncalibrated():
    """A clock stepped by 40 ms halfway (NTP) is no line: its residual stays far above its ends' scatter."""
    ends0, ends1 = _ends(0.0, 0, 600, SECOND)
    ends1 = {k: t + (40_000_000 if k[1] >= 300 else 0) for k, t in ends1.items()}
    clock = refine(measured_offsets({}, [0, 1]), {0: ends0, 1: ends1})
    assert clock.residual_ns[1] > UNCALIBRATED_FLOOR_NS and clock.uncalibrated.keys() == {1}


def test_a_slope_no_clock_has_is_not_taken_for_a_drift():
    ends0, ends1 = _ends(5 * MAX_DRIFT, 0, 8 * DRIFT_WINDOWS, SECOND)
    clock = refine(measured_offsets({}, [0, 1]), {0: ends0, 1: ends1})
    assert clock.fit[1] == ClockFit.OFFSET and clock.uncalibrated.keys() == {1}


def test_fit_is_robust_to_ends_held_up():
    """A tenth of the ends 50 ms late (a descheduled thread) moves neither the drift nor the offset."""
    pts = [(T0_NS + i * SECOND, 7_000 + round(2e-4 * i * SECOND) + (50_000_000 if i % 10 == 3 else 0))
           for i in range(1_000)]
    fit = fit_differences(pts)
    assert fit.fit == ClockFit.DRIFT and abs(fit.slope - 2e-4) < 1e-7
    assert abs(fit.at(T0_NS) - 7_000) < 20_000 and not fit.uncalibrated


def test_a_long_ring_of_dumps_with_a_drifting_clock_and_a_late_rank(tmp_path):
    """Issue 35's case: 4 ranks' Flight Recorder dumps of 2,000 all_reduces a second apart (33 minutes); rank 2's
    clock runs 200 ppm fast, rank 3 really is 5 ms late at every one. With one offset the residual was 100 ms and
    ranks 2 and 3 were both last about equally often; fitted with a drift, rank 3 is the straggler by 5 ms,
    rank 2 on time, and every collective ends together on the job's clock."""
    n, every, late, drift = 2_000, SECOND, 5_000_000, 2e-4
    job = FrJob(world=4)
    for i in range(n):
        start = T0_NS + i * every
        end = start + late + 80_000
        for r in job.ranks:
            arrive = start + (late if r == 3 else 0) + r * 1_000
            job.collective(r, "all_reduce", [[1024]], t_ns=arrive)
            done = end + JITTER[(i + r) % len(JITTER)]
            if r == 2:  # its clock reads ahead by 200 ppm of the time since the first collective
                arrive, done = (t + round(drift * (t - T0_NS)) for t in (arrive, done))
            job.entries[r][-1].update(time_created_ns=arrive, time_discovered_completed_ns=done)
    job.write(tmp_path)
    loaded = load_job([tmp_path])
    clock = loaded.clock
    assert clock.fit[2] == ClockFit.DRIFT and abs(clock.drifts_ppm()[2] - 200) < 0.1
    assert clock.residual_skew_ns is not None and clock.residual_skew_ns < 1_000_000 and not clock.uncalibrated
    rows = {row["rank"]: row for row in straggler_table(loaded)}
    assert rows[3]["last_arrivals"] >= 0.9 * n and 0.004 <= rows[3]["mean_lateness_s"] <= 0.006
    assert rows[2]["mean_lateness_s"] < 0.001
    spread = [max(e) - min(e) for c in loaded.collectives["0[0,1,2,3]"] if None not in (e := c.end_ns)]
    assert len(spread) == n and mean(spread) < 100_000 and max(spread) < 1_000_000


def test_an_uncalibrated_rank_is_said_everywhere_and_its_lateness_is_no_evidence(tmp_path):
    """Rank 1's clock stepped 200 ms halfway through 200 collectives (dumps alone): no line describes it. The
    clock lines, the diagnose JSON, the straggler table and the trace say so, and when the last collective
    hangs with rank 1 two seconds behind by its clock, rank 1 is no suspect: its arrival compares with nothing."""
    n = 200
    job = FrJob(world=3)
    for i in range(n):
        start = T0_NS + i * SECOND
        for r in job.ranks:
            step = 200_000_000 if r == 1 and i >= n // 2 else 0
            late = 2 * SECOND if r == 1 and i == n - 1 else 0
            job.collective(r, "all_reduce", [[256]], t_ns=start + step + late + r * 1_000,
                           state="started" if i == n - 1 else "completed")
            job.entries[r][-1]["time_discovered_completed_ns"] = (
                start + step + 3_000_000 + JITTER[(i + r) % len(JITTER)] if i < n - 1 else None)
    job.write(tmp_path)
    verdict = run_cli("diagnose", tmp_path, "--format", "json").json()
    clock = verdict["clock"]
    assert clock["uncalibrated"].keys() == {"1"} and clock["uncalibrated"]["1"] >= 199_000_000
    assert clock["fit"]["1"] in ("offset", "offset and drift") and clock["method"]["1"] == "refined"
    (finding,) = [f for f in verdict["findings"] if f["kind"] == "stuck_all_joined"]
    assert finding["suspect_ranks"] == [] and "clock of rank 1 is uncalibrated" in finding["detail"]
    text = run_cli("diagnose", tmp_path).out
    assert "uncalibrated: rank 1 (a tenth of its ends 200 ms or more off the fit)" in text
    report = run_cli("report", tmp_path).out
    assert "; uncalibrated: rank 1 (a tenth" in report and UNCALIBRATED_LEGEND in report
    assert any(line.split()[:1] == ["1*"] for line in report.splitlines())
    assert run_cli("report", tmp_path, "--plot", tmp_path / "r.html").code == 0
    page = (tmp_path / "r.html").read_text()
    assert "<td>1*</td>" in page and ">1*</text>" in page and html.escape(UNCALIBRATED_LEGEND) in page  # table, map
    merged = run_cli("merge", tmp_path, "-o", tmp_path / "t.pftrace")
    assert merged.code == 0 and "; uncalibrated: rank 1 (a tenth" in merged.out
    described = {p.name: p.description for p in check_trace(tmp_path / "t.pftrace").tracks.values()
                 if p.kind == "process"}
    assert "UNCALIBRATED" in described["rank 1"] and "UNCALIBRATED" not in described["rank 2"]
    assert "uncalibrated: rank 1" in described["job"]
