"""How the same facts are worded in every view: rank lists, durations, sizes, the order of process groups."""

from __future__ import annotations


def rank_span(ranks) -> str:
    """``0-3`` for three or more consecutive ranks, else ``0, 1`` / ``1, 3, 7``; ``none`` for no rank."""
    ranks = sorted(ranks)
    if not ranks:
        return "none"
    if ranks == list(range(ranks[0], ranks[-1] + 1)) and len(ranks) > 2:
        return f"{ranks[0]}-{ranks[-1]}"
    return ", ".join(map(str, ranks))
