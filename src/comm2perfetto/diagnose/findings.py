"""What diagnose reports: findings and the verdict, as data (``to_json`` is the contract).

Every finding carries its certainty: ``culprit_ranks`` are ranks the data shows failed the others (``basis``
says what it rests on), ``suspect_ranks`` ranks the problem may come from that the data cannot clear or convict,
``victim_ranks`` ranks that failed because of it (gloo aborted them inside the collective, the launcher killed
them after the first failure). The kinds and the statuses are enums (``Kind``, ``Status``) whose values are the
JSON's words; ``diagnose.verdict.decide`` is the one place that turns findings into a status.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from comm2perfetto.model import ClockAlignment, Skipped

__all__ = ["DESYNC_KINDS", "DTYPE_MISMATCH", "GROUP_MISMATCH", "MISSING_RANKS", "NO_COLLECTIVES", "NO_DUMP",
           "OP_MISMATCH", "ORDER", "P2P_MISMATCH", "RANK_DIED", "SEQUENCE_MISMATCH", "SIZE_MISMATCH",
           "STALL_UNEXPLAINED", "STATUS_EXIT",
           "STUCK_ALL_JOINED", "AttemptEnd", "Diagnosis", "Finding", "Kind", "RankAccount", "Status"]


class _Word(str, Enum):
    """An enum whose members are their JSON words, also in f-strings and ``str()`` (any Python)."""

    def __str__(self) -> str:
        return str(self.value)


class Kind(_Word):
    """What a finding is about."""

    MISSING_RANKS = "missing_ranks"  # some ranks never issued a collective the others wait in
    OP_MISMATCH = "op_mismatch"
    SIZE_MISMATCH = "size_mismatch"
    DTYPE_MISMATCH = "dtype_mismatch"
    P2P_MISMATCH = "p2p_mismatch"
    ROOT_MISMATCH = "root_mismatch"  # a rooted collective (broadcast, reduce, gather, scatter) with different roots
    ORDER_MISMATCH = "order_mismatch"  # ranks waiting on each other: one issued two groups' collectives out of order
    GROUP_MISMATCH = "group_mismatch"  # one group under different c10d ids on different ranks: creation order
    SEQUENCE_MISMATCH = "sequence_mismatch"  # a rank's collectives shifted against its peers': an extra or a skip
    STUCK_ALL_JOINED = "stuck_all_joined"
    NO_DUMP = "no_dump"
    RANK_DIED = "rank_died"
    RANK_FROZEN = "rank_frozen"  # its process existed at the stall but made no progress
    STALL_UNEXPLAINED = "stall_unexplained"  # a stall the data shows no cause of: stuck, cause not found
    NO_COLLECTIVES = "no_collectives"


class Status(_Word):
    """The verdict; ``STATUS_EXIT`` gives diagnose's exit status for each."""

    OK = "ok"
    INTERRUPTED = "interrupted"
    RUNNING = "running"
    STUCK = "stuck"
    DESYNC = "desync"
    CRASHED = "crashed"
    INCOMPLETE = "incomplete"


MISSING_RANKS = Kind.MISSING_RANKS
OP_MISMATCH = Kind.OP_MISMATCH
SIZE_MISMATCH = Kind.SIZE_MISMATCH
DTYPE_MISMATCH = Kind.DTYPE_MISMATCH
P2P_MISMATCH = Kind.P2P_MISMATCH
ROOT_MISMATCH = Kind.ROOT_MISMATCH
ORDER_MISMATCH = Kind.ORDER_MISMATCH
GROUP_MISMATCH = Kind.GROUP_MISMATCH
SEQUENCE_MISMATCH = Kind.SEQUENCE_MISMATCH
STUCK_ALL_JOINED = Kind.STUCK_ALL_JOINED
NO_DUMP = Kind.NO_DUMP
RANK_DIED = Kind.RANK_DIED
RANK_FROZEN = Kind.RANK_FROZEN
STALL_UNEXPLAINED = Kind.STALL_UNEXPLAINED
NO_COLLECTIVES = Kind.NO_COLLECTIVES

DESYNC_KINDS = (GROUP_MISMATCH, SEQUENCE_MISMATCH, OP_MISMATCH, SIZE_MISMATCH, DTYPE_MISMATCH, ROOT_MISMATCH,
                ORDER_MISMATCH, P2P_MISMATCH)
ORDER = {k: i for i, k in enumerate(DESYNC_KINDS + (RANK_DIED, RANK_FROZEN, MISSING_RANKS, STUCK_ALL_JOINED,
                                                    STALL_UNEXPLAINED, NO_DUMP, NO_COLLECTIVES))}
# The verdicts, and the exit status diagnose gives each: 0 when nothing is wrong (so far).
STATUS_EXIT = {Status.OK: 0, Status.INTERRUPTED: 0, Status.RUNNING: 0, Status.STUCK: 1, Status.DESYNC: 1,
               Status.CRASHED: 1, Status.INCOMPLETE: 1}


@dataclass(frozen=True, slots=True)
class Finding:
    """One problem. ``call_sites`` and ``stacks`` are keyed by global rank.

    ``culprit_ranks`` are root causes the data shows (ranks nobody's wait explains, see ``waits``, or whose own
    record deviates), ``basis`` the sentence saying what shows it; ``suspect_ranks`` are ranks the problem may
    come from that the data cannot separate from the others (no data, no answer, two sides that differ with
    nothing to tell which is wrong); ``victim_ranks`` ranks that failed because of it (aborted by gloo inside
    the collective, killed by the launcher after the first failure). A finding whose waits lead to another
    finding's root is ``blocked_by`` it (its 1-based number in the diagnosis) and has no culprit.
    """

    kind: Kind
    process_group: str
    group_uid: str
    seq: int | None
    op: str | None
    ranks_joined: tuple[int, ...]
    ranks_missing: tuple[int, ...]
    culprit_ranks: tuple[int, ...]
    detail: str
    action: str
    call_sites: Mapping[int, str] = field(default_factory=dict)
    stacks: Mapping[int, tuple[str, ...]] = field(default_factory=dict)
    evidence: Mapping[str, Any] = field(default_factory=dict)
    resolved: bool = False
    t_ns: int | None = None  # when it happened (earliest arrival), aligned to rank 0
    suspect_ranks: tuple[int, ...] = ()
    blocked_by: int | None = None
    victim_ranks: tuple[int, ...] = ()
    basis: str = ""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": str(self.kind), "process_group": self.process_group, "group_uid": self.group_uid,
            "seq": self.seq, "op": self.op, "ranks_joined": list(self.ranks_joined),
            "ranks_missing": list(self.ranks_missing), "culprit_ranks": list(self.culprit_ranks),
            "detail": self.detail, "action": self.action,
            "call_sites": {str(r): s for r, s in sorted(self.call_sites.items())},
            "stacks": {str(r): list(s) for r, s in sorted(self.stacks.items())},
            "resolved": self.resolved, "suspect_ranks": list(self.suspect_ranks), "blocked_by": self.blocked_by,
            "victim_ranks": list(self.victim_ranks), "basis": self.basis,
        }
        if self.evidence:
            out["evidence"] = dict(self.evidence)
        return out


@dataclass(frozen=True, slots=True)
class AttemptEnd:
    """How one attempt ended: its own verdict's status and culprits, and a line saying what happened.
    ``status`` is None when its files could not be read (``summary`` says why)."""

    attempt: int
    status: Status | None
    culprit_ranks: tuple[int, ...]
    summary: str

    def to_json(self) -> dict[str, Any]:
        return {"attempt": self.attempt, "status": None if self.status is None else str(self.status),
                "culprit_ranks": list(self.culprit_ranks), "summary": self.summary}


@dataclass(frozen=True, slots=True)
class RankAccount:
    """Where one rank stood at the end of the data (or at the stall, live): every rank of the job has one.

    ``state``: ``blocked`` (in ``where``, an operation), ``missing`` (others wait for it in ``where``),
    ``outside`` (running, in no communication), ``exited``, ``dead``, ``frozen``, ``victim`` (ended by the
    failure of another rank: aborted by gloo inside ``where``, killed by the launcher), ``no_data``."""

    state: str
    where: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"state": self.state, "where": self.where} if self.where else {"state": self.state}


@dataclass(frozen=True, slots=True)
class Diagnosis:
    status: Status
    world_size: int | None
    ranks_with_data: tuple[int, ...]
    findings: tuple[Finding, ...]
    skipped: tuple[Skipped, ...]
    notes: tuple[str, ...]
    clock: ClockAlignment
    groups_checked: tuple[str, ...]
    # A job torchrun restarted: the attempt this verdict is about (None: no restart seen) and how each other
    # attempt ended (diagnose/attempts.py).
    attempt: int | None = None
    other_attempts: tuple[AttemptEnd, ...] = ()
    # The ranks with data are a sample of the job (Job.sampled: "traces", "data"): the verdict covers them.
    sampled: str | None = None
    ranks: Mapping[int, RankAccount] = field(default_factory=dict)  # every rank: where it stood

    @property
    def healthy(self) -> bool:
        """Nothing wrong was found (``ok``, ``interrupted`` or ``running``): exit status 0."""
        return STATUS_EXIT[self.status] == 0

    def to_json(self) -> dict[str, Any]:
        clock = self.clock
        return {
            "status": str(self.status), "world_size": self.world_size, "ranks_with_data": list(self.ranks_with_data),
            "culprit_ranks": sorted({r for f in self.findings if not f.resolved for r in f.culprit_ranks}),
            "suspect_ranks": sorted({r for f in self.findings if not f.resolved for r in f.suspect_ranks}),
            "victim_ranks": sorted({r for f in self.findings if not f.resolved for r in f.victim_ranks}),
            "findings": [f.to_json() for f in self.findings],
            "groups_checked": list(self.groups_checked),
            "skipped": [{"path": s.path, "reason": s.reason} for s in self.skipped],
            "notes": list(self.notes),
            "clock": {
                "offset_ns": {str(r): o for r, o in sorted(clock.offset_ns.items())},
                "method": {str(r): m for r, m in sorted(clock.method.items())},
                "residual_skew_ns": clock.residual_skew_ns, "samples": clock.samples,
                "fit": {str(r): f for r, f in sorted(clock.fit.items())},
                "drift_ppm": {str(r): ppm for r, ppm in clock.drifts_ppm().items()},
                "residual_ns": {str(r): ns for r, ns in sorted(clock.residual_ns.items())},
                "uncalibrated": {str(r): ns for r, ns in sorted(clock.uncalibrated.items())},
            },
            "attempt": self.attempt,
            "other_attempts": [a.to_json() for a in self.other_attempts],
            "sampled": self.sampled,
            "ranks": {str(r): a.to_json() for r, a in sorted(self.ranks.items())},
        }

