"""Why is the job stuck or desynced? A pure function over a ``Job``. Never imports torch.

For each process group, the first collective not completed by all its ranks, classified as:

- ``missing_ranks``: some ranks never issued it (what each was doing instead is attached);
- ``op_mismatch`` / ``size_mismatch`` / ``dtype_mismatch``: ranks issued different things at the same seq;
- ``stuck_all_joined``: every rank issued it and it did not complete (the slowest rank is named);
- ``no_dump``: ranks that left no data at all (alone, or as the ranks a stuck collective waits for);

plus ``p2p_mismatch`` for a send without its recv (or the reverse, or different sizes).

Then how the ranks ended (``endings``) is weighed in (``weigh``): ``rank_died`` for a rank
whose process ended first (status ``crashed``), waits the job's interruption caused dropped (``interrupted``),
waits still within the stall threshold in a live job dropped (``running``), and ``no_collectives`` when nothing
could be checked (``incomplete``).

Two moments are examined. The end of the data (where dumps were taken: a hang or desync still there) first;
if that is healthy, the moments the recorder detected a stall (``k`` records): a rank that had not issued a
collective the others were waiting in at that moment is named even if it came back later (``resolved``).

Matching semantics follow torch's Flight Recorder analyzer (``torchfrtrace``) where it gives an answer:
per-group ``collective_seq_id`` matching; op, then sizes, then dtypes compared; the all-to-all family's and
scatter/gather's per-rank sizes are allowed to differ. Unlike it, the culprit of a mismatch is the minority.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from comm2perfetto.diagnose import history, waits
from comm2perfetto.diagnose.endings import EXITED, RUNNING, SIGNALLED, RankEnd, interruption_ns, rank_ends
from comm2perfetto.diagnose.findings import (
    DESYNC_KINDS,
    DTYPE_MISMATCH,
    MISSING_RANKS,
    NO_DUMP,
    OP_MISMATCH,
    P2P_MISMATCH,
    ROOT_MISMATCH,
    SEQUENCE_MISMATCH,
    SIZE_MISMATCH,
    STUCK_ALL_JOINED,
    Diagnosis,
    Finding,
    Status,
)
from comm2perfetto.diagnose.groups import conflict_uids, group_mismatch
from comm2perfetto.diagnose.roots import account, arrange
from comm2perfetto.diagnose.signatures import compare
from comm2perfetto.diagnose.stalls import open_stall, stall_stack, stall_times
from comm2perfetto.diagnose.verdict import conclude, unexplained_stall
from comm2perfetto.diagnose.weigh import (
    any_matched,
    caused_by_interruption,
    dead_ranks,
    died_first,
    died_inside,
    frozen_findings,
    frozen_ranks,
    in_progress,
    no_collectives,
    went_down,
)
from comm2perfetto.group_columns import GroupCollectives
from comm2perfetto.model import (
    COMPLETED,
    FAILED,
    NOT_DONE_STATES,
    PENDING,
    SCHEDULED,
    STARTED,
    Collective,
    Coverage,
    Job,
    P2PTransfer,
    ProcessGroup,
    Signature,
    call_site,
    op_family,
)
from comm2perfetto.render.words import duration, ranks_text

__all__ = ["diagnose"]

MAX_EXPLAINED = 4  # missing ranks explained one by one in a finding
STALE_TAIL = 8  # the last collectives of a rank's dump looked at for a dump older than the others'


def diagnose(job: Job, pg: str | None = None, now_ns: int | None = None) -> Diagnosis:
    """Find, per process group, the first collective that did not complete on all its ranks, and why; then
    weigh it against how the ranks ended (``endings``): a dead rank, a frozen one, an interruption, a job still
    running; then arrange the findings by the wait-for graph (``roots``): root causes first. ``now_ns`` (the
    reader's clock) lets a log written on another host count as running while its heartbeats are recent, and
    a pending collective as stuck only past the stall threshold."""
    groups = [g for g in job.groups_in_order() if pg is None or pg in (g.name, g.desc, g.uid, g.label)]
    notes = list(job.notes)
    ends = dict(rank_ends(job, now_ns))
    frozen = frozen_ranks(job, ends, now_ns)
    ends.update(frozen)
    interrupted_at = interruption_ns(job, ends)
    dead, killed = died_first(job, ends, interrupted_at, notes)  # killed: by the launcher after the first failure
    halted = set(dead) | set(frozen)
    findings: list[Finding] = []
    if job.group_conflicts:  # ranks that created their groups in different orders: what their waits follow from
        uids = conflict_uids(job.group_conflicts, {g.uid: (g.name, g.ranks) for g in job.groups.values()})
        findings.append(group_mismatch(job.group_conflicts, uids))
    for group in groups:
        f = _end_state(job, group, notes)
        if f is not None:
            findings.append(f)
        findings.extend(_p2p_findings(job, group, notes))
    if interrupted_at is not None:  # what a dead or frozen rank caused is not the interruption's doing
        findings = [f for f in findings if set(f.culprit_ranks) & halted
                    or not caused_by_interruption(job, f, interrupted_at, notes)]
    running = [r for r, e in ends.items() if e.how == RUNNING]
    if running:
        findings = [f for f in findings if not in_progress(job, f, now_ns, notes)]
    if not any(f.kind != NO_DUMP for f in findings):
        for group in groups:
            f = _stall_state(job, group)
            if f is not None:
                findings.append(f)
                break  # one resolved stall explains the rest; later ones repeat it
    # A rank that died inside a collective every rank had joined: gloo aborts a rank whose received sizes do not
    # match, so a mismatch found there makes it that finding's victim.
    inside = {r: c for r in dead if (c := died_inside(job, r)) is not None}
    for r, c in inside.items():
        i = next((i for i, f in enumerate(findings) if f.kind in DESYNC_KINDS and f.group_uid == c.group.uid
                  and f.seq == c.seq), None)
        if i is not None:
            findings[i] = replace(findings[i], victim_ranks=tuple(sorted({*findings[i].victim_ranks, r})))
            del dead[r]
    # A send or receive whose other side died or froze is the wait the halted rank left, not a desync.
    down = went_down(ends, dead, killed) | set(frozen)
    waits_on_halted = {id(f) for f in findings if f.kind == P2P_MISMATCH and f.ranks_missing
                       and set(f.ranks_missing) <= down}
    if dead and not any(f.kind in DESYNC_KINDS and id(f) not in waits_on_halted for f in findings):
        findings = dead_ranks(job, groups, dead, ends, findings, killed, inside)
    if frozen:
        findings = frozen_findings(job, groups, frozen, findings)
    absent = _absentranks_text(job, groups)
    if absent and not any(f.kind == NO_DUMP and set(absent) <= set(f.suspect_ranks) for f in findings):
        findings.append(_no_dump_alone(job, absent))
    if not findings and not any_matched(job, groups):
        findings.append(no_collectives(job, groups))
    states = {r: _state(r, job, ends, dead, frozen) for r in _world(job, groups)}
    findings = arrange(findings, states, order=history_order(job), halted=frozenset(halted))
    if job.sampled:  # a sample's other ranks were not observed: nothing speaks for or against them
        findings = [_within_sample(f, job) for f in findings]
    for j in job.jobs:
        status = j.get("exit_status")
        if isinstance(status, int) and status != 0:
            how = f" after `record` forwarded {j['signal']} to it" if j.get("signal") else ""
            notes.append(f"the recorded job exited with status {status}{how} ({_name(j.get('_path'))})")
    if groups and all(g.backend == "gloo" for g in groups) and not job.logs:
        notes.append("gloo's Flight Recorder never marks collectives completed: whether the last one finished "
                     "cannot be told from these dumps alone (record with `comm2perfetto record` to know)")
    status, findings = conclude(findings, interrupted=interrupted_at is not None, running=bool(running),
                                stall=_unexplained(job))
    if status == Status.INTERRUPTED:
        notes.append(f"the job was interrupted ({_signals_text(job, ends)}); no communication problem before that")
    return Diagnosis(
        status=status, world_size=job.world_size, ranks_with_data=job.ranks_with_data,
        findings=tuple(findings), skipped=job.skipped, notes=tuple(notes), clock=job.clock,
        groups_checked=tuple(g.label if g.label == g.name else f"{g.label} ({g.name})" for g in groups),
        sampled=job.sampled, ranks=account(states, findings),
    )


def _unexplained(job: Job) -> Finding | None:
    """A stall a rank's recorder saw on a call that never returned: if nothing else explains it, it is told as
    ``stall_unexplained`` (``verdict.conclude``), never taken for OK."""
    found = open_stall(job)
    if found is None:
        return None
    rank, stall, call = found
    group = next((g for g in job.groups.values() if (rank, g.uid) in job.coverage
                  and g.name == _log_group_name(job, rank, call.gid)), None)
    label, uid = (group.label, group.uid) if group is not None else ("", "")
    return unexplained_stall([rank], label, uid, call.op, call.seq, stall.t_ns,
                             known=f"Rank {rank}'s recorder detected it ({stall.reason}) on a call that never "
                                   "returned.")


def _log_group_name(job: Job, rank: int, gid: int) -> str | None:
    log = job.logs.get(rank)
    group = log.groups.get(gid) if log is not None else None
    return str(group.name) if group is not None else None


def _world(job: Job, groups: Sequence[ProcessGroup]) -> set[int]:
    out = set(range(job.world_size or 0)) | set(job.ranks)
    for g in groups:
        out.update(g.ranks)
    return out


def _state(rank: int, job: Job, ends: Mapping[int, RankEnd], dead: Mapping[int, RankEnd],
           frozen: Mapping[int, RankEnd]) -> str:
    """Where a rank is when it is blocked in no wait (``waits``)."""
    if rank not in job.ranks:
        return waits.NO_DATA
    if rank in frozen:
        return waits.FROZEN
    if rank in dead:
        return waits.DEAD
    end = ends.get(rank)
    return waits.EXITED if end is not None and end.how == EXITED else waits.OUTSIDE


def history_order(job: Job) -> waits.Order:
    """``waits.Order`` from the job's history: whether a rank's own earlier collectives put one group's before
    another's (see ``waits.precedes``)."""
    cache: dict[tuple[int, str], list[tuple[int, int]]] = {}

    def issues(rank: int, uid: str) -> list[tuple[int, int]]:
        if (rank, uid) not in cache:
            group = job.groups.get(uid)
            i = group.ranks.index(rank) if group is not None and rank in group.ranks else -1
            cols = job.collectives.get(uid, ())
            if i >= 0 and isinstance(cols, GroupCollectives):  # the rank's columns, not every rank's tuples
                cache[(rank, uid)] = [(seq, t) for seq, sig, t in zip(
                    cols.seqs, cols.member_column("signatures", rank), cols.member_column("arrive_ns", rank))
                    if sig is not None and t is not None]
            else:
                cache[(rank, uid)] = [(c.seq, t) for c in cols if i >= 0
                                      and c.signatures[i] is not None and (t := c.arrive_ns[i]) is not None]
        return cache[(rank, uid)]

    def order(rank: int, first: waits.Op, then: waits.Op) -> bool | None:
        if waits.COLLECTIVE != first.kind or waits.COLLECTIVE != then.kind or first.seq is None or then.seq is None:
            return None
        return waits.precedes(issues(rank, first.group), issues(rank, then.group), first.seq, then.seq)

    return order


def _name(path: object) -> str:
    return str(path).rsplit("/", 1)[-1] if path else "job file"


def _signals_text(job: Job, ends: Mapping[int, RankEnd]) -> str:
    got = sorted(r for r, e in ends.items() if e.how == SIGNALLED)
    sent = sorted({j["signal"] for j in job.jobs if j.get("signal")})
    parts = []
    if sent:
        parts.append(f"`record` forwarded {', '.join(sent)}")
    if got:
        parts.append(f"{ranks_text(got)} received it")
    return "; ".join(parts) or "a signal"


# --- the end of the data ---------------------------------------------------------------------------------


_JOINED, _MISSING, _UNKNOWN, _NO_DATA = "joined", "missing", "unknown", "no_data"


def _member_status(job: Job, c: Collective, i: int, cov: Coverage | None) -> str:
    if c.signatures[i] is not None:
        return _JOINED
    if cov is None:
        return _NO_DATA
    seq = c.seq
    if seq < cov.first_seq or cov.unread_at(seq):
        return _UNKNOWN  # overwritten in the ring buffer, or its entry there unreadable
    if cov.has_fr:
        return _MISSING  # Flight Recorder records every collective: absent means never issued
    # Known from the recorder only: it sees Python calls, not those issued from C++ (DDP).
    if seq <= cov.last_seq:
        return _UNKNOWN  # it went past this seq, unseen
    if seq in job.log_seqs.get(c.group.uid, ()):
        return _MISSING  # a Python-issued collective the recorder would have seen on this rank too
    return _UNKNOWN


def _end_state(job: Job, group: ProcessGroup, notes: list[str]) -> Finding | None:
    cols = job.collectives.get(group.uid, ())
    if not cols:
        return None
    covs = [job.coverage.get((r, group.uid)) for r in group.ranks]
    start = max((c.first_seq for c in covs if c is not None), default=0)
    n = len(group.ranks)
    horizon = _stale_dumps(job, group, cols)
    settled = cols.settled_prefix() if isinstance(cols, GroupCollectives) else 0  # skipped in C, not one by one
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
            return _stuck(job, c, group)
        statuses = [_NO_DATA if r in beyond else _member_status(job, c, i, covs[i]) for i, r in enumerate(c.ranks)]
        missing = [r for r, s in zip(group.ranks, statuses) if s == _MISSING]
        if missing:
            joined = [r for r, st in zip(group.ranks, statuses) if st == _JOINED]
            return _shifted(job, c, cols, i, joined, missing) or _missing(job, c, missing, statuses)
        joined_states = {s for s, st in zip(c.states, statuses) if st == _JOINED}
        done = joined_states.isdisjoint(NOT_DONE_STATES)
        mismatch = _mismatch(job, c, cols, i)
        if mismatch is not None:
            if not (done and all_present and _harmless(c)):
                return mismatch
            notes.append(f"{c.op} #{c.seq} on {group.label} completed on every rank although the ranks described "
                         f"it differently ({mismatch.detail.split(': ', 1)[-1].rstrip('.')}): the same collective "
                         "and element counts in other shapes or through another API, harmless here")
        if done:
            continue
        no_data = [r for r, s in zip(group.ranks, statuses) if s == _NO_DATA]
        if no_data:
            return _waiting_for_no_dump(job, c, no_data, {r: horizon[r] for r in no_data if r in horizon})
        return _stuck(job, c, group)
    return None


def _stale_dumps(job: Job, group: ProcessGroup, cols: Sequence[Collective]) -> dict[int, int]:
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
    for i, rank in enumerate(group.ranks):
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
            state = _state_at(cols, i, rank, k)
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


def _state_at(cols: Sequence[Collective], i: int, rank: int, k: int) -> str | None:
    """The state of ``rank`` (``i``-th member) in the ``k``-th collective, read from its column alone."""
    return cols.value("states", rank, k) if isinstance(cols, GroupCollectives) else cols[k].states[i]


def _harmless(c: Collective) -> bool:
    """Ranks that differ only where it cannot matter: one collective (op family, root), the same element
    counts and dtypes, other shapes or another API (``all_gather`` and ``all_gather_into_tensor``)."""
    def key(sig: Signature | None) -> tuple:
        if sig is None:
            return ()
        if sig.parts:
            return tuple(key(p) for p in sig.parts)
        return (op_family(sig.op), sig.root, _numel(sig.input_sizes or ()), _numel(sig.output_sizes or ()),
                tuple(sorted(set(sig.input_dtypes or ()))))
    return len({key(sig) for sig in c.signatures}) == 1


def _missing(job: Job, c: Collective, missing: list[int], statuses: list[str], at_ns: int | None = None,
             resolved: bool = False) -> Finding:
    group = c.group
    joined = [r for r, s in zip(group.ranks, statuses) if s == _JOINED]
    sites = _sites(job, c, joined, limit=2)
    stacks: dict[int, tuple[str, ...]] = {}
    doing: list[str] = []
    evidence: dict[str, Any] = {"last_collective": {}}
    for r in missing[:MAX_EXPLAINED]:  # each may cost reading that rank's dump again
        what, last = _what_rank_did(job, r, c, at_ns)
        doing.append(what)
        if last is not None:
            evidence["last_collective"][str(r)] = last
        st = stall_stack(job, r)
        if st:
            stacks[r] = st
    if len(missing) > MAX_EXPLAINED:
        doing.append(f"({len(missing) - MAX_EXPLAINED} more ranks missing, not detailed.)")
    late = ""
    if resolved:
        arrivals = [c.arrival_of(r) for r in missing]
        first = min((t for t in c.arrive_ns if t is not None), default=None)
        known = [t for t in arrivals if t is not None]
        if known and first is not None:
            late = (f" {ranks_text(missing).capitalize()} issued {c.op} #{c.seq} {duration(max(known) - first)} after "
                    "the first rank, and the job went on.")
    op = c.op
    verb = "had not issued" if at_ns is not None else "never issued"
    when = " when the stall was detected" if at_ns is not None else ""
    detail = (
        f"{ranks_text(missing)} {verb} {op} #{c.seq} on {group.label}{when} while {ranks_text(joined)} "
        f"{'were' if len(joined) > 1 else 'was'} waiting in it"
        + (f" (rank {next(iter(sites))} called it at {next(iter(sites.values()))})" if sites else "") + ". "
        + " ".join(doing) + late
    )
    shown = "its stack and last collective" if stacks else "its last collective"
    action = (
        f"Look at what {ranks_text(missing)} {'were' if len(missing) > 1 else 'was'} doing instead ({shown} "
        f"above): a rank that skips or delays a collective the others issue hangs the group."
    )
    if resolved:
        action = (f"Look at what {ranks_text(missing)} {'were' if len(missing) > 1 else 'was'} doing instead ({shown} "
                  "above): a rank that delays a collective makes the others wait (`--fail-on late` makes this "
                  "exit 1).")
    elif all(_exited(job, r) for r in missing):
        theirs = "their processes" if len(missing) > 1 else "its process"
        action = (f"Find out why {ranks_text(missing)} ended {theirs} "
                  "early (a return or sys.exit on that rank only): its peers waited for a collective it would "
                  "never issue.")
    t = min((x for x in c.arrive_ns if x is not None), default=None)
    return Finding(
        kind=MISSING_RANKS, process_group=group.label, group_uid=group.uid, seq=c.seq, op=op,
        ranks_joined=tuple(joined), ranks_missing=tuple(missing), culprit_ranks=tuple(missing),
        detail=detail, action=action, call_sites=sites, stacks=stacks, evidence=evidence, resolved=resolved,
        t_ns=at_ns if at_ns is not None else t, basis=_missing_basis(job, c, missing, at_ns),
    )


def _missing_basis(job: Job, c: Collective, missing: Sequence[int], at_ns: int | None) -> str:
    """What shows the missing ranks had not issued ``c``: their own records, which cover it."""
    if at_ns is not None:
        return f"their records show they had not issued #{c.seq} when the stall was detected"
    fr = all((cov := job.coverage.get((r, c.group.uid))) is not None and cov.has_fr for r in missing)
    if fr:
        return f"Flight Recorder records every collective a rank issues, and theirs has no #{c.seq}"
    return f"their recorder, which sees the Python calls the other ranks made #{c.seq} with, saw none"


def _shifted(job: Job, c: Collective, cols: Sequence[Collective], index: int, joined: list[int],
             missing: list[int]) -> Finding | None:
    """The ranks waiting in ``c`` issued one collective more than the missing ranks (or these one less) from a
    line of their own: their call sites parted earlier (``history.divergence``) while the signatures matched,
    and there the waiting ranks left their cycle while the others kept theirs. Then the missing ranks are not
    the cause: they did all the collectives their program has, and the waiting ranks wait in one too many."""
    if not joined or not missing:
        return None
    ranks = joined[:MAX_JUDGED] + missing[:MAX_JUDGED]
    parted = history.divergence(job, cols, index, ranks)
    if parted is None:
        return None
    judged = {r: history.judge(job, cols, parted, r) for r in ranks}
    if not all(judged[r].verdict == history.DEVIATES for r in joined[:MAX_JUDGED]) or \
            not all(judged[r].verdict == history.CONFORMS for r in missing[:MAX_JUDGED]):
        return None
    at = cols[parted]
    why = "; ".join(f"rank {r}: {judged[r].why}" for r in joined[:3])
    detail = (f"{ranks_text(joined).capitalize()} {'wait' if len(joined) > 1 else 'waits'} in {c.op} #{c.seq} on "
              f"{c.group.label}, which {ranks_text(missing)} never issued; but the ranks' collectives parted at "
              f"#{at.seq} ({at.op}), where {ranks_text(joined)} left {'their' if len(joined) > 1 else 'its'} own "
              f"cycle and {ranks_text(missing)} kept theirs: from there on {ranks_text(joined)} "
              f"{'are' if len(joined) > 1 else 'is'} shifted by a collective of {'their' if len(joined) > 1 else 'its'}"
              f" own (an extra one, or one skipped), and waits in one its peers never issue ({why}).")
    return Finding(
        kind=SEQUENCE_MISMATCH, process_group=c.group.label, group_uid=c.group.uid, seq=c.seq, op=c.op,
        ranks_joined=tuple(joined), ranks_missing=tuple(missing), culprit_ranks=tuple(joined), detail=detail,
        action=(f"Look at what {ranks_text(joined)} issued at #{at.seq} (the call sites above): a collective only "
                "some ranks issue, or one only some skip, shifts every later one."),
        call_sites=_sites(job, at, joined + missing), evidence={"parted_at": at.seq},
        t_ns=min((x for x in c.arrive_ns if x is not None), default=None),
        basis=f"at #{at.seq}, where the ranks' call sites parted, it left its own cycle and its peers kept theirs",
    )


def _exited(job: Job, rank: int) -> bool:
    info = job.ranks.get(rank)
    return info is not None and bool(info.closed_cleanly) and not info.endings


def _what_rank_did(job: Job, rank: int, c: Collective, at_ns: int | None) -> tuple[str, dict | None]:
    """A sentence about rank's last collective (in any group), and its data as a dict."""
    best: tuple[int, Collective] | None = None
    for uid, cols in job.collectives.items():
        cov = job.coverage.get((rank, uid))
        if cov is None or cov.last_seq < 0:
            continue
        # The latest collective this rank joined in this group (before at_ns when looking at a stall).
        for cand in reversed(cols):
            if cand.seq > cov.last_seq:
                continue
            part = cand.part(rank) if rank in cand.ranks else None
            if part is None:
                continue
            if at_ns is not None and part.t_arrive_ns is not None and part.t_arrive_ns > at_ns:
                continue
            t = part.t_arrive_ns if part.t_arrive_ns is not None else -1
            if best is None or t > best[0]:
                best = (t, cand)
            break
    pending = _pending_call(job, rank, at_ns)
    if best is None:
        text = f"Rank {rank} recorded no collective before it."
        last = None
    else:
        cand = best[1]
        part = cand.part(rank)
        assert part is not None
        frame = call_site(job.stack_of(cand, rank))
        where = f" at {frame.site}" if frame else ""
        same = cand.group.uid == c.group.uid
        grp = "" if same else f" on {cand.group.label}"
        state = part.state if part.state != COMPLETED else "completed"
        text = f"Rank {rank}'s last collective was {cand.op} #{cand.seq}{grp}{where} ({state})."
        if not same and part.state in NOT_DONE_STATES:
            text += f" It is blocked there: {cand.group.label} and {c.group.label} wait on each other."
        last = {"process_group": cand.group.label, "seq": cand.seq, "op": cand.op, "state": part.state,
                "call_site": frame.site if frame else None}
    if pending:
        text += f" At the end of its log it was inside {pending}."
    info = job.ranks.get(rank)
    if at_ns is None and info is not None and _exited(job, rank):
        text += f" Then its process exited ({info.closed_reason}), without issuing {c.op} #{c.seq}."
    return text, last


def _pending_call(job: Job, rank: int, at_ns: int | None) -> str | None:
    """The recorder call this rank was inside (never returned, or not yet at ``at_ns``)."""
    log = job.logs.get(rank)
    if log is None:
        return None
    for call in reversed(log.calls):
        if at_ns is not None and call.t_call_ns > at_ns:
            continue
        ret = call.t_return_ns
        if ret is None or (at_ns is not None and ret > at_ns):
            site = f" at {call.site.split(' ')[0]}" if call.site else ""
            return f"{call.op}{site}"
        return None
    return None


def _sites(job: Job, c: Collective, ranks: Sequence[int], limit: int = 4) -> dict[int, str]:
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


def _site_list(sites: Mapping[int, str]) -> str:
    by_site: dict[str, list[int]] = {}
    for r, s in sites.items():
        by_site.setdefault(s, []).append(r)
    return "; ".join(f"{s} ({ranks_text(rs)})" for s, rs in by_site.items())


# --- mismatches ------------------------------------------------------------------------------------------

_KIND = {"op": OP_MISMATCH, "size": SIZE_MISMATCH, "dtype": DTYPE_MISMATCH, "root": ROOT_MISMATCH}
_SEVERITY = {"op": 0, "root": 1, "size": 2, "dtype": 3}


def _mismatch(job: Job, c: Collective, cols: Sequence[Collective], index: int) -> Finding | None:
    """Cluster the joined ranks by compatible signature. Which side is wrong is read from each rank's own
    history (``history``), never from a vote: the clusters whose ranks break their own cycle here are the
    culprits, when some cluster keeps its cycle; otherwise every joined rank is a suspect."""
    group = c.group
    size = len(group.ranks)
    clusters: list[tuple[Signature, list[int]]] = []
    for r, sig in zip(c.ranks, c.signatures):
        if sig is None:
            continue
        for rep, members in clusters:
            if compare(rep, sig, size) is None and compare(sig, rep, size) is None:
                members.append(r)
                break
        else:
            clusters.append((sig, [r]))
    if len(clusters) < 2:
        return _exchange_mismatch(job, c, cols, index) or _all_to_all_totals(job, c, cols, index)
    clusters.sort(key=lambda cl: (-len(cl[1]), min(cl[1])))  # for the telling only: the largest first
    verdicts, whys = _cluster_verdicts(job, cols, index, clusters)
    sound = [i for i, v in enumerate(verdicts) if v == history.CONFORMS]
    wrong = [i for i, v in enumerate(verdicts) if v == history.DEVIATES]
    joined = sorted(r for _, m in clusters for r in m)
    if sound and wrong:
        culprits = sorted(r for i in wrong for r in clusters[i][1])
        suspects = sorted(r for i, v in enumerate(verdicts) if v == history.UNKNOWN for r in clusters[i][1])
        kept = sorted(r for i in sound for r in clusters[i][1])
        basis = "; ".join(f"rank {r}: {why}" for r, why in whys[:3]) + (
            f"; {ranks_text(kept)} kept {'their' if len(kept) > 1 else 'its'} own cycle")
        ref = clusters[sound[0]][0]
        others = [clusters[i][0] for i in wrong]
    else:  # no vote either: a sound rank outvoted by two faulty ones would be named
        culprits, suspects = [], joined
        basis = ("no rank's history shows which side is wrong" if not any(v != history.UNKNOWN for v in verdicts)
                 else "the ranks' histories do not separate them")
        ref = clusters[0][0]
        others = [sig for sig, _ in clusters[1:]]
    worst = min((compare(ref, sig, size) or "dtype" for sig in others), key=_SEVERITY.__getitem__)
    kind = _KIND[worst]
    variants = [{"ranks": sorted(m), "signature": s.describe()} for s, m in clusters]
    sites = _sites(job, c, culprits[:3] + [m[0] for _, m in clusters])  # the culprits, and a rank of each side
    what = {"op": "different collectives", "size": "different sizes", "dtype": "different dtypes",
            "root": "different roots"}[worst]
    described = "; ".join(f"{ranks_text(sorted(m))}: {s.describe()}" for s, m in clusters)
    detail = f"Ranks issued {what} as {c.op} #{c.seq} on {group.label}: {described}."
    member = _differing_member(clusters[0][0], clusters[1][0], size)
    if member:
        detail += f" {member}"
    if sites:
        detail += f" Call sites: {_site_list(sites)}."
    if not culprits:
        detail += (f" Nothing in the data shows which side is wrong ({basis}): "
                   f"{ranks_text(suspects)} {'are suspects' if len(suspects) > 1 else 'is a suspect'}.")
    same = {"op": "collective", "root": "root (src/dst)"}.get(worst, "tensor " + worst)
    if culprits:
        action = (f"Make {ranks_text(culprits)} issue the same {same} as the other ranks at this point: the code "
                  f"paths diverge before {c.op} #{c.seq}.")
    else:
        action = (f"Compare what {ranks_text(joined)} issue at this point (the call sites above): the ranks must "
                  f"issue the same {same}; the code paths diverge before {c.op} #{c.seq}.")
    return Finding(
        kind=kind, process_group=group.label, group_uid=group.uid, seq=c.seq, op=c.op,
        ranks_joined=c.joined_ranks, ranks_missing=(), culprit_ranks=tuple(culprits), detail=detail,
        action=action, call_sites=sites, evidence={"variants": variants},
        t_ns=min((x for x in c.arrive_ns if x is not None), default=None), suspect_ranks=tuple(suspects),
        basis=basis,
    )


MAX_JUDGED = 16  # ranks of one cluster whose history is read (a cluster of thousands is judged by a sample)


def _cluster_verdicts(job: Job, cols: Sequence[Collective], index: int,
                      clusters: Sequence[tuple[Signature, list[int]]]) -> tuple[list[str], list[tuple[int, str]]]:
    """Per cluster, what its ranks' histories say (``history.CONFORMS``/``DEVIATES`` when every rank judged
    says so, else ``UNKNOWN``), and for the ranks that deviate, why. Judged where the ranks' call sites parted
    (``history.divergence``: an extra or skipped collective shifts the later ones) when that separates them,
    else at the ``index``-th collective itself."""
    judged_ranks = [r for _sig, members in clusters for r in members[:MAX_JUDGED]]
    parted = history.divergence(job, cols, index, judged_ranks)
    if parted is not None:
        verdicts, whys = _judged_at(job, cols, parted, clusters)
        if history.DEVIATES in verdicts and history.CONFORMS in verdicts:
            seq = cols[parted].seq
            return verdicts, [(r, f"at #{seq}, where the ranks' call sites parted, {why}; its later collectives are "
                                  "shifted against its peers'") for r, why in whys]
    return _judged_at(job, cols, index, clusters)


def _judged_at(job: Job, cols: Sequence[Collective], index: int,
               clusters: Sequence[tuple[Signature, list[int]]]) -> tuple[list[str], list[tuple[int, str]]]:
    verdicts: list[str] = []
    whys: list[tuple[int, str]] = []
    for _sig, members in clusters:
        judged = [(r, history.judge(job, cols, index, r)) for r in members[:MAX_JUDGED]]
        kinds = {j.verdict for _, j in judged}
        verdicts.append(kinds.pop() if len(kinds) == 1 else history.UNKNOWN)
        whys += [(r, j.why) for r, j in judged if j.verdict == history.DEVIATES]
    return verdicts, whys


def _differing_member(a: Signature, b: Signature, size: int) -> str:
    """``The 2nd member differs: all_reduce [[8]] Float against all_reduce [[9]] Float.`` for coalesced groups."""
    if not a.parts or not b.parts or len(a.parts) != len(b.parts):
        return ""
    for i, (pa, pb) in enumerate(zip(a.parts, b.parts)):
        if compare(pa, pb, size) is not None:
            return f"The {_ordinal(i + 1)} member differs: {pa.describe()} against {pb.describe()}."
    return ""


MAX_PAIRS_TOLD = 4


def _exchange_mismatch(job: Job, c: Collective, cols: Sequence[Collective], index: int) -> Finding | None:
    """Ranks that disagree on what passes between them, where the recorder logged it: an all-to-all whose rank A
    sends k elements to B while B expects j from A (gloo aborts the one that receives more than it expects, the
    other may return with wrong data), or an object collective whose ranks pass lists of different lengths.
    Which side is wrong is read from each rank's history, as for other mismatches; otherwise the ranks of the
    pairs that disagree are suspects."""
    members = sorted(c.group.ranks)
    where = {r: i for i, r in enumerate(members)}
    sigs = {r: sig for r, sig in zip(c.ranks, c.signatures) if sig is not None}
    pairs: list[tuple[int, int, int, int]] = []  # (A, B, A sends to B, B expects from A)
    if op_family(c.op) == "all_to_all":
        for a, sa in sigs.items():
            for b, sb in sigs.items():
                if sa.exchange is None or sb.exchange is None:
                    continue
                sent, expected = sa.exchange.sends_to(where[b]), sb.exchange.expects_from(where[a])
                if sent is not None and expected is not None and sent != expected:
                    pairs.append((a, b, sent, expected))
        if not pairs:
            return None
        told = "; ".join(f"rank {a} sends {k:,} elements to rank {b}, which expects {j:,} from it"
                         for a, b, k, j in pairs[:MAX_PAIRS_TOLD])
        if len(pairs) > MAX_PAIRS_TOLD:
            told += f" ({len(pairs) - MAX_PAIRS_TOLD} more pairs)"
        detail = f"The ranks of {c.group.label} disagree on what {c.op} #{c.seq} moves between them: {told}."
        involved = sorted({r for a, b, _, _ in pairs for r in (a, b)})
        evidence: dict[str, Any] = {"pairs": [{"src": a, "dst": b, "sends": k, "expects": j} for a, b, k, j in pairs]}
    else:
        lengths = {r: sig.objects for r, sig in sigs.items() if sig.objects is not None}
        if len(set(lengths.values())) < 2 or op_family(c.op) not in ("broadcast", "all_gather", "gather", "scatter"):
            return None
        by_length: dict[int, list[int]] = {}
        for r, n in sorted(lengths.items()):
            by_length.setdefault(n, []).append(r)
        told = "; ".join(f"{ranks_text(rs)}: {n}" for n, rs in sorted(by_length.items(), key=lambda kv: -len(kv[1])))
        detail = f"The ranks of {c.group.label} pass object lists of different lengths to {c.op} #{c.seq} ({told})."
        involved = sorted(lengths)
        evidence = {"objects": {str(r): n for r, n in sorted(lengths.items())}}
    clusters: dict[Signature, list[int]] = {}
    for r in involved:
        clusters.setdefault(sigs[r], []).append(r)
    ordered = sorted(clusters.items(), key=lambda kv: (-len(kv[1]), min(kv[1])))
    verdicts, whys = _cluster_verdicts(job, cols, index, ordered)
    wrong = [i for i, v in enumerate(verdicts) if v == history.DEVIATES]
    if wrong and any(v == history.CONFORMS for v in verdicts):
        culprits, suspects = sorted(r for i in wrong for r in ordered[i][1]), []
        basis = "; ".join(f"rank {r}: {why}" for r, why in whys[:3])
    else:
        culprits, suspects = [], involved
        basis = "the ranks disagree, and nothing shows which side is wrong"
        detail += " Nothing in the data shows which side is wrong."
    sites = _sites(job, c, (culprits or suspects)[:4])
    if sites:
        detail += f" Call sites: {_site_list(sites)}."
    named = ranks_text(culprits or suspects)
    action = (f"Make the split sizes of {named} agree with what the other ranks send and expect."
              if op_family(c.op) == "all_to_all" else f"Give {named} object lists of the other ranks' length.")
    return Finding(
        kind=SIZE_MISMATCH, process_group=c.group.label, group_uid=c.group.uid, seq=c.seq, op=c.op,
        ranks_joined=c.joined_ranks, ranks_missing=(), culprit_ranks=tuple(culprits), suspect_ranks=tuple(suspects),
        detail=detail, action=action,
        call_sites=sites, evidence=evidence, t_ns=min((x for x in c.arrive_ns if x is not None), default=None),
        basis=basis,
    )


def _all_to_all_totals(job: Job, c: Collective, cols: Sequence[Collective], index: int) -> Finding | None:
    """An all-to-all moves every element one rank sends to another: whatever the splits, what all ranks send
    adds up to what they receive. When it does not, the ranks disagree; which side is wrong is read from each
    rank's history as for other mismatches (``_mismatch``): the ranks whose counts break their own cycle are the
    culprits when some rank keeps its cycle, otherwise every rank is a suspect."""
    if op_family(c.op) != "all_to_all":
        return None
    counts: dict[int, tuple[int, int]] = {}
    for r, sig in zip(c.ranks, c.signatures):
        if sig is None or sig.input_sizes is None or sig.output_sizes is None or sig.source != "fr":
            return None
        counts[r] = (_numel(sig.input_sizes), _numel(sig.output_sizes))
    sent, received = sum(a for a, _ in counts.values()), sum(b for _, b in counts.values())
    by_count: dict[tuple[int, int], list[int]] = {}
    for r, pair in counts.items():
        by_count.setdefault(pair, []).append(r)
    if sent == received or len(by_count) < 2:
        return None
    clusters = sorted(by_count.items(), key=lambda kv: (-len(kv[1]), min(kv[1])))
    sigs = {r: sig for r, sig in zip(c.ranks, c.signatures) if sig is not None}
    verdicts, whys = _cluster_verdicts(job, cols, index, [(sigs[rs[0]], rs) for _, rs in clusters])
    wrong = [i for i, v in enumerate(verdicts) if v == history.DEVIATES]
    if wrong and any(v == history.CONFORMS for v in verdicts):
        culprits, suspects = sorted(r for i in wrong for r in clusters[i][1]), []
        basis = "; ".join(f"rank {r}: {why}" for r, why in whys[:3])
    else:
        culprits, suspects = [], sorted(counts)
        basis = "the totals show that the ranks disagree, not which of them is wrong"
    described = "; ".join(f"{ranks_text(rs)}: {a:,} sent, {b:,} received" for (a, b), rs in clusters)
    detail = (f"The ranks of {c.group.label} disagree on {c.op} #{c.seq}: together they send {sent:,} elements "
              f"and receive {received:,}, which an all-to-all cannot do ({described}).")
    named = culprits or suspects
    sites = _sites(job, c, named[:3] + sorted(r for r in clusters[0][1] if r not in named)[:1])
    if sites:
        detail += f" Call sites: {_site_list(sites)}."
    return Finding(
        kind=SIZE_MISMATCH, process_group=c.group.label, group_uid=c.group.uid, seq=c.seq, op=c.op,
        ranks_joined=c.joined_ranks, ranks_missing=(), culprit_ranks=tuple(culprits), suspect_ranks=tuple(suspects),
        detail=detail, action=f"Make the split sizes of {ranks_text(named)} agree with what the other ranks send to "
                              "them and expect from them.",
        call_sites=sites, evidence={"counts": {str(r): list(v) for r, v in sorted(counts.items())}},
        t_ns=min((x for x in c.arrive_ns if x is not None), default=None), basis=basis,
    )


# --- stuck, no dump --------------------------------------------------------------------------------------

_STATE_RANK = {PENDING: 0, "scheduled": 0, FAILED: 1, "started": 2, "unknown": 3, COMPLETED: 4}
LATE_FRACTION = 0.2  # of the group's typical collective: a lateness below it (or the clock's noise) singles nobody out


def _stuck(job: Job, c: Collective, group: ProcessGroup, at_ns: int | None = None,
           resolved: bool = False) -> Finding:
    """Everyone issued it; it did not complete. A culprit only where the ranks' states differ (the least
    advanced: on NCCL a kernel that never started while the others' did); a rank that arrived last is a suspect
    only when it came later than the clock's noise and a fifth of the group's typical collective, and arriving
    last never explains by itself why every rank still waits."""
    ranks = list(c.ranks)
    states = {str(r): c.state_of(r) for r in ranks}
    levels = {r: _STATE_RANK.get(c.state_of(r) or "unknown", 3) for r in ranks}
    known_levels = {lv for lv in levels.values() if lv != 3}
    behind: list[int] = []
    if len(known_levels) > 1:
        lowest = min(known_levels)
        behind = sorted(r for r, lv in levels.items() if lv == lowest)
    first = min((t for t in c.arrive_ns if t is not None), default=None)
    last = c.last_arrival_rank
    late_ns = (c.arrival_of(last) or 0) - first if last is not None and first is not None else 0
    noise = _lateness_noise(job, group)
    late = [last] if last is not None and not behind and noise is not None and late_ns > noise else []
    sites = _sites(job, c, behind + late + [r for r in ranks if r not in behind + late])
    if at_ns is None:
        not_done = sorted(r for r in ranks if (c.state_of(r) or "") in NOT_DONE_STATES)
        when = ""
    else:  # at a stall the job later recovered from: what had not completed then
        not_done = sorted(r for r, e in zip(c.ranks, c.end_ns) if e is None or e > at_ns)
        when = " by the time the stall was detected"
    detail = f"Every rank of {group.label} issued {c.op} #{c.seq} but it had not completed{when} on " \
             f"{ranks_text(not_done)}."
    if behind:
        ahead = sorted({c.state_of(r) or "unknown" for r in ranks if r not in behind})
        detail += (f" {ranks_text(behind).capitalize()} {'are' if len(behind) > 1 else 'is'} behind: state "
                   f"{c.state_of(behind[0])} where the others' is {' or '.join(ahead)}.")
        basis = f"its state ({c.state_of(behind[0])}) is behind the other ranks'"
        action = (f"Check {ranks_text(behind)} first (its host, GPU and network, or work it queued before this "
                  "collective).")
    else:
        if last is not None and late_ns > 0:
            detail += f" Rank {last} arrived last, {duration(late_ns)} after the first"
            detail += (" (later than the clocks' noise and the group's usual lateness: a suspect)." if late
                       else ", within what the clocks and the group's usual collectives allow: that singles "
                            "nobody out.")
        basis = (f"it arrived {duration(late_ns)} after the first; arriving late does not explain why every rank "
                 "still waits") if late else "every rank joined it in the same state: nothing singles one out"
        action = ("Every rank is inside it: look at the network between these ranks and at their hosts and GPUs "
                  "(py-spy dump of each process); if the collective's sizes may differ, compare its call sites.")
    return Finding(
        kind=STUCK_ALL_JOINED, process_group=group.label, group_uid=group.uid, seq=c.seq, op=c.op,
        ranks_joined=tuple(ranks), ranks_missing=(), culprit_ranks=tuple(behind), suspect_ranks=tuple(late),
        detail=detail, action=action, call_sites=sites,
        stacks={r: s for r in behind + late if (s := stall_stack(job, r))},
        evidence={"states": states, "last_arrival_rank": last}, resolved=resolved,
        t_ns=at_ns if at_ns is not None else first, basis=basis,
    )


def _lateness_noise(job: Job, group: ProcessGroup) -> int | None:
    """How late a rank may come to one of this group's collectives without it meaning anything: the clocks'
    residual skew (twice), and a fifth of the group's typical completed collective; None when neither is known
    (then lateness is no evidence at all)."""
    durations = sorted(t[0] for c in _recent(job, group) if (t := c.timing()) is not None)
    typical = durations[len(durations) // 2] if durations else None
    residual = job.clock.residual_skew_ns
    if typical is None and residual is None:
        return None
    return max(2 * (residual or 0), int(LATE_FRACTION * (typical or 0)))


def _recent(job: Job, group: ProcessGroup, n: int = 32) -> list[Collective]:
    cols = job.collectives.get(group.uid, ())
    return [cols[i] for i in range(max(0, len(cols) - n), len(cols))]


def _waiting_for_no_dump(job: Job, c: Collective, no_data: list[int],
                         stale: Mapping[int, int] | None = None) -> Finding:
    group = c.group
    joined = list(c.joined_ranks)
    suspects = tuple(no_data)
    if job.sampled:  # the others were not sampled: no evidence for or against any of them
        detail = (f"{ranks_text(joined)} {'are' if len(joined) > 1 else 'is'} waiting in {c.op} #{c.seq} on "
                  f"{group.label}; the other {len(no_data)} of its ranks are not in the sample ({job.sampled} of "
                  f"{len(job.ranks)} of {job.world_size} ranks), so which of them it waits for cannot be told.")
        action = "Profile or record every rank of this group to see which one it waits for."
        suspects = ()
    elif stale:
        why = "; ".join(f"rank {r}'s dump is older than the others' (from #{seq} on it shows unfinished, or not "
                        "at all, collectives the others completed, which needs every rank)"
                        for r, seq in sorted(stale.items()))
        detail = (f"{ranks_text(joined)} {'are' if len(joined) > 1 else 'is'} waiting in {c.op} #{c.seq} on "
                  f"{group.label}; {why}, so whether {ranks_text(no_data)} issued it cannot be told.")
        action = (f"Look at {ranks_text(no_data)} first, and collect a fresh dump of it (TORCH_FR_DUMP_TEMP_FILE, "
                  "or `comm2perfetto record`, which dumps every rank at a stall).")
    else:
        detail = (
            f"{ranks_text(joined)} {'are' if len(joined) > 1 else 'is'} waiting in {c.op} #{c.seq} on {group.label}; "
            f"{ranks_text(no_data)} left no data at all, so whether {'they' if len(no_data) > 1 else 'it'} issued it "
            "cannot be told."
        )
        action = (
            f"Find out what happened to {ranks_text(no_data)} (crashed or killed before dumping? look at its log "
            "and exit status), and collect its Flight Recorder dump next time."
        )
    return Finding(
        kind=NO_DUMP, process_group=group.label, group_uid=group.uid, seq=c.seq, op=c.op,
        ranks_joined=tuple(joined), ranks_missing=tuple(no_data), culprit_ranks=(), suspect_ranks=suspects,
        detail=detail, action=action, call_sites=_sites(job, c, joined),
        t_ns=min((x for x in c.arrive_ns if x is not None), default=None),
        evidence={"stale_dump": {str(r): seq for r, seq in stale.items()}} if stale else {},
        basis="their dumps are older than the others'" if stale else "no data from them",
    )


def _within_sample(f: Finding, job: Job) -> Finding:
    """``f`` naming as culprits and suspects only ranks of the sample (``Job.sampled``): the wait-for graph
    takes a rank without data for a suspect, which a rank left out of a sample is not."""
    culprits = tuple(r for r in f.culprit_ranks if r in job.ranks)
    suspects = tuple(r for r in f.suspect_ranks if r in job.ranks)
    if (culprits, suspects) == (f.culprit_ranks, f.suspect_ranks):
        return f
    return replace(f, culprit_ranks=culprits, suspect_ranks=suspects)


def _absentranks_text(job: Job, groups: Sequence[ProcessGroup]) -> list[int]:
    expected: set[int] = set(job.unusable_ranks)  # their dumps were there but unreadable
    if not job.sampled:  # the other ranks of a sample were not profiled: nothing of theirs is missing
        expected.update(range(job.world_size or 0))
        for g in groups:
            expected.update(g.ranks)
    return sorted(expected - set(job.ranks))


def _no_dump_alone(job: Job, absent: list[int]) -> Finding:
    detail = (
        f"{ranks_text(absent)} of {job.world_size} left no data (no Flight Recorder dump, event log or profiler "
        "trace); the verdict covers the other ranks only."
    )
    action = f"Collect the dumps of {ranks_text(absent)} (check the host's temp folder or the recorder's folder)."
    return Finding(
        kind=NO_DUMP, process_group="", group_uid="", seq=None, op=None, ranks_joined=(),
        ranks_missing=tuple(absent), culprit_ranks=(), suspect_ranks=tuple(absent), detail=detail, action=action,
        basis="no data from them",
    )


# --- stalls the recorder saw (the job may have gone on) --------------------------------------------------


def _stall_state(job: Job, group: ProcessGroup) -> Finding | None:
    """At the first stall the recorder saw that shows one: who was waiting in which collective, and who had
    not come (a stall another group's wait raised, or a slow start the job got over, may show nothing here).

    First the earliest collective that some ranks had joined by then and others had not: those others are
    missing. Else the earliest one everybody had joined whose end is known to come after the stall. A
    collective without any end time (gloo's Flight Recorder entries never get one) is no evidence of a hang
    by itself: the ones after it were issued, so it is taken as done.
    """
    cols = job.collectives.get(group.uid, ())
    for t in stall_times(job):
        f = _stalled_at(job, group, cols, t)
        if f is not None:
            return f
    return None


def _stalled_at(job: Job, group: ProcessGroup, cols: Sequence[Collective], t: int) -> Finding | None:
    # A rank without data, or whose data ends before the stall, says nothing about it: "not seen" is not
    # "not issued" (its horizon; a ring buffer that wrapped is handled by the coverage).
    known = [_seen_at(job, r, group, t) for r in group.ranks]
    for i, c in enumerate(cols):
        arrived = [a is not None and a <= t for a in c.arrive_ns]
        if any(arrived) and not all(here or not k for here, k in zip(arrived, known)):
            late = [r for r, here, k in zip(c.ranks, arrived, known) if k and not here]
            statuses = [_MISSING if r in late else _JOINED for r in c.ranks]
            return _missing(job, c, late, statuses, at_ns=t, resolved=_went_on(job, c, cols[i + 1:]))
    for i, c in enumerate(cols):
        if not all(a is not None and a <= t for a in c.arrive_ns):
            continue
        ends = [e for e in c.end_ns if e is not None]
        if ends and (len(ends) < len(c.end_ns) or max(ends) > t):
            return _stuck(job, c, group, at_ns=t, resolved=_went_on(job, c, cols[i + 1:]))
    return None


def _seen_at(job: Job, rank: int, group: ProcessGroup, t: int) -> bool:
    info = job.ranks.get(rank)
    if info is None or job.coverage.get((rank, group.uid)) is None:
        return False
    return info.last_ns is None or info.last_ns >= t


def _went_on(job: Job, c: Collective, later: Sequence[Collective]) -> bool:
    """The group got past ``c``: it completed everywhere, every rank issued a later collective, or every
    rank's recorder log closed normally after it. (Gloo's ``pg_status`` can lag a completion by a moment,
    so a rank's last dump may not show its last collective completed.)"""
    if c.completed_everywhere or any(all(sig is not None for sig in x.signatures) for x in later):
        return True
    infos = [job.ranks.get(r) for r in c.ranks]
    return all(info is not None and info.closed_cleanly for info in infos)


# --- point to point --------------------------------------------------------------------------------------


MAX_P2P_FINDINGS = 8  # per group: unmatched sends and receives told one by one, the rest counted in a note


def _p2p_findings(job: Job, group: ProcessGroup, notes: list[str]) -> list[Finding]:
    """Every send without its receive, and every receive without its send (or with other sizes), earliest
    first: a pipeline's faults come in pairs (a rank that skips a send leaves a recv waiting, and the send
    its own peer then cannot deliver)."""
    transfers = job.p2p.get(group.uid, ())
    bad: list[tuple[P2PTransfer, str]] = []
    unread = {r for r in group.ranks if (cov := job.coverage.get((r, group.uid))) is not None and cov.unread_p2p}
    for tr in transfers:
        if tr.src in unread or tr.dst in unread:
            continue  # a send or recv of that rank was unreadable: which of its ops pairs with which is unknown
        if tr.matched:
            assert tr.send is not None and tr.recv is not None
            a, b = tr.send.signature.input_sizes, tr.recv.signature.input_sizes
            if a is not None and b is not None and _numel(a) != _numel(b):
                bad.append((tr, "size"))
            continue
        other = tr.dst if tr.send is not None else tr.src
        cov = job.coverage.get((other, group.uid))
        if other not in job.ranks:
            continue  # the peer left no data: reported as no_dump
        if cov is not None and cov.has_fr and cov.first_seq > 0 and not cov.has_log:
            continue  # the peer's ring buffer wrapped: its side may have been overwritten
        bad.append((tr, "unmatched"))
    bad.sort(key=lambda b: _p2p_time(b[0]))
    if len(bad) > MAX_P2P_FINDINGS:
        notes.append(f"{len(bad) - MAX_P2P_FINDINGS} more unmatched sends or receives on {group.label} after the "
                     f"first {MAX_P2P_FINDINGS} (not told one by one)")
    return [_p2p_finding(job, group, tr, why) for tr, why in bad[:MAX_P2P_FINDINGS]]


def _p2p_finding(job: Job, group: ProcessGroup, tr: P2PTransfer, why: str) -> Finding:
    op = tr.send or tr.recv
    assert op is not None
    nth = _ordinal(tr.index + 1)
    seq = f", p2p seq {op.seq}" if op.seq is not None else ""
    suspects: tuple[int, ...] = ()
    if why == "size":
        assert tr.send is not None and tr.recv is not None
        culprits: tuple[int, ...] = ()
        suspects = (tr.src, tr.dst)  # which of the two tensors is the wrong one, the pair alone cannot tell
        detail = (
            f"The {nth} send from rank {tr.src} to rank {tr.dst} on {group.label}{seq} carries "
            f"{tr.send.signature.describe()} but the matching recv expects {tr.recv.signature.describe()}: "
            "which side is wrong cannot be told from the pair."
        )
        action = "Make the sender's and the receiver's tensors the same size."
    elif tr.send is not None:
        culprits = (tr.dst,)
        detail = (
            f"Rank {tr.src} sent to rank {tr.dst} on {group.label} (its {nth} send to it{seq}, "
            f"{tr.send.signature.describe()}) but rank {tr.dst} never posted the matching recv."
        )
        action = f"Make rank {tr.dst} post a recv from rank {tr.src} for this send (or drop the send)."
    else:
        assert tr.recv is not None
        culprits = (tr.src,)
        detail = (
            f"Rank {tr.dst} waits to receive from rank {tr.src} on {group.label} (its {nth} recv from it{seq}) "
            f"but rank {tr.src} never sent it."
        )
        action = f"Make rank {tr.src} send to rank {tr.dst} here (or drop the recv)."
    evidence: dict[str, Any] = {"src": tr.src, "dst": tr.dst, "index": tr.index}
    if why != "size" and culprits:  # the other side never posted: went it on to other things, or is it away?
        t = op.t_arrive_ns
        evidence["waiting"] = t is not None and not _issued_since(job, culprits[0], t)
    sites: dict[int, str] = {}
    for p in (tr.send, tr.recv):
        if p is not None:
            frame = call_site(job.p2p_stack(p))
            if frame is not None:
                sites[p.rank] = frame.site
    joined = tuple(sorted(p.rank for p in (tr.send, tr.recv) if p is not None))
    return Finding(
        kind=P2P_MISMATCH, process_group=group.label, group_uid=group.uid, seq=op.seq, op=op.kind,
        ranks_joined=joined, ranks_missing=tuple(r for r in (tr.src, tr.dst) if r not in joined),
        culprit_ranks=culprits, suspect_ranks=suspects, detail=detail, action=action, call_sites=sites,
        stacks={r: s for r in culprits + suspects if (s := stall_stack(job, r))},
        evidence=evidence, t_ns=_p2p_time(tr),
        basis="the sizes of a matched send and recv differ" if suspects else
              f"Flight Recorder and the recorder see every send and recv; rank {culprits[0]} has no record of its side",
    )


def _issued_since(job: Job, rank: int, t_ns: int) -> bool:
    """Whether ``rank`` issued anything (a collective, a send or a recv, in any group) after ``t_ns``: a peer
    that never posted its side of a transfer while it went on is out of step (a desync); one that issued
    nothing since is away (a wait, as a missing rank in a collective)."""
    for uid, group in job.groups.items():
        if rank not in group.ranks:
            continue
        cols = job.collectives.get(uid, ())
        for k in range(len(cols) - 1, max(-1, len(cols) - 9), -1):
            t = cols[k].arrival_of(rank)
            if t is not None:
                if t > t_ns:
                    return True
                break
        if any(p is not None and p.rank == rank and p.t_arrive_ns is not None and p.t_arrive_ns > t_ns
               for tr in job.p2p.get(uid, ()) for p in (tr.send, tr.recv)):
            return True
    return False


def _ordinal(n: int) -> str:
    """``1st``, ``2nd``, ``3rd``, ``11th``, ``22nd``."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _numel(sizes) -> int:
    return sum(math.prod(s) for s in sizes)


def _p2p_time(tr: P2PTransfer) -> int:
    ts = [p.t_arrive_ns for p in (tr.send, tr.recv) if p is not None and p.t_arrive_ns is not None]
    return min(ts) if ts else 0
