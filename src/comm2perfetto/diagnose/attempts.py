"""A job torchrun restarted (``--max-restarts``): the verdict is about one attempt, and says how the others
ended, each in a line from its own verdict. Pure functions over diagnoses; loading is the caller's.

What a verdict carries (``Diagnosis.attempt``, ``Diagnosis.other_attempts``) and how it reads::

    {"attempt": 1, "other_attempts": [{"attempt": 0, "status": "crashed", "culprit_ranks": [1],
                                       "summary": "rank 1 raised RuntimeError: boom"}]}

    torchrun restarted the job: this verdict is about attempt 1, the last of attempts 0, 1.
    Attempt 0: crashed, rank 1 raised RuntimeError: boom (`--attempt 0` for its verdict).
"""

from __future__ import annotations

from collections.abc import Sequence

from comm2perfetto.diagnose.findings import RANK_DIED, AttemptEnd, Diagnosis, Finding
from comm2perfetto.words import ranks_text

SUMMARY_CHARS = 160  # an exception's message is cut here: the attempt's own verdict has it whole

_NO_FINDING = {
    "ok": "every collective matched on all ranks",
    "interrupted": "interrupted, with no communication problem before",
    "running": "still running",
}


def attempt_end(attempt: int, d: Diagnosis) -> AttemptEnd:
    """``attempt``'s ending, from its verdict: the first finding (the most important) says what happened."""
    culprits = tuple(sorted({r for f in d.findings for r in f.culprit_ranks}))
    if not d.findings:
        return AttemptEnd(attempt, d.status, culprits, _NO_FINDING.get(d.status, d.status))
    return AttemptEnd(attempt, d.status, culprits, _what_happened(d.findings[0]))


def _what_happened(f: Finding) -> str:
    if f.kind == RANK_DIED and f.culprit_ranks:
        rank, ended = f.culprit_ranks[0], _first_line(str(f.evidence.get("ended") or ""))
        if f.evidence.get("how") == "exception":
            return f"rank {rank} raised {ended}"
        return f"rank {rank} died ({ended})" if ended else f"rank {rank} died"
    what = f"{f.kind}"
    if f.op is not None:
        what += f" on {f.process_group}: {f.op}" + (f" #{f.seq}" if f.seq is not None else "")
    if f.culprit_ranks:
        what += f", culprit {ranks_text(f.culprit_ranks)}"
    return what + (" (resolved: the job went on)" if f.resolved else "")


def _first_line(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= SUMMARY_CHARS else line[:SUMMARY_CHARS].rstrip() + "..."


def attempts_text(attempt: int | None, others: Sequence[AttemptEnd], about: str = "this verdict") -> str | None:
    """Which attempt ``about`` (the verdict, a trace, a report) describes and how the others ended, for a
    person; None when the job was not restarted (no attempt read, or attempt 0 alone)."""
    if attempt is None or (attempt == 0 and not others):
        return None
    every = sorted([attempt, *(a.attempt for a in others)])
    which = "the last" if attempt == every[-1] else "not the last"
    text = (f"torchrun restarted the job: {about} is about attempt {attempt}, {which} of attempts "
            f"{', '.join(map(str, every))}.")
    if not others:
        text += " No earlier attempt left files here."
    for a in sorted(others, key=lambda a: a.attempt):
        how = f"{a.status}, {a.summary}" if a.status is not None else a.summary
        text += f" Attempt {a.attempt}: {how} (`--attempt {a.attempt}` for its verdict)."
    return text
