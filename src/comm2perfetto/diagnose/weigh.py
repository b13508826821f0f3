"""How the ranks ended changes what the collective-level findings mean (docs/diagnose.md, "Verdicts"): a
wait the interruption caused is no hang, a collective pending in a live job is no stall yet, a dead rank is
the culprit of the waits and failures it left behind, and "ok" needs a collective seen on all its ranks. Pure
functions over a ``Job`` and the findings so far; ``diagnosis.diagnose`` applies them. No torch.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from itertools import pairwise
from typing import Any

from comm2perfetto.diagnose.endings import DIED, EXCEPTION, FROZEN, PEER_LOST, RUNNING, SIGNALLED, UNKNOWN, RankEnd
from comm2perfetto.diagnose.findings import (
    MISSING_RANKS,
    NO_COLLECTIVES,
    NO_DUMP,
    P2P_MISMATCH,
    RANK_DIED,
    RANK_FROZEN,
    STUCK_ALL_JOINED,
    Finding,
)
from comm2perfetto.diagnose.stalls import stall_stack, stall_times
from comm2perfetto.job import Job, RankExit
from comm2perfetto.model import NOT_DONE_STATES, Collective, ProcessGroup
from comm2perfetto.sources.kineto.comm_kernels import ALL_COMM_KERNELS
from comm2perfetto.words import duration, ranks_text

# Ranks of one job get an interrupting signal at slightly different moments (0.1 to 1.5 s apart seen under
# torchrun): a rank waiting since less than this before the first signal waits because of it.
INTERRUPT_GRACE_NS = 2 * 10**9
# Every rank of a job killed at once (kill -9 of the whole job, a node going down) stops writing within a
# heartbeat or two; a rank whose log stops longer before the others' died first.
DEATH_GAP_NS = 3 * 10**9
DEFAULT_STALL_NS = 60 * 10**9  # the recorder's default --stall-after
# A rank's process seen existing this long after its last record (its heartbeats come every second) made no
# progress: stopped (SIGSTOP, a debugger) or holding the GIL.
FROZEN_GAP_NS = 3 * 10**9


def _waiting_since(f: Finding) -> int | None:
    """When the wait a finding describes began (its earliest arrival); None for rank-level findings."""
    if f.kind in (MISSING_RANKS, STUCK_ALL_JOINED) or (f.kind == NO_DUMP and f.seq is not None) or (
            f.kind == P2P_MISMATCH and f.ranks_missing):
        return f.t_ns
    return None


def _normal_skew(job: Job, uid: str) -> int:
    """The largest arrival skew among the group's collectives that completed everywhere: how late a rank
    normally comes."""
    return max((c.arrival_skew_ns or 0 for c in job.collectives.get(uid, ()) if all(c.signatures)
                and set(c.states).isdisjoint(NOT_DONE_STATES)), default=0)


def caused_by_interruption(job: Job, f: Finding, interrupted_at: int, notes: list[str]) -> bool:
    """A wait that began shortly before (or after) the job was interrupted is the interruption's doing: the
    rank that did not come had stopped issuing collectives because it got the signal first. A wait that
    began long before is a hang the user then interrupted, and stays."""
    since = _waiting_since(f)
    if since is None or f.resolved:
        return False
    grace = max(INTERRUPT_GRACE_NS, 2 * _normal_skew(job, f.group_uid))
    if since >= interrupted_at - grace:
        notes.append(f"{f.op} #{f.seq} on {f.process_group} was left unfinished by the interruption "
                     f"({ranks_text(f.ranks_joined)} issued it {_relative(since - interrupted_at)} the first "
                     "signal): not a hang")
        return True
    notes.append(f"the job was interrupted {duration(interrupted_at - since)} after {ranks_text(f.ranks_joined)} "
                 f"began waiting in {f.op} #{f.seq}: a hang the interruption ended")
    return False


def _relative(ns: int) -> str:
    return f"{duration(-ns)} before" if ns < 0 else f"{duration(ns)} after"


def in_progress(job: Job, f: Finding, now_ns: int | None, notes: list[str]) -> bool:
    """In a job that still runs, a collective some ranks wait in is normal until the stall threshold passes
    (or the recorder logged a stall)."""
    since = _waiting_since(f)
    if since is None or f.resolved:
        return False
    if any(t >= since for t in stall_times(job)):
        return False
    ref = now_ns if now_ns is not None else max((i.last_ns for i in job.ranks.values() if i.last_ns), default=None)
    if ref is None:
        return False
    thresholds = [i.stall_after_ns for i in job.ranks.values() if i.stall_after_ns]
    threshold = min(thresholds) if thresholds else DEFAULT_STALL_NS
    if ref - since >= threshold:
        return False
    verb = "have" if len(f.ranks_joined) > 1 else "has"
    notes.append(f"the job is still running: {ranks_text(f.ranks_joined)} {verb} "
                 f"been in {f.op} #{f.seq} on {f.process_group} for {duration(max(0, ref - since))}, less than the "
                 f"stall threshold ({duration(threshold)})")
    return True


def frozen_ranks(job: Job, ends: Mapping[int, RankEnd], now_ns: int | None) -> dict[int, RankEnd]:
    """Ranks whose process existed well after their log stopped: ``record`` saw it at a stall or a signal (the
    job files' ``probes``), or it runs on this host now (``now_ns``). Being killed later, by the launcher after
    the others gave up or after an interrupt, does not make such a rank the first to die."""
    seen: dict[int, tuple[int, str]] = {}
    for j in job.jobs:
        for p in j.get("probes") or ():
            if p["state"] != "gone" and p["t_ns"] > seen.get(p["rank"], (0, ""))[0]:
                seen[p["rank"]] = (p["t_ns"], p["state"])
    if now_ns is not None:
        for rank, rank_info in job.ranks.items():
            if rank_info.alive is True and now_ns > seen.get(rank, (0, ""))[0]:
                seen[rank] = (now_ns, "stopped" if rank_info.stopped else "running")
    out = {}
    for rank, (t, state) in seen.items():
        info, end = job.ranks.get(rank), ends.get(rank)
        if info is None or end is None or info.last_ns is None or (
                state not in ("stopped", "held") and not info.heartbeats):
            continue  # a log without heartbeats can be quiet while its rank works; a stopped process cannot
        how = {"stopped": "stopped (SIGSTOP, process state T)",
               "held": "running while its recorder's thread did not (the GIL held)"}.get(state, "running")
        if state in ("stopped", "held") and end.how in (SIGNALLED, PEER_LOST) and not _issued_after(job, rank, t):
            # Seen frozen at the stall; the interruption (or a peer's end) then unblocked it, and it wrote its
            # last records on the way out: frozen from its last call until then.
            last = _last_call_before(job, rank, t)
            out[rank] = RankEnd(rank, FROZEN, last, f"its process was seen {how} at the stall"
                                + (f", {duration(t - last)} after its last call" if last is not None else "")
                                + ", and issued nothing more before it ended")
            continue
        if end.how not in (DIED, RUNNING, UNKNOWN) or t - info.last_ns < FROZEN_GAP_NS or _recording_off(job, rank):
            continue  # it ended by itself, or by a signal it handled; or it is fine
        out[rank] = RankEnd(rank, FROZEN, info.last_ns,
                            f"its process was seen {how} {duration(t - info.last_ns)} after its last record")
    return out


def _issued_after(job: Job, rank: int, t_ns: int) -> bool:
    log = job.logs.get(rank)
    return log is not None and any(c.t_call_ns > t_ns for c in log.calls)


def _last_call_before(job: Job, rank: int, t_ns: int) -> int | None:
    """When the rank last called torch.distributed before ``t_ns`` (else when its log began)."""
    log = job.logs.get(rank)
    if log is None:
        return None
    before = [c.t_call_ns for c in log.calls if c.t_call_ns <= t_ns]
    return max(before) if before else log.first_ns


def _recording_off(job: Job, rank: int) -> bool:
    """An internal error turned the recorder off on that rank: its log stands still while the rank trains."""
    return any("recording disabled" in msg for _, msg in getattr(job.logs.get(rank), "warnings", ()))


def died_first(job: Job, ends: Mapping[int, RankEnd], interrupted_at: int | None,
               notes: list[str]) -> tuple[dict[int, RankEnd], dict[int, RankEnd]]:
    """Ranks whose process ended before the job did (killed, crashed, or an uncaught exception of their own),
    and the ranks the launcher killed after them (victims: ``teardown``): not those that died after the job
    was interrupted (the interruption, or record's last SIGKILL, did it), nor every rank of a job killed at
    once."""
    dead = {r: e for r, e in ends.items() if e.how in (DIED, EXCEPTION)}
    if not dead and any(e.how == PEER_LOST for e in ends.values()):
        # Some rank lost its peer: an unclosed log whose process could not be checked is the peer that went.
        dead = {r: e for r, e in ends.items() if e.how == UNKNOWN}
    if interrupted_at is not None:
        dead = {r: e for r, e in dead.items() if _died_before(job, e, interrupted_at)}
    everyone = len(dead) == len(ends)
    killed = teardown(job, ends, dead)
    # Every rank gone, none by an exception: killed at once from outside, unless the launcher itself failed (a
    # worker failed and it stopped the rest; which one, dead_ranks tells where the data can).
    if dead and everyone and not killed and not launcher_failed(job) \
            and all(e.how in (DIED, UNKNOWN) for e in dead.values()):
        latest = max(e.t_ns or 0 for e in dead.values())
        first = {r: e for r, e in dead.items()
                 if job.ranks[r].heartbeats and e.t_ns is not None and e.t_ns < latest - DEATH_GAP_NS}
        if not first:
            spread = latest - min(e.t_ns or latest for e in dead.values())
            notes.append(f"no rank closed its log ({ranks_text(dead)} stop within {duration(spread)} of each "
                         "other): the whole job was killed at once (or its processes run on another host)")
        return first, {}
    return dead, killed


def _died_before(job: Job, end: RankEnd, t_ns: int) -> bool:
    """Whether the rank died before ``t_ns`` (when the job was interrupted): `record` saw its process end by then
    (on its host's clock, the one `record` timed the signal on), else its log stops before it."""
    if end.how == DIED and end.exit is not None:
        same_clock = any(j.get("host") == end.exit.host and isinstance(j.get("signal_ns"), int) for j in job.jobs)
        return (end.exit.t_ns if same_clock else end.exit.aligned_ns) < t_ns
    return end.t_ns is not None and end.t_ns < t_ns


# A rank's last record may come up to a heartbeat (a second) before its death: the slack when deaths are ordered.
HEARTBEAT_SLACK_NS = 10**9


def teardown(job: Job, ends: Mapping[int, RankEnd], dead: dict[int, RankEnd]) -> dict[int, RankEnd]:
    """The ranks of ``dead`` the launcher killed after the first failure, taken out of ``dead`` and returned.
    When one worker fails, torchrun stops the others (SIGTERM, which kills a rank blocked in a collective at
    once, then SIGKILL after its grace period): a rank that died inside a call (waiting, for the failed rank
    or for one its failure held up), or that `record` saw end by SIGTERM, after a rank that died outside any
    call, or raised (also on a lost connection or a timeout), was ended by that failure, not by a fault of its
    own. After: where `record` saw both processes end, in that order (``RankExit.before``); else no earlier than
    a heartbeat before, by the logs. A rank whose C++-issued collectives nothing shows is never the first
    failure: where it was when it stopped is unknown (``dead_ranks`` makes a later death outside any call a
    suspect). Only where `record`'s job file says the launcher itself failed (a non-zero exit status, no signal
    forwarded to it); without such a failure (every dead rank died inside a call, as when the whole job is
    killed), nothing is taken."""
    if not launcher_failed(job):
        return {}  # the launcher did not report a failure it saw itself (no job file, or a signal ended the job)
    # Inside a call, but not one every rank had joined: that one may have aborted the rank itself (died_inside).
    inside = {r for r, e in dead.items() if e.how == DIED and _inside_a_call(job, r) and died_inside(job, r) is None}
    # A log that stops outside any call it saw, on a rank whose C++-issued collectives (DDP's) no dump shows, may
    # have stopped inside one of those: gloo aborting it on a size mismatch, or the launcher killing it while it
    # waited. Neither its failure nor its being killed is shown: it orders nothing.
    # Unless `record` saw how it ended, other than by gloo's abort: SIGKILL, the launcher's SIGTERM, an exit.
    unseen = {r for r, e in dead.items() if e.how == DIED and r not in inside and calls_unseen(job, r)
              and not (e.exit is not None and e.exit.how is not None and e.exit.signal != "SIGABRT")}
    # Ended by SIGTERM, the signal torchrun stops its workers with: no failure of its own after an earlier one.
    stopped = {r for r, e in dead.items() if e.how == DIED and e.exit is not None and e.exit.signal == "SIGTERM"}
    taken = inside | unseen | stopped
    failures = [e for r, e in dead.items() if r not in taken and e.t_ns is not None]
    # A rank that raised on a lost connection or a timeout failed too: the launcher stops the rest after it;
    # but a connection lost after a rank's death may be that death's doing, not a failure before it. A death
    # comes after the rank's last record (up to a heartbeat after): what failed before that record did not
    # follow from it.
    deaths = [e.t_ns for e in dead.values() if e.how == DIED and e.t_ns is not None]
    failures += [e for e in ends.values() if e.how == PEER_LOST and e.t_ns is not None
                 and all(e.t_ns < t for t in deaths)]

    # A death the launcher reacted to, whoever's fault it was: what a SIGTERM `record` saw after it follows from.
    ends_seen = [dead[r] for r in unseen if dead[r].exit is not None]

    def after_one(end: RankEnd, earlier: list[RankEnd]) -> bool:
        for failure in earlier:
            if failure.exit is not None and end.exit is not None:
                if failure.ended_before(end):  # record saw both end, in this order
                    return True
            elif end.t_ns is not None and failure.t_ns is not None and end.t_ns >= failure.t_ns - HEARTBEAT_SLACK_NS:
                return True
        return False

    out = {r: dead[r] for r in sorted(taken) if after_one(dead[r], failures + ends_seen if r in stopped else failures)}
    for rank in out:
        del dead[rank]
    return out


def launcher_failed(job: Job) -> bool:
    """Whether `record`'s job file says the launcher failed by itself: a non-zero exit status, no signal
    forwarded to it (torchrun exits 1 when a worker failed, after stopping the others)."""
    return any(isinstance(j.get("exit_status"), int) and j["exit_status"] != 0 and not j.get("signal")
               for j in job.jobs)


def calls_unseen(job: Job, rank: int) -> bool:
    """Whether ``rank`` issued collectives nothing recorded: its log's sequence numbers on a group skip some
    (collectives issued from C++, DDP's or FSDP's, which only Flight Recorder sees; #1 is the first a group
    has) and no Flight Recorder dump of the rank was read. The log then cannot tell whether the rank was inside
    a call when it stopped."""
    log = job.logs.get(rank)
    if log is None or any(cov.has_fr for (r, _), cov in job.coverage.items() if r == rank):
        return False
    seen: dict[int, list[int]] = {}
    for call in log.calls:
        if call.seq is not None and call.peer is None:
            seen.setdefault(call.gid, []).append(call.seq)
    for seqs in seen.values():
        seqs.sort()
        if seqs[0] > 1 or any(b - a > 1 for a, b in pairwise(seqs)):
            return True
    return False


def _inside_a_call(job: Job, rank: int) -> bool:
    """The rank's log ends inside a torch.distributed call (it never returned), or, without a log of it, its
    latest Flight Recorder collective is unfinished."""
    log = job.logs.get(rank)
    if log is not None and log.calls:
        return log.calls[-1].t_return_ns is None
    latest: tuple[int, bool] | None = None
    for uid, cols in job.collectives.items():
        group = job.groups.get(uid)
        if group is None or rank not in group.ranks or not len(cols):
            continue
        for k in range(len(cols) - 1, max(-1, len(cols) - 9), -1):
            c = cols[k]
            if c.signatures[c.index_of(rank)] is not None:
                t = c.arrival_of(rank) or 0
                if latest is None or t > latest[0]:
                    latest = (t, c.state_of(rank) in NOT_DONE_STATES)
                break
    return latest is not None and latest[1]


def died_inside(job: Job, rank: int) -> Collective | None:
    """The collective a dead rank's log ends inside (a call that never returned, with no exception of its own),
    when every member of its group had joined it: the collective itself may have ended the rank, gloo aborting
    one whose received data does not match the size it expects (SIGABRT from C++: no Python handler runs, so
    the log just stops)."""
    log = job.logs.get(rank)
    if log is None or not log.calls or log.endings or _not_an_abort(job, rank):
        return None
    call = log.calls[-1]
    group = log.groups.get(call.gid)
    if call.t_return_ns is not None or call.seq is None or group is None:
        return None
    for uid, cols in job.collectives.items():
        pg = job.groups.get(uid)
        if pg is None or pg.name != str(group.name) or rank not in pg.ranks:
            continue
        c = cols.find(call.seq)
        return c if c is not None and all(c.signatures) else None
    return None


def _not_an_abort(job: Job, rank: int) -> bool:
    """`record` saw the rank's process end otherwise than by SIGABRT (gloo's abort on a size mismatch): killed
    from outside (SIGKILL, SIGTERM), or exited."""
    info = job.ranks.get(rank)
    seen = info.exit if info is not None else None
    return seen is not None and seen.how is not None and seen.signal != "SIGABRT"


def died_in_transfer(job: Job, rank: int, f: Finding) -> bool:
    """Whether a dead rank's log ends inside the send or recv of ``f`` (a pair whose sizes or dtypes differ,
    so gloo may have aborted it), with no exception of its own."""
    log = job.logs.get(rank)
    if log is None or not log.calls or log.endings or _not_an_abort(job, rank):
        return False
    call = log.calls[-1]
    pair = (f.evidence.get("src"), f.evidence.get("dst"))
    return call.t_return_ns is None and call.peer is not None and rank in pair and call.peer in pair


def dead_ranks(job: Job, groups: Sequence[ProcessGroup], dead: Mapping[int, RankEnd],
               ends: Mapping[int, RankEnd], findings: list[Finding],
               killed: Mapping[int, RankEnd] | None = None,
               inside: Mapping[int, Collective] | None = None) -> list[Finding]:
    """Each rank that died first becomes a ``rank_died`` finding; the waits of the others it explains (the
    collective it never joined) are folded into it, and the ranks killed after it (``killed``) are its victims
    (told in the first death's finding). A rank that died inside a collective every rank had joined
    (``inside``) is a suspect, not a culprit: the collective may have aborted it."""
    out = list(findings)
    died: list[Finding] = []
    order, unordered = _order_of_deaths(dead)
    first_rank, first_end = None, None
    for n, (rank, end) in enumerate(order):
        explained = next((f for f in out if f.kind in (MISSING_RANKS, NO_DUMP, STUCK_ALL_JOINED)
                          and rank in f.culprit_ranks and f.seq is not None), None)
        if explained is not None:
            out.remove(explained)
        out, p2p = _waits_on(out, rank)
        explained = explained or (p2p[0] if p2p else None)
        f = _rank_died(job, groups, rank, end, ends, explained, killed if n == 0 else None, (inside or {}).get(rank))
        gap: int | None = _known_gap(end, first_end) if n and f.culprit_ranks and first_end is not None else None
        if unordered and f.culprit_ranks:
            f = _as_suspect(f, unordered)
        elif f.culprit_ranks and end.exit is not None and end.exit.signal == "SIGABRT" and calls_unseen(job, rank):
            f = _as_suspect(f, "it was aborted (SIGABRT) among collectives issued from C++ that nothing shows: gloo "
                               "aborting it on a size mismatch there (whose other side may be the cause), or a crash "
                               "of its own, cannot be told")
        elif gap is not None:
            # Alive after the first failure, then gone outside any call: the launcher stopping the job, or a fault
            # of its own; nothing recorded tells which.
            f = _as_suspect(f, f"it died {duration(gap)} after rank {first_rank}'s failure, outside any call: the "
                               "launcher stopping the job, or a fault of its own, cannot be told")
        if n == 0:
            first_rank, first_end = rank, end
        died.append(f)
    # Waits of the others on a dead rank that another finding names again are the same story; so are waits on
    # ranks the death took down with it (failed on the lost connection, or killed by the launcher after it).
    down = went_down(ends, dead, killed)
    out = [f for f in out if not (f.kind in (MISSING_RANKS, STUCK_ALL_JOINED) and f.culprit_ranks
                                  and set(f.culprit_ranks) <= down)
           and not (f.kind == P2P_MISMATCH and f.ranks_missing and set(f.ranks_missing) <= down)]
    return out + died


def _death_ns(end: RankEnd) -> int | None:
    """When the rank failed: for a death, when `record` saw its process end, else its last record (up to a
    heartbeat before); for an exception, when it raised."""
    return end.exit.aligned_ns if end.exit is not None and end.how == DIED else end.t_ns


def _known_gap(end: RankEnd, first: RankEnd) -> int | None:
    """How long after ``first``'s failure ``end`` died, where that it died after is known: `record` saw both
    processes end, in that order; else, by the logs, more than a heartbeat after (an exception's time is
    exact, but a death may come up to a heartbeat after the log's last record). None where it is not known."""
    if end.how == DIED and end.exit is not None and first.exit is not None:
        return end.exit.aligned_ns - first.exit.aligned_ns if first.ended_before(end) else None
    if end.t_ns is not None and first.t_ns is not None and end.t_ns > first.t_ns + HEARTBEAT_SLACK_NS:
        return end.t_ns - first.t_ns
    return None


def _order_of_deaths(dead: Mapping[int, RankEnd]) -> tuple[list[tuple[int, RankEnd]], str | None]:
    """The dead ranks, first death first, and why which died first cannot be told, if it cannot: several died,
    none by an exception of its own, and the first is not known to have ended before the others. Known: `record`
    saw every one end, the first before the rest (``RankExit.before``); else, by the logs, more than a heartbeat
    apart (a log's last record can precede its death by up to a heartbeat). Every one seen ended by SIGTERM was
    stopped, in some order, by whoever sent it (the launcher, stopped itself): no order of theirs tells a cause."""
    order = sorted(dead.items(), key=lambda kv: (_death_ns(kv[1]) or 0, kv[0]))
    times = [t for _, e in order if (t := _death_ns(e)) is not None]
    if len(order) < 2 or len(times) < len(order) or not all(e.how == DIED for _, e in order):
        return order, None
    ranks, spread = ranks_text(sorted(dead)), duration(max(times) - min(times))
    together = f"{ranks} died within {spread} of each other: which died first, and took the others down, cannot be told"
    first = order[0][1]
    if all(e.exit is not None for _, e in order):
        if all(e.exit is not None and e.exit.signal == "SIGTERM" for _, e in order):
            return order, (f"{ranks} were all ended by SIGTERM, within {spread}: stopped by whoever sent it (the "
                           "launcher, stopped itself, or a scheduler); what began it is not in these files")
        return order, None if all(first.ended_before(e) for _, e in order[1:]) else together
    return order, together if max(times) - min(times) <= HEARTBEAT_SLACK_NS else None


def _as_suspect(f: Finding, basis: str) -> Finding:
    """A ``rank_died`` finding whose rank the data cannot convict: a suspect, and its action claims nothing
    follows from it."""
    (rank,) = f.culprit_ranks
    return replace(f, culprit_ranks=(), suspect_ranks=(rank,), basis=basis,
                   action=f.action.replace("; the other ranks' failures follow from it.",
                                           f": whether the other ranks' failures follow from rank {rank}'s end "
                                           "cannot be told from these files."))


def went_down(ends: Mapping[int, RankEnd], dead: Mapping[int, RankEnd],
              killed: Mapping[int, RankEnd] | None) -> set[int]:
    """The ranks a death took down: the dead, those that failed on the lost connection, those the launcher
    killed after it. A wait on one of them (a collective, a send or a receive it never reached) is part of
    the death's story."""
    return set(dead) | {r for r, e in ends.items() if e.how == PEER_LOST} | set(killed or ())


def _waits_on(findings: list[Finding], rank: int) -> tuple[list[Finding], list[Finding]]:
    """The sends and receives left unmatched because ``rank`` halted (it is the side that never posted): no
    desync of their own, but the waits its death or freeze left behind. (kept, taken)."""
    taken = [f for f in findings if f.kind == P2P_MISMATCH and f.ranks_missing == (rank,)]
    return [f for f in findings if f not in taken], taken


def _op_text(f: Finding) -> str:
    """``all_reduce #5`` of a collective, ``recv`` of a send or receive without a sequence number."""
    return f"{f.op} #{f.seq}" if f.seq is not None else f"{f.op}"


def frozen_findings(job: Job, groups: Sequence[ProcessGroup], frozen: Mapping[int, RankEnd],
                    findings: list[Finding]) -> list[Finding]:
    """Each frozen rank becomes a ``rank_frozen`` finding that takes the wait it left the others in."""
    out = list(findings)
    for rank, end in sorted(frozen.items()):
        explained = next((f for f in out if f.kind in (MISSING_RANKS, NO_DUMP, STUCK_ALL_JOINED)
                          and rank in f.culprit_ranks + f.ranks_missing and f.seq is not None), None)
        if explained is not None:
            out.remove(explained)
        out, p2p = _waits_on(out, rank)
        out.append(_rank_frozen(job, groups, rank, end, explained or (p2p[0] if p2p else None)))
    return out


def _rank_frozen(job: Job, groups: Sequence[ProcessGroup], rank: int, end: RankEnd,
                 explained: Finding | None) -> Finding:
    step = _last_step(job, rank)
    during = f", during step {step}" if step is not None else ""
    at = _clock_text(end.t_ns) if end.t_ns is not None else "its last record"
    detail = (f"Rank {rank} stopped making progress at {at} (its last record{during}); its process was alive at "
              f"the stall: {end.detail}.")
    last = _last_completed(job, groups, rank, issued=True)
    evidence: dict[str, Any] = {"how": end.how, "last_record_ns": end.t_ns, "step": step, "seen": end.detail}
    if last is not None:
        detail += f" Its last collective was {last['op']} #{last['seq']} on {last['process_group']}."
        evidence["last_collective"] = last
    if explained is not None:
        waiting = [r for r in explained.ranks_joined if r != rank]
        detail += (f" {ranks_text(waiting).capitalize()} {'wait' if len(waiting) > 1 else 'waits'} in "
                   f"{_op_text(explained)} on {explained.process_group} for it.")
    action = (f"Look at what rank {rank} is doing: `py-spy dump --pid PID` of its process (its host and pid are "
              "in its event log's header), its GPU (`nvidia-smi`); a stopped process (SIGSTOP, a debugger) "
              "goes on after SIGCONT.")
    stack = stall_stack(job, rank)
    return Finding(
        kind=RANK_FROZEN, process_group=explained.process_group if explained else "",
        group_uid=explained.group_uid if explained else "", seq=explained.seq if explained else None,
        op=explained.op if explained else None,
        ranks_joined=tuple(r for r in explained.ranks_joined if r != rank) if explained else (),
        ranks_missing=(rank,), culprit_ranks=(rank,), detail=detail, action=action,
        call_sites=explained.call_sites if explained else {}, stacks={rank: stack} if stack else {},
        evidence=evidence, t_ns=end.t_ns, basis="its process existed at the stall and made no progress",
    )


def _rank_died(job: Job, groups: Sequence[ProcessGroup], rank: int, end: RankEnd, ends: Mapping[int, RankEnd],
               explained: Finding | None, killed: Mapping[int, RankEnd] | None = None,
               inside: Collective | None = None) -> Finding:
    when = f" at {_clock_text(end.t_ns)}" if end.t_ns is not None else ""
    step = _last_step(job, rank)
    during = f" during step {step}" if step is not None else ""
    if end.how == EXCEPTION:
        how = f"raised an uncaught {end.detail}"
    elif end.exit is not None and end.exit.how is not None:
        how = f"{_exit_text(end.exit)}, as `record` saw at {_clock_text(end.exit.aligned_ns)}; its last record is"
    else:
        how = (f"died ({end.detail}: killed, by SIGKILL or the OOM killer for instance, or crashed in C++); "
               "its last record is")
    detail = f"Rank {rank} {how}{when}{during}."
    last = _last_completed(job, groups, rank)
    evidence: dict[str, Any] = {"how": end.how, "ended": end.detail, "last_record_ns": end.t_ns, "step": step}
    if end.exit is not None:
        evidence["exit"] = {"t_ns": end.exit.aligned_ns, "signal": end.exit.signal, "status": end.exit.status}
    if last is not None:
        detail += f" Its last completed collective was {last['op']} #{last['seq']} on {last['process_group']}."
        evidence["last_collective"] = last
    else:
        detail += " No completed collective of it is recorded (those issued from C++, as DDP's, are only in " \
                  "Flight Recorder dumps, which a killed rank does not write)."
    victims = {r: e for r, e in ends.items() if r != rank and e.how not in (DIED, EXCEPTION)}
    failed = sorted(r for r, e in victims.items() if e.how == PEER_LOST)
    if inside is not None:
        others = [r for r in inside.ranks if r != rank]
        detail += (f" It ended inside {inside.op} #{inside.seq} on {inside.group.label}, which "
                   f"{ranks_text(others)} had joined too: gloo aborts a rank whose received data does not match the "
                   "size it expects (SIGABRT, \"Received data size doesn't match expected size\" in its stderr), so "
                   "this collective's sizes may disagree, and then the rank whose sizes differ is the cause; an "
                   "outside kill (the OOM killer) would look the same in these files.")
        evidence["died_inside"] = {"process_group": inside.group.label, "seq": inside.seq, "op": inside.op}
    elif explained is not None:
        verb = "failed" if failed else "waited"
        if rank in explained.ranks_joined:
            others = [r for r in explained.ranks_joined if r != rank]
            detail += (f" {ranks_text(others).capitalize()} {verb} in {_op_text(explained)} on "
                       f"{explained.process_group}, inside which rank {rank} died.")
        else:
            detail += (f" {ranks_text(list(explained.ranks_joined)).capitalize()} then {verb} in "
                       f"{_op_text(explained)} on {explained.process_group}, which rank {rank} never joined.")
    if failed:
        for r in failed[:3]:
            was_in = _last_completed(job, groups, r, issued=True) if explained is None else None
            within = f" in {was_in['op']} #{was_in['seq']} on {was_in['process_group']} (its last collective)" \
                if was_in else ""
            detail += f" Rank {r} failed{within}: {_short(ends[r].detail)}"
        evidence["failed"] = {str(r): ends[r].detail for r in failed}
    after = sorted(killed or ())
    if after and end.t_ns is not None:
        detail += f" {_killed_text(job, {r: (killed or {})[r] for r in after}, end)}"
        evidence["killed_after"] = {str(r): _death_ns((killed or {})[r]) for r in after}
    if end.how == EXCEPTION:
        action = (f"Fix the exception rank {rank} raised (its traceback is in the job's stderr); the other ranks' "
                  "failures follow from it.")
    elif inside is not None:
        action = (f"Look at rank {rank}'s stderr for gloo's size message (or the launcher's exit code -6, SIGABRT) "
                  f"and compare the sizes every rank passes to {inside.op} here (`comm2perfetto record` logs "
                  "all-to-all split sizes and object list lengths).")
    else:
        action = (f"Find out why rank {rank}'s process ended (its stderr, the launcher's log, `dmesg` for the OOM "
                  f"killer); the other ranks' failures follow from it.")
    label, uid, seq, op = "", "", None, None
    joined: tuple[int, ...] = tuple(failed)
    missing: tuple[int, ...] = (rank,)
    if inside is not None:  # where it died, with every rank that joined
        label, uid, seq, op = inside.group.label, inside.group.uid, inside.seq, inside.op
        joined, missing = tuple(inside.ranks), ()
    elif explained is not None:
        label, uid, seq, op = explained.process_group, explained.group_uid, explained.seq, explained.op
        joined, missing = explained.ranks_joined, (rank,)
    return Finding(
        kind=RANK_DIED, process_group=label, group_uid=uid, seq=seq, op=op, ranks_joined=joined,
        ranks_missing=missing, detail=detail, action=action,
        call_sites=explained.call_sites if explained else {}, stacks={rank: s} if (s := stall_stack(job, rank)) else {},
        evidence=evidence, t_ns=end.t_ns, victim_ranks=tuple(sorted(set(failed) | set(after))),
        culprit_ranks=() if inside is not None else (rank,), suspect_ranks=(rank,) if inside is not None else (),
        basis="it ended inside a collective every rank had joined, which may have aborted it" if inside is not None
        else "an uncaught exception of its own ended it first" if end.how == EXCEPTION
        else f"`record` saw its process end first, {'by' if end.exit.signal else 'with'} {end.exit.how}"
        if end.exit is not None and end.exit.how
        else "its process ended first, without closing its log",
    )


def _exit_text(seen: RankExit) -> str:
    """How `record` saw a process end, e.g. ``was killed by SIGKILL (the OOM killer, a kill -9, a scheduler)``."""
    if seen.signal == "SIGKILL":
        return "was killed by SIGKILL (the OOM killer, a `kill -9`, or a scheduler)"
    if seen.signal in ("SIGSEGV", "SIGBUS", "SIGABRT", "SIGFPE", "SIGILL"):
        return f"crashed ({seen.signal}: a fault in C++ code, or an abort, such as gloo's on a size mismatch)"
    if seen.signal is not None:
        return f"was ended by {seen.signal}"
    return f"exited with status {seen.status} without closing its log (os._exit, or an exit from C++)"


def _killed_text(job: Job, killed: Mapping[int, RankEnd], first: RankEnd) -> str:
    """What the ranks the launcher stopped after ``first`` did: ended how much later, and how."""
    after = sorted(killed)
    gaps = [g for r in after if (g := _known_gap(killed[r], first)) is not None]
    if not gaps:
        gaps = [max(0, (killed[r].t_ns or 0) - (first.t_ns or 0)) for r in after]
    signals = {e.exit.signal if (e := killed[r]).exit is not None else None for r in after}
    how = (f", by {next(iter(signals))}" if len(signals) == 1 and None not in signals
           else f", still inside {'their' if len(after) > 1 else 'its'} call"
           if all(_inside_a_call(job, r) for r in after) else "")
    return (f"{ranks_text(after).capitalize()} ended {duration(min(gaps))} later{how}: the launcher stops the "
            "other workers when one fails (torchrun: SIGTERM, then SIGKILL after its grace period), a consequence, "
            "not a cause.")


def _short(text: str, limit: int = 200) -> str:
    line = text.strip().splitlines()[0] if text.strip() else text
    return line if len(line) <= limit else line[:limit].rstrip() + "..."


def _clock_text(t_ns: int) -> str:
    """``14:15:03.123 UTC`` (rank 0's clock)."""
    return time.strftime("%H:%M:%S", time.gmtime(t_ns / 1e9)) + f".{t_ns // 1_000_000 % 1000:03d} UTC"


def _last_step(job: Job, rank: int) -> int | None:
    steps = getattr(job.logs.get(rank), "steps", None)
    return steps[-1][0] if steps else None


def _last_completed(job: Job, groups: Sequence[ProcessGroup], rank: int, issued: bool = False) -> dict | None:
    """The rank's latest completed collective (``issued``: its latest one, done or not) over the groups."""
    best = None
    for g in groups:
        for c in reversed(job.collectives.get(g.uid, ())):
            if rank not in c.ranks or c.signatures[c.ranks.index(rank)] is None:
                continue
            if not issued and c.state_of(rank) in NOT_DONE_STATES:
                continue
            t = c.arrival_of(rank) or 0
            if best is None or t > best[0]:
                best = (t, {"process_group": g.label, "seq": c.seq, "op": c.op})
            break
    return best[1] if best else None


def any_matched(job: Job, groups: Sequence[ProcessGroup]) -> bool:
    """At least one collective every rank of its group recorded (of a sample, every rank of it in the group),
    or a send its receiver matched: the evidence an "ok" needs."""
    if job.sampled:
        def joined(c: Collective) -> bool:
            sigs = [s for r, s in zip(c.ranks, c.signatures) if r in job.ranks]
            return bool(sigs) and all(s is not None for s in sigs)
    else:
        def joined(c: Collective) -> bool:
            return all(c.signatures)
    return any(joined(c) for g in groups for c in job.collectives.get(g.uid, ())) or any(
        tr.matched for g in groups for tr in job.p2p.get(g.uid, ()))


def no_collectives(job: Job, groups: Sequence[ProcessGroup]) -> Finding:
    what = "No collective was recorded on all the ranks of its group" if groups else \
        "No process group with a collective was found in the data"
    cause = ""
    if any(i.fr_files for i in job.ranks.values()):
        backends = {i.backend for i in job.ranks.values()} | {g.backend for g in groups}
        gloo = "gloo" in backends and "nccl" not in backends
        cause = (" The Flight Recorder dumps hold no collective entry: torch 2.4 to 2.7 does not record gloo's "
                 "collectives in Flight Recorder (record the job with `comm2perfetto record`, whose log sees "
                 "them)" + ("." if gloo else "; or the groups never got sequence numbers, or the dumps were "
                                             "taken before the first collective."))
    if not cause and any(j.get("signal") == "SIGTERM" for j in job.jobs) and not any(
            i.fr_files for i in job.ranks.values()):
        cause = (" `record` forwarded SIGTERM to the job before any Flight Recorder dump was written: what DDP and "
                 "FSDP issue from C++ is only in Flight Recorder, and SIGTERM ends a rank at once, as it would "
                 "without the recorder, with no dump (Ctrl-C, SIGINT, lets the recorder dump first).")
    kernels = {rank: n for rank, traces in job.traces.items()
               if (n := sum(e.on_gpu and ALL_COMM_KERNELS.search(e.name) is not None
                            for t in traces for e in t.comm_events))}
    if not cause and kernels:
        cause = (f" The profiler traces of {ranks_text(sorted(kernels))} hold {sum(kernels.values())} communication "
                 "kernels, which ran, but no event names their process group and the traces list several: which "
                 "collective each one is cannot be matched across ranks.")
    detail = f"{what}: nothing was checked, so nothing can be called healthy.{cause}"
    return Finding(
        kind=NO_COLLECTIVES, process_group="", group_uid="", seq=None, op=None, ranks_joined=(),
        ranks_missing=(), culprit_ranks=(), detail=detail,
        action="Check that the dumps are of the job you meant and that it issued collectives.",
    )
