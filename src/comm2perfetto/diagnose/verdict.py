"""The one place that turns findings into the verdict's status (``Status``), for diagnose and the live verdict.

Worst first: a desync, then a death, then a hang, then anything left unexplained. A healthy status (``ok``,
``interrupted``, ``running``) is reachable only when no unresolved finding is left, and never while a stall the
data saw is unresolved: the status is then at least ``stuck``, and where no finding is about a wait ``conclude``
adds the ``stall_unexplained`` finding ``stall`` describes (what is known: who waits where), so that "stuck,
cause not found" is said rather than OK. A stall that resolved (the job
went on) is reported, and is no problem. No torch.

    >>> conclude([])
    (<Status.OK: 'ok'>, [])
    >>> status, findings = conclude([], stall=unexplained_stall([0, 1], "default_pg", "0", "all_reduce", 4, None))
    >>> status, [str(f.kind) for f in findings]
    (<Status.STUCK: 'stuck'>, ['stall_unexplained'])
"""

from __future__ import annotations

from collections.abc import Sequence

from comm2perfetto.diagnose.findings import (
    DESYNC_KINDS,
    MISSING_RANKS,
    NO_DUMP,
    P2P_MISMATCH,
    RANK_DIED,
    RANK_FROZEN,
    STALL_UNEXPLAINED,
    STUCK_ALL_JOINED,
    Finding,
    Kind,
    Status,
)
from comm2perfetto.words import ranks_text

__all__ = ["conclude", "unexplained_stall"]

_STUCK_KINDS = frozenset({MISSING_RANKS, STUCK_ALL_JOINED, RANK_FROZEN, STALL_UNEXPLAINED})


def conclude(findings: Sequence[Finding], *, interrupted: bool = False, running: bool = False,
             stall: Finding | None = None) -> tuple[Status, list[Finding]]:
    """The status of ``findings`` and the findings it rests on. ``stall``: a ``stall_unexplained`` finding for
    an unresolved stall the data saw: the verdict is then at least ``stuck``, and ``stall`` is added when no
    finding is about a wait (a rank without data that nobody waits in is no explanation of a stall);
    ``interrupted``/``running``: the job was interrupted, or still runs (healthy otherwise)."""
    out = list(findings)
    open_findings = [f for f in out if not f.resolved]
    if stall is not None and not any(f.kind != NO_DUMP or f.seq is not None for f in open_findings):
        out.append(stall)
        open_findings.append(stall)
    # A finding blocked by another follows from it: the root causes decide what the job is.
    kinds = {_status_kind(f) for f in open_findings if f.blocked_by is None}
    if kinds & set(DESYNC_KINDS):
        return Status.DESYNC, out
    if RANK_DIED in kinds:
        return Status.CRASHED, out
    if kinds & _STUCK_KINDS or (stall is not None):
        return Status.STUCK, out
    if kinds:
        return Status.INCOMPLETE, out
    if interrupted:
        return Status.INTERRUPTED, out
    if running:
        return Status.RUNNING, out
    return Status.OK, out


def _status_kind(f: Finding) -> Kind:
    """The kind a finding counts as for the status: a send or receive whose peer never posted its side and
    issued nothing since (``evidence.waiting``: the peer is away, not out of step) is a wait, as a missing rank."""
    if f.kind == P2P_MISMATCH and f.evidence.get("waiting"):
        return MISSING_RANKS
    return f.kind


def unexplained_stall(waiting: Sequence[int], group_label: str, group_uid: str, op: str | None, seq: int | None,
                      t_ns: int | None, known: str = "") -> Finding:
    """A stall nothing in the data explains: ``waiting`` ranks are blocked in ``op`` #``seq`` on the group (or
    were, when the stall was detected); ``known``: what else is known, a sentence or two."""
    what = f"{op} #{seq} on {group_label}" if op and seq is not None else (op or "a call")
    detail = (f"The job stalled: {ranks_text(list(waiting)) if waiting else 'a rank'} "
              f"{'were' if len(waiting) > 1 else 'was'} waiting in {what}, and the data shows no cause: every "
              "rank the recorder could see had issued it, none is known to have died or frozen, and nothing "
              "they issued disagrees." + (f" {known}" if known else ""))
    action = ("Look at every rank of this group (py-spy dump of each process, its host and network): the cause is "
              "outside what was recorded.")
    return Finding(kind=STALL_UNEXPLAINED, process_group=group_label, group_uid=group_uid, seq=seq, op=op,
                   ranks_joined=tuple(waiting), ranks_missing=(), culprit_ranks=(), detail=detail, action=action,
                   t_ns=t_ns, basis="no data singles out a rank")
