"""What diagnose reports: findings and the verdict, as data (``to_json`` is the contract)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from comm2perfetto.model import ClockAlignment, Skipped

__all__ = ["DESYNC_KINDS", "DTYPE_MISMATCH", "MISSING_RANKS", "NO_COLLECTIVES", "NO_DUMP", "OP_MISMATCH", "ORDER",
           "P2P_MISMATCH", "RANK_DIED", "SIZE_MISMATCH", "STATUS_EXIT", "STUCK_ALL_JOINED", "AttemptEnd", "Diagnosis",
           "Finding"]

MISSING_RANKS = "missing_ranks"
OP_MISMATCH = "op_mismatch"
SIZE_MISMATCH = "size_mismatch"
DTYPE_MISMATCH = "dtype_mismatch"
P2P_MISMATCH = "p2p_mismatch"
ROOT_MISMATCH = "root_mismatch"  # a rooted collective (broadcast, reduce, gather, scatter) with different roots
ORDER_MISMATCH = "order_mismatch"  # ranks waiting on each other: one issued two groups' collectives out of order
STUCK_ALL_JOINED = "stuck_all_joined"
NO_DUMP = "no_dump"
RANK_DIED = "rank_died"
RANK_FROZEN = "rank_frozen"  # its process existed at the stall but made no progress
NO_COLLECTIVES = "no_collectives"

DESYNC_KINDS = (OP_MISMATCH, SIZE_MISMATCH, DTYPE_MISMATCH, ROOT_MISMATCH, ORDER_MISMATCH, P2P_MISMATCH)
ORDER = {k: i for i, k in enumerate(DESYNC_KINDS + (RANK_DIED, RANK_FROZEN, MISSING_RANKS, STUCK_ALL_JOINED,
                                                    NO_DUMP, NO_COLLECTIVES))}
# The verdicts, and the exit status diagnose gives each: 0 when nothing is wrong (so far).
STATUS_EXIT = {"ok": 0, "interrupted": 0, "running": 0, "stuck": 1, "desync": 1, "crashed": 1, "incomplete": 1}


@dataclass(frozen=True, slots=True)
class Finding:
    """One problem. ``call_sites`` and ``stacks`` are keyed by global rank.

    ``culprit_ranks`` are root causes only (ranks nobody's wait explains, see ``waits``); ``suspect_ranks`` are
    ranks the problem may come from that left no evidence (no data, no answer). A finding whose waits lead to
    another finding's root is ``blocked_by`` it (its 1-based number in the diagnosis) and has no culprit.
    """

    kind: str
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

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": self.kind, "process_group": self.process_group, "group_uid": self.group_uid,
            "seq": self.seq, "op": self.op, "ranks_joined": list(self.ranks_joined),
            "ranks_missing": list(self.ranks_missing), "culprit_ranks": list(self.culprit_ranks),
            "detail": self.detail, "action": self.action,
            "call_sites": {str(r): s for r, s in sorted(self.call_sites.items())},
            "stacks": {str(r): list(s) for r, s in sorted(self.stacks.items())},
            "resolved": self.resolved, "suspect_ranks": list(self.suspect_ranks), "blocked_by": self.blocked_by,
        }
        if self.evidence:
            out["evidence"] = dict(self.evidence)
        return out


@dataclass(frozen=True, slots=True)
class AttemptEnd:
    """How one attempt ended: its own verdict's status and culprits, and a line saying what happened.
    ``status`` is None when its files could not be read (``summary`` says why)."""

    attempt: int
    status: str | None
    culprit_ranks: tuple[int, ...]
    summary: str

    def to_json(self) -> dict[str, Any]:
        return {"attempt": self.attempt, "status": self.status, "culprit_ranks": list(self.culprit_ranks),
                "summary": self.summary}


@dataclass(frozen=True, slots=True)
class Diagnosis:
    status: str  # a key of STATUS_EXIT
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

    @property
    def healthy(self) -> bool:
        """Nothing wrong was found (``ok``, ``interrupted`` or ``running``): exit status 0."""
        return STATUS_EXIT[self.status] == 0

    def to_json(self) -> dict[str, Any]:
        clock = self.clock
        return {
            "status": self.status, "world_size": self.world_size, "ranks_with_data": list(self.ranks_with_data),
            "culprit_ranks": sorted({r for f in self.findings if not f.resolved for r in f.culprit_ranks}),
            "suspect_ranks": sorted({r for f in self.findings if not f.resolved for r in f.suspect_ranks}),
            "findings": [f.to_json() for f in self.findings],
            "groups_checked": list(self.groups_checked),
            "skipped": [{"path": s.path, "reason": s.reason} for s in self.skipped],
            "notes": list(self.notes),
            "clock": {
                "offset_ns": {str(r): o for r, o in sorted(clock.offset_ns.items())},
                "method": {str(r): m for r, m in sorted(clock.method.items())},
                "residual_skew_ns": clock.residual_skew_ns, "samples": clock.samples,
            },
            "attempt": self.attempt,
            "other_attempts": [a.to_json() for a in self.other_attempts],
            "sampled": self.sampled,
        }

