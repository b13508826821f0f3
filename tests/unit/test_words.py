"""words.py: the one wording of rank lists, durations and sizes every view uses."""

from __future__ import annotations

import pytest

from comm2perfetto.words import MAX_RANK_PARTS, duration, rank_list, ranks_text, size


@pytest.mark.parametrize(("ranks", "text"), [
    ([3, 0, 1, 2, 5, 8, 9], "0-3, 5, 8, 9"),  # a run of two stays two ranks; three or more fold
    ([7], "7"), ([1, 3, 7], "1, 3, 7"), ([0, 1, 2], "0-2"), ([0, 1], "0, 1"), ([2, 2, 1, 0], "0-2"),
    (["10", "9", "8", "1"], "1, 8-10"),  # the report's keys are text, sorted as numbers
    (["0", "1", "2", "x"], "0-2, x"),  # anything else goes last, as written
    ([], "none"),
])
def test_rank_list_names_every_rank_and_folds_runs_of_three(ranks, text):
    assert rank_list(ranks) == text


@pytest.mark.parametrize(("ranks", "text"), [
    ([2], "rank 2"), (["2"], "rank 2"), ([0, 1], "ranks 0, 1"), ([5, 3, 2, 1, 0], "ranks 0-3, 5"),
    (range(1024), "ranks 0-1023"), ([], "no rank"),
])
def test_ranks_text_reads_in_a_sentence(ranks, text):
    assert ranks_text(ranks) == text


def test_ranks_text_is_bounded_for_a_scattered_list_and_says_how_many():
    evens = range(0, 1024, 2)  # no run to fold: 512 parts
    assert ranks_text(evens) == "512 ranks (0, 2, 4, 6, 8, ...)"
    exactly = [0, 2, 4, 6, 8, 10][:MAX_RANK_PARTS]
    assert ranks_text(exactly) == "ranks " + ", ".join(map(str, exactly))  # at the bound, all shown
    assert ranks_text([*range(4), *range(10, 100, 2)]).startswith(f"{4 + len(range(10, 100, 2))} ranks (0-3, 10, ")


@pytest.mark.parametrize(("ns", "text"), [
    (0, "0 s"), (12_500_000, "12.5 ms"), (3_200_000_000, "3.20 s"), (850_000, "850 us"), (999, "999 ns"),
    (999_600_000, "1.00 s"),  # rounds to 1 s: said in seconds, not "1000 ms"
    (4_500 * 10**9, "4500 s"), (-2_000_000, "-2.00 ms"), (14_600.4, "14.6 us"),
])
def test_duration_is_si_with_a_space_and_three_digits(ns, text):
    assert duration(ns) == text


@pytest.mark.parametrize(("n", "text"), [
    (0, "0 B"), (1023, "1023 B"), (1024, "1.00 KiB"), (round(53.2 * 1024), "53.2 KiB"),
    (3 * 2**19, "1.50 MiB"), (2**30, "1.00 GiB"), (5 * 2**40, "5.00 TiB"),
])
def test_size_is_in_binary_multiples_named_as_such(n, text):
    assert size(n) == text
