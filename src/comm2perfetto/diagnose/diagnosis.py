"""Why is the job stuck or desynced? A pure function over a ``Job``, in ordered passes over the evidence, each
returning findings that say how sure they are (culprits, suspects, victims) and on what. Never imports torch.

1. Groups the ranks created in different orders (``groups``: ``group_mismatch``).
2. Per process group, the first collective not completed by all its ranks (``end_state``): ranks that never
   issued it (``missing_ranks``, or ``sequence_mismatch`` where the waiting ranks are the ones shifted by a
   collective of their own), ranks that disagree on it (``mismatch``: which side is wrong read from each
   rank's own history, never from a vote), every rank in it and stuck (``waiting.stuck``), ranks without data
   (``no_dump``); sends and receives without their other side (``p2p``).
3. How the ranks ended (``endings``, weighed in by ``weigh``): dead, frozen, killed by the launcher after the
   first failure, aborted by gloo inside a collective, interrupted, still running.
4. Stalls the recorder saw, where the end of the data shows nothing (``end_state.stall_state``).
5. The wait-for graph (``roots``): root causes first, every other wait ``blocked_by`` its root.
6. The status (``verdict.conclude``): the one place that decides OK, unreachable with an unresolved stall.

Matching semantics follow torch's Flight Recorder analyzer (``torchfrtrace``) where it gives an answer:
per-group ``collective_seq_id`` matching; op, then sizes, then dtypes compared; the all-to-all family's and
scatter/gather's per-rank sizes are allowed to differ.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from comm2perfetto.diagnose import waits
from comm2perfetto.diagnose.end_state import end_state, stall_state
from comm2perfetto.diagnose.endings import EXITED, RUNNING, SIGNALLED, RankEnd, interruption_ns, rank_ends
from comm2perfetto.diagnose.findings import (
    DESYNC_KINDS,
    NO_DUMP,
    P2P_MISMATCH,
    Diagnosis,
    Finding,
    Status,
)
from comm2perfetto.diagnose.groups import conflict_uids, group_mismatch
from comm2perfetto.diagnose.p2p import p2p_findings
from comm2perfetto.diagnose.roots import account, arrange
from comm2perfetto.diagnose.stalls import open_stall
from comm2perfetto.diagnose.verdict import conclude, unexplained_stall
from comm2perfetto.diagnose.weigh import (
    any_matched,
    caused_by_interruption,
    dead_ranks,
    died_first,
    died_in_transfer,
    died_inside,
    frozen_findings,
    frozen_ranks,
    in_progress,
    no_collectives,
    went_down,
)
from comm2perfetto.job import Job
from comm2perfetto.model import (
    ProcessGroup,
)
from comm2perfetto.words import ranks_text

__all__ = ["diagnose"]


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
        f = end_state(job, group, notes)
        if f is not None:
            findings.append(f)
        findings.extend(p2p_findings(job, group, notes))
    if interrupted_at is not None:  # what a dead or frozen rank caused is not the interruption's doing
        findings = [f for f in findings if set(f.culprit_ranks) & halted
                    or not caused_by_interruption(job, f, interrupted_at, notes)]
    running = [r for r, e in ends.items() if e.how == RUNNING]
    if running:
        findings = [f for f in findings if not in_progress(job, f, now_ns, notes)]
    if not any(f.kind != NO_DUMP for f in findings):
        for group in groups:
            f = stall_state(job, group)
            if f is not None:
                findings.append(f)
                break  # one resolved stall explains the rest; later ones repeat it
    # A rank that died inside a collective every rank had joined, or inside a send or recv whose pair differs in
    # size or dtype: gloo aborts a rank whose received data does not match, so a mismatch found there makes it
    # that finding's victim.
    inside = {r: c for r in dead if (c := died_inside(job, r)) is not None}

    def aborted_by(r: int, f: Finding) -> bool:
        c = inside.get(r)
        if c is not None:
            return f.kind in DESYNC_KINDS and f.group_uid == c.group.uid and f.seq == c.seq
        return f.kind == P2P_MISMATCH and r in f.suspect_ranks and died_in_transfer(job, r, f)

    for r in list(dead):
        i = next((i for i, f in enumerate(findings) if aborted_by(r, f)), None)
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
    if status == Status.OK and job.sampled and job.world_size:
        others = job.world_size - len(job.ranks_with_data)
        notes.append(f"a sample: the collectives of {ranks_text(job.ranks_with_data)} completed and matched; the other "
                     f"{others} rank(s) of the job left no {job.sampled}, so nothing is known of them")
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
            cols = job.collectives.get(uid)
            cache[(rank, uid)] = [(seq, t) for seq, sig, t in zip(  # the rank's columns, not every rank's tuples
                cols.seqs, cols.member_column("signatures", rank), cols.member_column("arrive_ns", rank))
                if sig is not None and t is not None] if i >= 0 and cols is not None else []
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
