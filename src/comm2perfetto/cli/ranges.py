"""Number ranges on the command line: merge's ``--ranks 0-7,12`` and ``--window 10:20``, report's ``--steps 3-7``.

Kept apart from the modules that use the numbers, so parsing a command line imports nothing heavy.
"""

from __future__ import annotations

import re

_UNITS = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000, "": 1_000_000_000}


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


def parse_window(text: str) -> tuple[int, int]:
    """``10:20`` -> (10 s, 20 s) in ns; either side may be empty; units ns, us, ms, s (default s). Raises
    ValueError saying what is wrong."""
    if ":" not in text:
        raise ValueError(f"{text!r}: expected START:END, e.g. 10:20 or 1500ms:2s")
    lo_text, hi_text = text.split(":", 1)
    lo = _parse_time(lo_text, text) if lo_text.strip() else 0
    hi = _parse_time(hi_text, text) if hi_text.strip() else 2**62
    if hi <= lo:
        raise ValueError(f"{text!r}: the end must come after the start")
    return lo, hi


def _parse_time(part: str, whole: str) -> int:
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(ns|us|ms|s)?\s*", part)
    if m is None:
        raise ValueError(f"{whole!r}: cannot read {part!r} as a time (e.g. 12.5, 300ms, 2s)")
    return int(float(m.group(1)) * _UNITS[m.group(2) or ""])
