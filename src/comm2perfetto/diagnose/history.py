"""Which side of a disagreement is wrong, from each rank's own history: no votes, no tie rules. No torch.

When the ranks of a collective disagree (different ops, sizes, dtypes, roots), counting them says nothing about
who is wrong: two ranks split one against one, and two faulty ranks outvote one sound one. What each rank did
before does: a training loop repeats, so each rank's recent collectives on a group have a period, and a rank
whose collective at this point breaks its own period (another call site than its cycle issues from here, or the
same call site asking for other sizes) deviates, while a rank that keeps its period conforms. Culprits are the
ranks that deviate, when some rank conforms; without that, nothing separates them and they stay suspects.

A rank's history is its last ``WINDOW`` collectives on the group (what it recorded: Flight Recorder entries and
the recorder's calls), each a token (call site where known, signature); the period is the smallest P
(``MAX_PERIOD`` at most) that the window repeats with, seen at least twice::

    tokens, newest first:  (L12, all_reduce[16]) (L12, all_reduce[16]) (L12, all_reduce[16]) ...  period 1
    this collective:       (L12, all_reduce[17])  -> deviates: its size at L12 differs from its own last call there
    a peer's:              (L12, all_reduce[16])  -> conforms
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from comm2perfetto.diagnose.signatures import compare
from comm2perfetto.job import Job
from comm2perfetto.model import GroupView, Signature, call_site

__all__ = ["Judgement", "divergence", "judge"]

WINDOW = 16  # earlier collectives of the rank read (each may cost a stack lookup)
MAX_PERIOD = 6  # the longest cycle looked for: collectives a step issues on one group
CONFORMS, DEVIATES, UNKNOWN = "conforms", "deviates", "unknown"


@dataclass(frozen=True, slots=True)
class Judgement:
    """What a rank's own history says of its part in a collective: ``verdict`` (``conforms``, ``deviates``,
    ``unknown``: too little history, or no period) and, when it deviates, ``why`` (a sentence)."""

    verdict: str
    why: str = ""


Token = tuple[str | None, Signature]


def judge(job: Job, cols: GroupView, index: int, rank: int) -> Judgement:
    """Judge ``rank``'s part in the ``index``-th collective of ``cols`` (a group's collectives) by its history."""
    group_size = len(cols.ranks)
    read = _reader(job, cols, rank)
    current = read(index)
    if current is None:
        return Judgement(UNKNOWN)
    history: list[Token] = []
    j = index - 1
    while j >= 0 and len(history) < WINDOW:
        token = read(j)
        if token is not None:
            history.append(token)
        j -= 1
    same = _same(group_size)
    period = next((p for p in range(1, MAX_PERIOD + 1) if len(history) >= 2 * p
                   and all(same(history[i], history[i + p]) for i in range(len(history) - p))), None)
    if period is None:
        return Judgement(UNKNOWN)
    expected = history[period - 1]
    if same(current, expected):
        return Judgement(CONFORMS)
    return Judgement(DEVIATES, _why(current, expected, history, group_size))


def divergence(job: Job, cols: GroupView, index: int, ranks: Sequence[int]) -> int | None:
    """Where the ranks' call sites parted before the ``index``-th collective: the latest of the last ``WINDOW``
    collectives whose call sites differ between the ranks while their signatures matched. A rank that issued an
    extra collective (or skipped one) from its own line shifts every later collective against its peers'; the
    mismatch shows only later, where the shifted collectives differ, and the rank to judge is the one that left
    its cycle where the sites parted. None: the sites never parted (or are not known, or differ all along, as
    rank-dependent code paths make them)."""
    reads = [_reader(job, cols, r) for r in ranks]
    parted: list[int] = []
    seen = 0
    for j in range(index - 1, max(-1, index - 1 - WINDOW), -1):
        tokens = [read(j) for read in reads]
        if any(t is None or t[0] is None for t in tokens):
            return None
        seen += 1
        if len({t[0] for t in tokens if t is not None}) > 1:
            parted.append(j)
    return parted[0] if parted and len(parted) < seen else None


def _why(current: Token, expected: Token, history: Sequence[Token], group_size: int) -> str:
    site, sig = current
    if site is not None and expected[0] is not None and site != expected[0]:
        seen = any(t[0] == site for t in history)
        return (f"it issued this one from {site}, where its own cycle of the last {len(history)} collectives "
                f"issues from {expected[0]}" + ("" if seen else f" ({site} is new in its history)"))
    what = compare(expected[1], sig, group_size) or "signature"
    where = f" at {site}" if site is not None else ""
    return (f"its {what}{where} differs from its own cycle: {sig.describe()} where it issued "
            f"{expected[1].describe()} before")


def _same(group_size: int) -> Callable[[Token, Token], bool]:
    """Two calls of one rank are the same step of its cycle: the same call site (where both are known) and the
    same signature, exactly (an all-to-all's splits may differ between ranks, not between one rank's steps
    unless its data decides them, and then nothing is periodic); records of different sources (a Flight
    Recorder entry, a recorder call) by what both show."""
    def same(a: Token, b: Token) -> bool:
        if a[0] is not None and b[0] is not None and a[0] != b[0]:
            return False
        x, y = a[1], b[1]
        if x is y or x == y:
            return True
        return x.source != y.source and compare(x, y, group_size) is None and compare(y, x, group_size) is None
    return same


def _reader(job: Job, cols: GroupView, rank: int) -> Callable[[int], Token | None]:
    """Reads ``rank``'s (call site, signature) in the j-th collective, from its own column (a 16,384-rank group
    is not decoded for one rank's history)."""
    def read(j: int) -> Token | None:
        sig = cols.value("signatures", rank, j)
        if sig is None:
            return None
        sid = cols.value("stack_ids", rank, j)
        stack = job.stack(sid) if sid is not None else ()
        if not stack and job.resolver is not None and cols.value("sources", rank, j) != "log":
            stack = job.resolver(rank, cols.group.name, cols.seqs[j])
        frame = call_site(stack)
        return (frame.site if frame is not None else None), sig
    return read
