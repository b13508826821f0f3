"""The findings about a wait: ranks that never issued a collective the others wait in (what each did instead),
a rank whose collectives are shifted against its peers', a collective every rank joined that is stuck, ranks
without data the others wait for. No torch."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from comm2perfetto.diagnose import history
from comm2perfetto.diagnose.evidence import (
    JOINED,
    sites_of,
)
from comm2perfetto.diagnose.findings import (
    MISSING_RANKS,
    NO_DUMP,
    SEQUENCE_MISMATCH,
    STUCK_ALL_JOINED,
    Finding,
)
from comm2perfetto.diagnose.mismatch import MAX_JUDGED
from comm2perfetto.diagnose.stalls import stall_stack
from comm2perfetto.job import Job
from comm2perfetto.model import (
    COMPLETED,
    FAILED,
    NOT_DONE_STATES,
    PENDING,
    Collective,
    GroupView,
    ProcessGroup,
    call_site,
)
from comm2perfetto.words import duration, ranks_text

__all__ = ["missing", "shifted", "stuck", "waiting_for_no_dump", "waiting_for_unseen"]

MAX_EXPLAINED = 4  # missing ranks explained one by one in a finding


def missing(job: Job, c: Collective, missing: list[int], statuses: list[str], at_ns: int | None = None,
             resolved: bool = False) -> Finding:
    group = c.group
    joined = [r for r, s in zip(group.ranks, statuses) if s == JOINED]
    sites = sites_of(job, c, joined, limit=2)
    stacks: dict[int, tuple[str, ...]] = {}
    doing: list[str] = []
    evidence: dict[str, Any] = {"last_collective": {}}
    for r in missing[:MAX_EXPLAINED]:  # each may cost reading that rank's dump again
        what, last = what_rank_did(job, r, c, at_ns)
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
    elif all(exited(job, r) for r in missing):
        theirs = "their processes" if len(missing) > 1 else "its process"
        action = (f"Find out why {ranks_text(missing)} ended {theirs} "
                  "early (a return or sys.exit on that rank only): its peers waited for a collective it would "
                  "never issue.")
    t = min((x for x in c.arrive_ns if x is not None), default=None)
    return Finding(
        kind=MISSING_RANKS, process_group=group.label, group_uid=group.uid, seq=c.seq, op=op,
        ranks_joined=tuple(joined), ranks_missing=tuple(missing), culprit_ranks=tuple(missing),
        detail=detail, action=action, call_sites=sites, stacks=stacks, evidence=evidence, resolved=resolved,
        t_ns=at_ns if at_ns is not None else t, basis=missing_basis(job, c, missing, at_ns),
    )


def missing_basis(job: Job, c: Collective, missing: Sequence[int], at_ns: int | None) -> str:
    """What shows the missing ranks had not issued ``c``: their own records, which cover it."""
    one = len(missing) == 1
    its, it = ("its", "it") if one else ("their", "they")
    if at_ns is not None:
        return f"{its} records show {it} had not issued #{c.seq} when the stall was detected"
    fr = all((cov := job.coverage.get((r, c.group.uid))) is not None and cov.has_fr for r in missing)
    if fr:
        return f"Flight Recorder records every collective a rank issues, and shows no #{c.seq} on {ranks_text(missing)}"
    return f"{its} recorder, which sees the Python calls the other ranks made #{c.seq} with, saw none"


def shifted(job: Job, c: Collective, cols: GroupView, index: int, joined: list[int],
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
        call_sites=sites_of(job, at, joined + missing), evidence={"parted_at": at.seq},
        t_ns=min((x for x in c.arrive_ns if x is not None), default=None),
        basis=f"at #{at.seq}, where the ranks' call sites parted, it left its own cycle and its peers kept theirs",
    )


def exited(job: Job, rank: int) -> bool:
    info = job.ranks.get(rank)
    return info is not None and bool(info.closed_cleanly) and not info.endings


def what_rank_did(job: Job, rank: int, c: Collective, at_ns: int | None) -> tuple[str, dict | None]:
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
    pending = pending_call(job, rank, at_ns)
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
    if at_ns is None and info is not None and exited(job, rank):
        text += f" Then its process exited ({info.closed_reason}), without issuing {c.op} #{c.seq}."
    return text, last


def pending_call(job: Job, rank: int, at_ns: int | None) -> str | None:
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


# --- stuck, no dump --------------------------------------------------------------------------------------

_STATE_RANK = {PENDING: 0, "scheduled": 0, FAILED: 1, "started": 2, "unknown": 3, COMPLETED: 4}
LATE_FRACTION = 0.2  # of the group's typical collective: a lateness below it (or the clock's noise) singles nobody out


def stuck(job: Job, c: Collective, group: ProcessGroup, at_ns: int | None = None,
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
    noise = lateness_noise(job, group)
    unaligned = sorted(set(ranks).intersection(job.clock.uncalibrated))  # their arrivals compare with nothing
    late = [last] if last is not None and not behind and noise is not None and late_ns > noise and not unaligned \
        else []
    sites = sites_of(job, c, behind + late + [r for r in ranks if r not in behind + late])
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
        if last is not None and late_ns > 0 and unaligned:
            detail += (f" Rank {last} arrived last by the clocks, but the clock of {ranks_text(unaligned)} is "
                       "uncalibrated (its collective ends stray from any fit further than they resolve): the order of "
                       "arrivals singles nobody out.")
        elif last is not None and late_ns > 0:
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


def lateness_noise(job: Job, group: ProcessGroup) -> int | None:
    """How late a rank may come to one of this group's collectives without it meaning anything: the clocks'
    residual skew (twice), and a fifth of the group's typical completed collective; None when neither is known
    (then lateness is no evidence at all)."""
    durations = sorted(t[0] for c in recent(job, group) if (t := c.timing()) is not None)
    typical = durations[len(durations) // 2] if durations else None
    residual = job.clock.residual_skew_ns
    if typical is None and residual is None:
        return None
    return max(2 * (residual or 0), int(LATE_FRACTION * (typical or 0)))


def recent(job: Job, group: ProcessGroup, n: int = 32) -> list[Collective]:
    cols = job.collectives.get(group.uid, ())
    return [cols[i] for i in range(max(0, len(cols) - n), len(cols))]


def waiting_for_no_dump(job: Job, c: Collective, no_data: list[int],
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
        detail=detail, action=action, call_sites=sites_of(job, c, joined),
        t_ns=min((x for x in c.arrive_ns if x is not None), default=None),
        evidence={"stale_dump": {str(r): seq for r, seq in stale.items()}} if stale else {},
        basis="their dumps are older than the others'" if stale else "no data from them",
    )


def waiting_for_unseen(job: Job, c: Collective, waiting: list[int], unseen: list[int]) -> Finding:
    """``waiting`` may still be inside ``c`` (issued, not known completed, nothing later from them), and the part of
    ``unseen`` in it is not known: their recorder sees Python calls, not the collectives DDP or FSDP issue from
    C++, and no Flight Recorder dump of theirs shows ``c`` (a rank that froze or was killed writes none). The
    unseen ranks are suspects; a finding about how they ended (frozen, dead) takes this wait over."""
    group = c.group
    went_on = sorted(r for r, cov in ((r, job.coverage.get((r, group.uid))) for r in group.ranks)
                     if cov is not None and cov.last_seq > c.seq)
    who = ranks_text(waiting) if waiting else "No rank"
    detail = (f"{who} issued {c.op} #{c.seq} on {group.label} and {'have' if len(waiting) > 1 else 'has'} no later "
              f"collective there, its completion not known (gloo's Flight Recorder records none)"
              + (f", while {ranks_text(went_on)} went on past it" if went_on else "")
              + f": {'they' if len(waiting) > 1 else 'it'} may still be waiting in it. Whether "
              f"{ranks_text(unseen)} issued it cannot be told: {'their' if len(unseen) > 1 else 'its'} recorder sees "
              "Python calls, not the collectives DDP or FSDP issue from C++, and no Flight Recorder dump of "
              f"{'theirs' if len(unseen) > 1 else 'its'} shows it.") if waiting else (
              f"{c.op} #{c.seq} on {group.label} did not complete; whether {ranks_text(unseen)} issued it cannot be "
              "told (no Flight Recorder dump of theirs shows it).")
    return Finding(
        kind=NO_DUMP, process_group=group.label, group_uid=group.uid, seq=c.seq, op=c.op,
        ranks_joined=tuple(waiting), ranks_missing=tuple(unseen), culprit_ranks=(), suspect_ranks=tuple(unseen),
        detail=detail,
        action=(f"Look at {ranks_text(unseen)} first (how its process ended, its stack), and keep its Flight "
                "Recorder dump next time (`comm2perfetto record` dumps every rank at a stall)."),
        call_sites=sites_of(job, c, waiting),
        stacks={r: st for r in waiting[:MAX_EXPLAINED] if (st := stall_stack(job, r))},
        t_ns=min((x for x in c.arrive_ns if x is not None), default=None),
        basis="no record shows whether they issued it",
    )
