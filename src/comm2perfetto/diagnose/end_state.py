"""The first collective of each group that did not complete on all its ranks, at the end of the data, and at
the moments the recorder detected a stall (the job may have gone on): which finding tells it. No torch."""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from comm2perfetto.diagnose.evidence import (
    JOINED,
    NEVER_ISSUED,
    NO_RECORD,
    NOT_KNOWN,
    numel,
)
from comm2perfetto.diagnose.findings import (
    Finding,
)
from comm2perfetto.diagnose.mismatch import mismatch
from comm2perfetto.diagnose.stalls import stall_times
from comm2perfetto.diagnose.waiting import missing, shifted, stuck, waiting_for_no_dump, waiting_for_unseen
from comm2perfetto.job import Coverage, Job
from comm2perfetto.model import (
    COMPLETED,
    NOT_DONE_STATES,
    SCHEDULED,
    STARTED,
    UNKNOWN,
    Collective,
    GroupView,
    ProcessGroup,
    Signature,
    op_family,
)

__all__ = ["end_state", "stall_state"]

STALE_TAIL = 8  # the last collectives of a rank's dump looked at for a dump older than the others'


# --- the end of the data ---------------------------------------------------------------------------------


def member_status(job: Job, c: Collective, i: int, cov: Coverage | None) -> str:
    if c.signatures[i] is not None:
        return JOINED
    if cov is None:
        return NO_RECORD
    seq = c.seq
    if seq < cov.first_seq or cov.unread_at(seq):
        return NOT_KNOWN  # overwritten in the ring buffer, or its entry there unreadable
    if seq <= cov.last_seq:
        # it went past this seq, unseen: its log has a later one (the recorder sees Python calls, not those
        # issued from C++, DDP's), and its Flight Recorder dump, where it has one, is older than that
        return NOT_KNOWN
    if cov.has_fr:
        return NEVER_ISSUED  # Flight Recorder records every collective: absent means never issued
    if seq in job.log_seqs.get(c.group.uid, ()):
        return NEVER_ISSUED  # a Python-issued collective the recorder would have seen on this rank too
    return NOT_KNOWN


def end_state(job: Job, group: ProcessGroup, notes: list[str]) -> Finding | None:
    cols = job.collectives.get(group.uid)
    if not cols:
        return None
    covs = [job.coverage.get((r, group.uid)) for r in group.ranks]
    start = max((c.first_seq for c in covs if c is not None), default=0)
    n = len(group.ranks)
    horizon = stale_dumps(job, group, cols)
    settled = cols.settled_prefix()  # skipped in C, not one by one
    for i in range(settled, len(cols)):  # by index: islice would make a view of each collective it skips
        c = cols[i]
        if c.seq < start:
            continue
        beyond = {r for r, h in horizon.items() if c.seq >= h}  # their dump is too old to speak about c
        sigs = c.signatures
        all_present = all(sigs)  # signatures are always truthy; None marks a rank without a record
        if all_present and sigs.count(sigs[0]) == n and not beyond:
            if set(c.states).isdisjoint(NOT_DONE_STATES):
                continue
            return stuck(job, c, group)
        statuses = [NO_RECORD if r in beyond else member_status(job, c, i, covs[i]) for i, r in enumerate(c.ranks)]
        absent = [r for r, s in zip(group.ranks, statuses) if s == NEVER_ISSUED]
        if absent:
            joined = [r for r, st in zip(group.ranks, statuses) if st == JOINED]
            return shifted(job, c, cols, i, joined, absent) or missing(job, c, absent, statuses)
        joined_states = {s for s, st in zip(c.states, statuses) if st == JOINED}
        done = joined_states.isdisjoint(NOT_DONE_STATES)
        differs = mismatch(job, c, cols, i)
        if differs is not None:
            if not (done and all_present and harmless(c)):
                return differs
            notes.append(f"{c.op} #{c.seq} on {group.label} completed on every rank although the ranks described "
                         f"it differently ({differs.detail.split(': ', 1)[-1].rstrip('.')}): the same collective "
                         "and element counts in other shapes or through another API, harmless here")
        # members whose part is unseen (their recorder does not see C++-issued collectives, and no dump of theirs
        # shows this one), who issued nothing later here and did not exit cleanly: the joined ranks may still be
        # waiting for them
        unseen = [r for r, s, cov in zip(group.ranks, statuses, covs)
                  if s == NOT_KNOWN and (cov is None or c.seq > cov.last_seq) and not closed_cleanly(job, r)]
        held = still_inside(job, c, covs, statuses) if done and unseen else []
        if done and not held:
            continue
        no_data = [r for r, s in zip(group.ranks, statuses) if s == NO_RECORD]
        if no_data:
            return waiting_for_no_dump(job, c, no_data, {r: horizon[r] for r in no_data if r in horizon})
        if unseen:
            waiting = held or [r for r, s, st in zip(group.ranks, statuses, c.states)
                               if s == JOINED and st in NOT_DONE_STATES]
            return waiting_for_unseen(job, c, waiting, unseen)
        return stuck(job, c, group)
    return None


def still_inside(job: Job, c: Collective, covs: Sequence[Coverage | None], statuses: Sequence[str]) -> list[int]:
    """The ranks that joined ``c`` and may still be inside it: its completion on them is unknown (gloo's
    Flight Recorder marks none; ``pg_status`` had not counted it), it is the last collective of the group they
    issued, and their log did not close cleanly. Such a rank, blocked in ``c``, cannot issue the next one: it
    waits, it did not skip."""
    return [r for r, cov, status in zip(c.ranks, covs, statuses)
            if status == JOINED and cov is not None and cov.last_seq == c.seq and c.state_of(r) == UNKNOWN
            and not closed_cleanly(job, r)]


def closed_cleanly(job: Job, rank: int) -> bool:
    info = job.ranks.get(rank)
    return info is not None and bool(info.closed_cleanly)


def stale_dumps(job: Job, group: ProcessGroup, cols: GroupView) -> dict[int, int]:
    """Ranks known only from a Flight Recorder dump taken before the others': it ends before a collective
    another rank completed, or its tail (two collectives or more) is unfinished where other ranks completed
    the same collectives; neither can happen without every rank. Such a dump is a horizon: rank -> the first
    seq it cannot speak about."""
    out: dict[int, int] = {}
    done_somewhere: dict[int, bool] = {}

    def completed_anywhere(k: int) -> bool:
        if k not in done_somewhere:
            done_somewhere[k] = COMPLETED in cols[k].states
        return done_somewhere[k]

    last_done: int | None = None  # the latest collective some rank completed: it needed every rank
    for k in range(len(cols) - 1, -1, -1):
        if completed_anywhere(k):
            last_done = cols[k].seq
            break
    for rank in group.ranks:
        cov = job.coverage.get((rank, group.uid))
        if cov is None or not cov.has_fr or cov.has_log:
            continue
        if last_done is not None and cov.last_seq < last_done:
            out[rank] = cov.last_seq + 1  # its dump ends before a collective that completed: an older dump
            continue
        # its last records (up to STALE_TAIL), newest first, read one value at a time: no rank's tuple of
        # every collective (a group of 16,384 ranks asks this of each)
        stale: list[int] = []
        seen = 0
        k = bisect.bisect_right(cols, cov.last_seq, key=lambda c: c.seq) - 1
        while k >= 0 and seen < STALE_TAIL:
            state = cols.value("states", rank, k)  # the rank's column alone
            k -= 1
            if state is None:
                continue  # no record of it on this rank
            seen += 1
            if state not in (STARTED, SCHEDULED) or not completed_anywhere(k + 1):
                break
            stale.append(cols[k + 1].seq)
        if len(stale) >= 2:
            out[rank] = min(stale)
    return out


def harmless(c: Collective) -> bool:
    """Ranks that differ only where it cannot matter: one collective (op family, root), the same element
    counts and dtypes, other shapes or another API (``all_gather`` and ``all_gather_into_tensor``)."""
    def key(sig: Signature | None) -> tuple:
        if sig is None:
            return ()
        if sig.parts:
            return tuple(key(p) for p in sig.parts)
        return (op_family(sig.op), sig.root, numel(sig.input_sizes or ()), numel(sig.output_sizes or ()),
                tuple(sorted(set(sig.input_dtypes or ()))))
    return len({key(sig) for sig in c.signatures}) == 1


# --- stalls the recorder saw (the job may have gone on) --------------------------------------------------


def stall_state(job: Job, group: ProcessGroup) -> Finding | None:
    """At the first stall the recorder saw that shows one: who was waiting in which collective, and who had
    not come (a stall another group's wait raised, or a slow start the job got over, may show nothing here).

    First the earliest collective that some ranks had joined by then and others had not: those others are
    missing. Else the earliest one everybody had joined whose end is known to come after the stall. A
    collective without any end time (gloo's Flight Recorder entries never get one) is no evidence of a hang
    by itself: the ones after it were issued, so it is taken as done.
    """
    cols = job.collectives.get(group.uid)
    if cols is None:
        return None
    for t in stall_times(job):
        f = stalled_at(job, group, cols, t)
        if f is not None:
            return f
    return None


def stalled_at(job: Job, group: ProcessGroup, cols: GroupView, t: int) -> Finding | None:
    # A rank without data, or whose data ends before the stall, says nothing about it: "not seen" is not
    # "not issued" (its horizon; a ring buffer that wrapped is handled by the coverage).
    known = [seen_at(job, r, group, t) for r in group.ranks]
    for i, c in enumerate(cols):
        arrived = [a is not None and a <= t for a in c.arrive_ns]
        if any(arrived) and not all(here or not k for here, k in zip(arrived, known)):
            before = cols[i - 1] if i and cols[i - 1].seq == c.seq - 1 else None
            late = [r for r, here, k in zip(c.ranks, arrived, known)
                    if k and not here and not (before is not None and inside_at(before, r, t))]
            if not late:  # the ranks that had not come were still inside the collective before it
                continue
            statuses = [NEVER_ISSUED if r in late else JOINED if here else NOT_KNOWN
                        for r, here in zip(c.ranks, arrived)]
            return missing(job, c, late, statuses, at_ns=t, resolved=went_on(job, c, cols[i + 1:]))
    for i, c in enumerate(cols):
        if not all(a is not None and a <= t for a in c.arrive_ns):
            continue
        ends = [e for e in c.end_ns if e is not None]
        if ends and (len(ends) < len(c.end_ns) or max(ends) > t):
            return stuck(job, c, group, at_ns=t, resolved=went_on(job, c, cols[i + 1:]))
    return None


def inside_at(c: Collective, rank: int, t: int) -> bool:
    """``rank`` had issued ``c`` by ``t`` and nothing shows it completed by then (no end time by ``t``, and no
    completed state: gloo's C++-issued collectives have neither): it may still have been waiting in it."""
    arrive, end = c.arrival_of(rank), c.end_of(rank)
    if arrive is None or arrive > t:
        return False
    return (end is None and c.state_of(rank) != COMPLETED) or (end is not None and end > t)


def seen_at(job: Job, rank: int, group: ProcessGroup, t: int) -> bool:
    info = job.ranks.get(rank)
    if info is None or job.coverage.get((rank, group.uid)) is None:
        return False
    return info.last_ns is None or info.last_ns >= t


def went_on(job: Job, c: Collective, later: Sequence[Collective]) -> bool:
    """The group got past ``c``: it completed everywhere, every rank issued a later collective, or every
    rank's recorder log closed normally after it. (Gloo's ``pg_status`` can lag a completion by a moment,
    so a rank's last dump may not show its last collective completed.)"""
    if c.completed_everywhere or any(all(sig is not None for sig in x.signatures) for x in later):
        return True
    return all(closed_cleanly(job, r) for r in c.ranks)
