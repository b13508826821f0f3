"""Small readings of a job's evidence that the diagnose passes share: how a member of a collective stands in
it, where a rank called it, element counts. No torch."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from comm2perfetto.job import Job
from comm2perfetto.model import (
    Collective,
    call_site,
)
from comm2perfetto.words import ranks_text

__all__ = ["JOINED", "NEVER_ISSUED", "NOT_KNOWN", "NO_RECORD", "numel", "ordinal", "site_list", "sites_of"]

# How a member stands in a collective, as its records show (end_state.member_status).
JOINED, NEVER_ISSUED, NOT_KNOWN, NO_RECORD = "joined", "missing", "unknown", "no_data"


def sites_of(job: Job, c: Collective, ranks: Sequence[int], limit: int = 4) -> dict[int, str]:
    """Call sites of the first ``limit`` of these ranks that have one (each may cost reading a dump)."""
    out: dict[int, str] = {}
    for r in ranks:
        if c.signatures[c.ranks.index(r)] is None:
            continue
        frame = call_site(job.stack_of(c, r))
        if frame is not None:
            out[r] = frame.site
        if len(out) >= limit:
            break
    return out


def site_list(sites: Mapping[int, str]) -> str:
    by_site: dict[str, list[int]] = {}
    for r, s in sites.items():
        by_site.setdefault(s, []).append(r)
    return "; ".join(f"{s} ({ranks_text(rs)})" for s, rs in by_site.items())


def ordinal(n: int) -> str:
    """``1st``, ``2nd``, ``3rd``, ``11th``, ``22nd``."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def numel(sizes) -> int:
    return sum(math.prod(s) for s in sizes)
