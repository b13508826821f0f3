"""compare's statistics: the Mann-Whitney U distribution, the Hodges-Lehmann shift and Moses' interval.

The exact U distribution is checked against enumerating every ordering; the critical values against the
published two-sided 5 % table; the interval's false alarm rate and power by simulation with fixed seeds (the
same draws on every run, so these tests cannot flake).
"""

from __future__ import annotations

import itertools
import math
import random

import pytest

from comm2perfetto.compare.statistics import (
    MAX_SAMPLES,
    median,
    order_statistic_rank,
    shift,
    thin,
    u_distribution,
)


@pytest.mark.parametrize(("n", "m"), [(1, 1), (2, 3), (3, 3), (4, 2), (4, 5)])
def test_u_distribution_counts_every_ordering(n, m):
    counts = [0] * (n * m + 1)
    for positions in itertools.combinations(range(n + m), n):  # where BASE's values fall in the merged order
        u = sum(1 for p in positions for q in set(range(n + m)) - set(positions) if q > p)
        counts[u] += 1
    assert u_distribution(n, m) == counts
    assert sum(counts) == math.comb(n + m, n)


@pytest.mark.parametrize(("n", "m", "critical"), [(4, 4, 0), (5, 5, 2), (6, 6, 5), (8, 8, 13), (10, 10, 23),
                                                  (5, 10, 8), (20, 20, 127)])
def test_interval_rank_is_the_published_critical_value_plus_one(n, m, critical):
    """Two-sided 5 % critical values of U (the largest U rejected), as printed in Mann-Whitney tables."""
    assert order_statistic_rank(n, m) == critical + 1


def test_too_few_samples_give_no_interval():
    # 3 and 3: even complete separation has probability 2/20 = 10 % > 5 %
    assert order_statistic_rank(3, 3) == 0
    est = shift([1.0, 2.0, 3.0], [11.0, 12.0, 13.0])
    assert est.estimate == 10.0 and not est.bounded


def test_normal_approximation_takes_over_smoothly():
    """Past 20 samples a side the normal approximation gives k; it agrees with the exact count at the edge."""
    exact = order_statistic_rank(20, 20)
    z = 1.959963984540054
    approx = math.floor(20 * 20 / 2 - z * math.sqrt(20 * 20 * 41 / 12))
    assert abs(exact - approx) <= 1
    assert order_statistic_rank(21, 21) == math.floor(21 * 21 / 2 - z * math.sqrt(21 * 21 * 43 / 12))


def test_hodges_lehmann_and_moses_by_hand():
    base = [10.0, 11.0, 12.0, 13.0, 14.0, 15.0]
    new = [20.0, 21.0, 22.0, 23.0, 24.0, 25.0]
    differences = sorted(y - x for x in base for y in new)  # 5 .. 15, 36 of them
    est = shift(base, new)
    assert est.estimate == median(differences) == 10.0
    k = order_statistic_rank(6, 6)  # 6: the critical value is 5
    assert (est.low, est.high) == (differences[k - 1], differences[-k]) == (7.0, 13.0)


def test_thin_keeps_the_quantiles_and_is_deterministic():
    values = [float(v) for v in range(1000, 0, -1)]
    thinned = thin(values)
    assert len(thinned) == MAX_SAMPLES and thinned == sorted(thinned)
    assert (thinned[0], thinned[-1]) == (1.0, 1000.0)
    assert median(thinned) == pytest.approx(median(values), rel=0.01)
    assert thin(values) == thinned


def _lognormal(rnd: random.Random, n: int, scale: float = 1.0) -> list[float]:
    """Skewed, outlier-prone samples, like per-step times."""
    return [scale * math.exp(rnd.gauss(0.0, 0.5)) for _ in range(n)]


def test_same_distribution_rarely_excludes_zero():
    """Two runs that differ only by noise: the 95 % interval should exclude 0 about 5 % of the time."""
    rnd = random.Random(25)
    trials = 400
    alarms = 0
    for _ in range(trials):
        est = shift(_lognormal(rnd, 20), _lognormal(rnd, 20))
        alarms += est.low is not None and (est.low > 0 or est.high < 0)
    assert alarms / trials <= 0.08, alarms


def test_a_real_shift_is_found_and_bracketed():
    """NEW twice as slow (the medians 1 and 2): found almost always. A pure shift of 0.5 (the model the interval
    assumes): the interval holds it about 95 % of the time."""
    rnd = random.Random(7)
    trials = 200
    found = covered = 0
    for _ in range(trials):
        est = shift(_lognormal(rnd, 20), _lognormal(rnd, 20, scale=2.0))
        found += est.low is not None and est.low > 0
        base = _lognormal(rnd, 20)
        moved = shift(base, [v + 0.5 for v in _lognormal(rnd, 20)])
        assert moved.low is not None and moved.high is not None
        covered += moved.low <= 0.5 <= moved.high
    assert found / trials >= 0.9, found
    assert 0.90 <= covered / trials <= 0.99, covered


def test_many_samples_are_thinned_not_refused():
    rnd = random.Random(3)
    base = [rnd.uniform(0, 1) for _ in range(20_000)]
    new = [v + 0.25 for v in (rnd.uniform(0, 1) for _ in range(20_000))]
    est = shift(base, new)
    assert est.estimate == pytest.approx(0.25, abs=0.03)
    assert est.low is not None and est.high is not None and est.low < 0.25 < est.high
