"""Noise versus change: a rank-based shift between two sets of samples.

Standard library only (the readers depend on orjson alone).

- :func:`shift`: the Hodges-Lehmann estimate of how far NEW's samples lie from BASE's (the median of every
  difference ``new_j - base_i``) and its distribution-free confidence interval (Moses), which is the set of
  shifts a two-sided Mann-Whitney U test at the same level would not reject. It assumes the samples of a side
  are independent draws from one distribution and the two distributions differ by a shift; nothing about their
  shape (per-step times are skewed and have outliers: a rank test shrugs them off).

>>> s = shift([10, 11, 12, 13, 14, 15], [20, 21, 22, 23, 24, 25])
>>> s.estimate, s.low, s.high
(10.0, 7, 13)
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

CONFIDENCE = 0.95
MAX_SAMPLES = 200  # per side: the interval needs every pairwise difference (200 x 200 = 40,000 of them)
EXACT_UP_TO = 20  # the U distribution is counted exactly while both sides have at most this many samples


@dataclass(frozen=True)
class Estimate:
    """A change and its confidence interval, in the samples' unit; ``low``/``high`` None when the samples are
    too few for any interval at this confidence (the interval would be unbounded)."""

    estimate: float
    low: float | None
    high: float | None

    @property
    def bounded(self) -> bool:
        return self.low is not None and self.high is not None


def median(values: Sequence[float]) -> float:
    """The middle value (the mean of the two middle ones for an even count) of a non-empty sequence.

    >>> median([3, 1, 2]), median([4, 1, 3, 2])
    (2, 2.5)
    """
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def thin(values: Sequence[float], most: int = MAX_SAMPLES) -> list[float]:
    """At most ``most`` of the values, sorted: evenly spaced quantiles of them, so the distribution keeps its
    shape and the result is the same on every run (no random draw).

    >>> thin(range(10), 4)
    [0, 3, 6, 9]
    """
    ordered = sorted(values)
    if len(ordered) <= most:
        return ordered
    last = len(ordered) - 1
    return [ordered[round(i * last / (most - 1))] for i in range(most)]


def u_distribution(n: int, m: int) -> list[int]:
    """How many of the C(n+m, n) orderings of two samples without ties give each Mann-Whitney U, 0..n*m: the
    coefficients of the Gaussian binomial [n+m choose n], as the product of (1 - q^(m+i)) / (1 - q^i).

    >>> u_distribution(2, 2)
    [1, 1, 2, 1, 1]
    """
    size = n * m + 1
    coef = [1] + [0] * (size - 1)
    for i in range(1, n + 1):
        # multiply by (1 - q^(m+i)), then divide by (1 - q^i): the division is a running sum with stride i
        for u in range(size - 1, m + i - 1, -1):
            coef[u] -= coef[u - m - i]
        for u in range(i, size):
            coef[u] += coef[u - i]
    return coef


@functools.lru_cache(maxsize=1024)
def order_statistic_rank(n: int, m: int, confidence: float = CONFIDENCE) -> int:
    """k such that the k-th smallest and the k-th largest of the n*m differences bound the interval; 0 when
    even the smallest and largest do not reach ``confidence`` (too few samples).

    >>> order_statistic_rank(4, 4), order_statistic_rank(3, 3), order_statistic_rank(10, 10)
    (1, 0, 24)
    """
    tail = (1 - confidence) / 2
    if n <= EXACT_UP_TO and m <= EXACT_UP_TO:
        counts = u_distribution(n, m)
        total = math.comb(n + m, n)
        k, below = 0, 0
        while below + counts[k] <= tail * total:  # P(U <= k) <= tail: D_(k+1) is still a valid lower bound
            below += counts[k]
            k += 1
        return k
    z = NormalDist().inv_cdf(1 - tail)
    return max(math.floor(n * m / 2 - z * math.sqrt(n * m * (n + m + 1) / 12)), 0)


def shift(base: Sequence[float], new: Sequence[float], confidence: float = CONFIDENCE) -> Estimate:
    """Hodges-Lehmann shift of ``new`` from ``base`` with Moses' interval (see the module docstring). Each
    side is first thinned to :data:`MAX_SAMPLES` values. Both sides must be non-empty."""
    a, b = thin(base), thin(new)
    differences = sorted(y - x for x in a for y in b)
    estimate = median(differences)
    k = order_statistic_rank(len(a), len(b), confidence)
    if k == 0:
        return Estimate(estimate, None, None)
    return Estimate(estimate, differences[k - 1], differences[-k])
