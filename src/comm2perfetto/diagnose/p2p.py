"""Point to point: every send without its receive, every receive without its send, and pairs of other sizes.
No torch."""

from __future__ import annotations

from typing import Any

from comm2perfetto.diagnose.evidence import (
    numel,
    ordinal,
)
from comm2perfetto.diagnose.findings import (
    P2P_MISMATCH,
    Finding,
)
from comm2perfetto.diagnose.stalls import stall_stack
from comm2perfetto.job import Job
from comm2perfetto.model import (
    COMPLETED,
    P2PTransfer,
    ProcessGroup,
    call_site,
)

__all__ = ["p2p_findings"]


# --- point to point --------------------------------------------------------------------------------------


MAX_P2P_FINDINGS = 8  # per group: unmatched sends and receives told one by one, the rest counted in a note


def p2p_findings(job: Job, group: ProcessGroup, notes: list[str]) -> list[Finding]:
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
            da, db = tr.send.signature.input_dtypes, tr.recv.signature.input_dtypes
            # gloo moves bytes: another dtype is another size (and aborts the receiver), as numel's differing is
            if (a is not None and b is not None and numel(a) != numel(b)) or (da and db and da != db):
                bad.append((tr, "size"))
            continue
        other = tr.dst if tr.send is not None else tr.src
        cov = job.coverage.get((other, group.uid))
        if other not in job.ranks:
            continue  # the peer left no data: reported as no_dump
        if cov is not None and cov.has_fr and cov.first_seq > 0 and not cov.has_log:
            continue  # the peer's ring buffer wrapped: its side may have been overwritten
        bad.append((tr, "unmatched"))
    bad.sort(key=lambda b: p2p_time(b[0]))
    if len(bad) > MAX_P2P_FINDINGS:
        notes.append(f"{len(bad) - MAX_P2P_FINDINGS} more unmatched sends or receives on {group.label} after the "
                     f"first {MAX_P2P_FINDINGS} (not told one by one)")
    return [p2p_finding(job, group, tr, why) for tr, why in bad[:MAX_P2P_FINDINGS]]


def p2p_finding(job: Job, group: ProcessGroup, tr: P2PTransfer, why: str) -> Finding:
    op = tr.send or tr.recv
    assert op is not None
    nth = ordinal(tr.index + 1)
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
        action = "Make the sender's and the receiver's tensors the same size and dtype."
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
        t, peer = op.t_arrive_ns, (tr.src if tr.send is not None else tr.dst)
        # A peer blocked in a call the waiting rank never joined went on, wherever the clocks put that call:
        # the two wait on each other (out of step), and neither is away.
        evidence["waiting"] = (t is not None and not issued_since(job, culprits[0], t)
                               and not blocked_on(job, culprits[0], peer))
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
        evidence=evidence, t_ns=p2p_time(tr),
        basis="the sizes or dtypes of a matched send and recv differ" if suspects else
              f"Flight Recorder and the recorder see every send and recv; rank {culprits[0]} has no record of its side",
    )


def issued_since(job: Job, rank: int, t_ns: int) -> bool:
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


def blocked_on(job: Job, rank: int, peer: int) -> bool:
    """Whether ``peer`` never joined the newest collective ``rank`` issued in a group they share: a collective
    cannot finish without a member, so ``rank`` waits for ``peer`` there (gloo's Flight Recorder states say
    nothing: not the state, the peer's absence is the evidence)."""
    for uid, group in job.groups.items():
        if rank not in group.ranks or peer not in group.ranks:
            continue
        cols = job.collectives.get(uid, ())
        for k in range(len(cols) - 1, max(-1, len(cols) - 9), -1):
            if rank in cols[k].joined_ranks:
                if cols[k].state_of(rank) != COMPLETED and peer not in cols[k].joined_ranks:
                    return True
                break
    return False


def p2p_time(tr: P2PTransfer) -> int:
    ts = [p.t_arrive_ns for p in (tr.send, tr.recv) if p is not None and p.t_arrive_ns is not None]
    return min(ts) if ts else 0
