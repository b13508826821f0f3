"""Turn diagnose's findings into what the trace marks, so that the trace and diagnose never disagree.

- A collective a finding says did not complete is ``stalled`` on every rank that joined it and had not
  completed it: drawn from its arrival to the end of the trace, with the ranks it waits for.
- Every rank that never joined it gets an instant ``missing <op> (<group> seq N)`` on its track for that
  group, at its last activity (or at the stall, for a stall the job recovered from), with its stack; a rank
  whose process died before it, ``died before <op> (<group> seq N)``.
- Op, size and dtype mismatches put an instant on each rank involved, with that rank's signature.

Never imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from comm2perfetto.diagnose.findings import (
    DESYNC_KINDS,
    MISSING_RANKS,
    P2P_MISMATCH,
    RANK_DIED,
    RANK_FROZEN,
    STUCK_ALL_JOINED,
    Diagnosis,
    Finding,
)
from comm2perfetto.job import Job
from comm2perfetto.model import CallState


@dataclass(frozen=True, slots=True)
class RankMark:
    """An instant on one rank's track of a group. ``t_ns`` None: at the rank's last activity."""

    rank: int
    group_uid: str
    t_ns: int | None
    name: str
    args: dict


@dataclass(slots=True)
class Markers:
    findings: tuple[Finding, ...]
    stalled: dict[tuple[str, int], dict[int, tuple[int, ...]]] = field(default_factory=dict)  # -> rank: waits for
    mismatched: dict[tuple[str, int], str] = field(default_factory=dict)  # (group, seq) -> finding kind
    marks: list[RankMark] = field(default_factory=list)

    @property
    def implicated_ranks(self) -> set[int]:
        """Ranks a finding names: kept when a big job is sampled."""
        out: set[int] = set()
        for f in self.findings:
            out.update(f.culprit_ranks)
            out.update(f.suspect_ranks)
            out.update(f.ranks_missing)
        out.update(m.rank for m in self.marks)
        return out


def plan_markers(job: Job, diagnosis: Diagnosis) -> Markers:
    markers = Markers(findings=diagnosis.findings)
    for f in diagnosis.findings:
        if f.seq is None or f.group_uid not in job.groups or f.kind == P2P_MISMATCH:  # a p2p seq is no collective's
            continue
        c = job.collectives[f.group_uid].find(f.seq)
        title = f"{f.op} ({f.process_group} seq {f.seq})"
        if f.kind in DESYNC_KINDS:
            markers.mismatched[(f.group_uid, f.seq)] = f.kind
            for rank in f.ranks_joined:
                sig = c.signatures[c.ranks.index(rank)] if c is not None else None
                markers.marks.append(RankMark(rank, f.group_uid, c.arrival_of(rank) if c is not None else None,
                                              f"{f.kind} {title}", {
                                                  "signature": sig.describe() if sig is not None else "?",
                                                  "culprit": rank in f.culprit_ranks,
                                                  "suspect": rank in f.suspect_ranks,
                                                  "victim": rank in f.victim_ranks, "detail": f.detail}))
        if f.kind in (MISSING_RANKS, RANK_DIED, RANK_FROZEN):
            what = {MISSING_RANKS: "missing", RANK_DIED: "died before", RANK_FROZEN: "stopped before"}[f.kind]
            for rank in f.ranks_missing:
                args: dict = {"detail": f.detail, "resolved": f.resolved}
                if rank in f.stacks:
                    args["stack"] = "\n".join(f.stacks[rank])
                last = f.evidence.get("last_collective", {}).get(str(rank))
                if last:
                    args["last_collective"] = f"{last['op']} ({last['process_group']} seq {last['seq']})"
                markers.marks.append(RankMark(rank, f.group_uid, f.t_ns if f.resolved else None,
                                              f"{what} {title}", args))
        if f.resolved or c is None or f.kind not in (MISSING_RANKS, RANK_DIED, RANK_FROZEN, STUCK_ALL_JOINED,
                                                      *DESYNC_KINDS):
            continue
        waiting = {}
        not_done = [r for r, sig, st, end in zip(c.ranks, c.signatures, c.states, c.end_ns)
                    if sig is not None and (st != CallState.COMPLETED or end is None)]
        for rank in not_done:
            others = set(f.ranks_missing) or (set(not_done) - {rank}) or set(f.culprit_ranks) - {rank}
            waiting[rank] = tuple(sorted(others))
        if waiting:
            markers.stalled[(f.group_uid, f.seq)] = waiting
    return markers
