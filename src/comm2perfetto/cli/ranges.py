"""Number ranges on the command line: merge's ``--ranks 0-7,12`` and report's ``--steps 3-7``.

Kept apart from the modules that use the numbers, so parsing a command line imports nothing heavy.
"""

from __future__ import annotations


def parse_ranks(text: str) -> set[int]:
    """``0-7,12`` -> {0, ..., 7, 12}. Raises ValueError with the bad part named."""
    out: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        bounds = int_range(part)
        if bounds is None:
            raise ValueError(f"bad rank range {part!r} (expected e.g. 0-7,12)")
        out.update(range(bounds[0], bounds[1] + 1))
    if not out:
        raise ValueError("no ranks given (expected e.g. 0-7,12)")
    return out


def int_range(text: str) -> tuple[int, int] | None:
    """``3-7`` -> (3, 7), ``5`` -> (5, 5); None unless 0 <= A <= B."""
    lo, sep, hi = text.partition("-")
    try:
        first = int(lo)
        last = int(hi) if sep else first
    except ValueError:
        return None
    return (first, last) if 0 <= first <= last else None
