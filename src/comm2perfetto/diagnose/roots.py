"""Findings arranged by the wait-for graph (``waits``): root causes first, every other wait blocked by one.

diagnose and the live verdict each find the waits of a job their own way (dumps and logs afterwards, the ranks'
positions at the stall) and state each as a finding; ``arrange`` turns each finding about a wait into a
``waits.Wait``, explains the waits and rewrites the findings so that:

- a finding naming a root cause keeps it in ``culprit_ranks`` (a rank waited for that is blocked in nothing,
  or an operation every member reached); a rank without data is in ``suspect_ranks`` instead;
- a rank that died or froze is told by its own finding (``rank_died``, ``rank_frozen``), which takes the wait
  it left the others in;
- ranks waiting on each other become one ``order_mismatch`` finding naming the rank whose order deviates and
  the two operations (a send or recv the deviating rank skipped stays that ``p2p_mismatch``, now naming it);
- every other finding about a wait has no culprit and is ``blocked_by`` the first root finding its waits lead
  to.

Roots come first, each group of findings in the usual order (mismatches, dead ranks ... ranks without data).
No torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from comm2perfetto.diagnose.findings import (
    DESYNC_KINDS,
    GROUP_MISMATCH,
    MISSING_RANKS,
    NO_DUMP,
    ORDER,
    ORDER_MISMATCH,
    P2P_MISMATCH,
    RANK_DIED,
    RANK_FROZEN,
    STUCK_ALL_JOINED,
    Finding,
    RankAccount,
)
from comm2perfetto.diagnose.waits import (
    COLLECTIVE,
    CYCLE,
    NO_DATA,
    OPERATION,
    RANK,
    RECV,
    SEND,
    Graph,
    Op,
    Order,
    Root,
    Wait,
    explain,
)
from comm2perfetto.words import ranks_text

RANK_LEVEL = (RANK_DIED, RANK_FROZEN)


def wait_of(f: Finding, halted: frozenset[int] = frozenset()) -> Wait | None:
    """The wait a finding is about, or None (a rank-level or a resolved finding, nothing checked). ``halted``:
    ranks that died or froze: a collective they joined still waits for them."""
    if f.kind in RANK_LEVEL and f.seq is None and f.ranks_joined and f.op in (SEND, RECV, "send", "recv",
                                                                              "isend", "irecv"):
        # a send or receive the rank's death or freeze left waiting (the others blocked in it wait for it)
        (peer,) = f.culprit_ranks or f.ranks_missing or (None,)
        kind = SEND if f.op in ("send", "isend") else RECV
        return Wait(Op(f.group_uid, kind, None, f.op or kind, peer=peer), f.ranks_joined,
                    f.culprit_ranks or f.ranks_missing, ref=f)
    if f.resolved or (f.seq is None and f.kind != P2P_MISMATCH):
        return None
    if f.kind == P2P_MISMATCH:
        src, dst = f.evidence.get("src"), f.evidence.get("dst")
        if not isinstance(src, int) or not isinstance(dst, int):
            return None
        blocked = f.ranks_joined
        kind = SEND if blocked == (src,) else RECV
        op = Op(f.group_uid, kind, f.seq, f.op or kind, peer=dst if kind == SEND else src)
        return Wait(op, blocked, f.ranks_missing, ref=f)
    op = Op(f.group_uid, COLLECTIVE, f.seq, f.op or "")
    if f.kind in (MISSING_RANKS, NO_DUMP):
        return Wait(op, f.ranks_joined, f.ranks_missing, ref=f)
    if f.kind in RANK_LEVEL:
        return Wait(op, f.ranks_joined, f.culprit_ranks, ref=f)
    if f.kind == STUCK_ALL_JOINED:  # every member issued it: it waits for none, but one that died or froze
        return Wait(op, f.ranks_joined, tuple(r for r in f.ranks_joined if r in halted), ref=f)
    if f.kind in DESYNC_KINDS:  # a mismatch is a root of its own
        return Wait(op, f.ranks_joined, (), ref=f)
    return None


def arrange(findings: Sequence[Finding], states: Mapping[int, str], order: Order | None = None,
            halted: frozenset[int] = frozenset()) -> list[Finding]:
    """The findings, root causes first, each other finding about a wait ``blocked_by`` its root (see the
    module docstring). ``states``: what each rank is when blocked in none of the waits (``waits.OUTSIDE``,
    ``NO_DATA`` ...); ``order``: whether a rank's history puts one operation before another; ``halted``: ranks
    that died or froze."""
    items = list(findings)
    states = dict(states)
    for f in items:  # a rank a finding says nothing is known of (no data, a stale dump) is a suspect
        if f.kind == NO_DUMP:
            states.update({r: NO_DATA for r in f.ranks_missing})
    # Groups the ranks created in different orders: every wait in them follows from that, not from a rank.
    by_group = {uid: i for i, f in enumerate(items) if f.kind == GROUP_MISMATCH
                for uid in f.evidence.get("group_uids", ())}
    waits: dict[int, Wait] = {}
    in_conflict: list[tuple[int, int]] = []
    for i in sorted(range(len(items)), key=lambda i: (_t(items[i]), ORDER[items[i].kind])):
        w = wait_of(items[i], halted)
        if w is not None and items[i].group_uid in by_group and items[i].kind not in RANK_LEVEL:
            in_conflict.append((i, by_group[items[i].group_uid]))
        elif w is not None:
            waits[i] = replace(w, ref=i)
    graph = explain(states, list(waits.values()), order)
    told_by: list[int] = []  # per root of the graph: the index of the finding that tells it
    culprits: dict[int, set[int]] = {}
    suspects: dict[int, set[int]] = {}
    for root in graph.roots:
        i = _root_finding(root, items, graph)
        told_by.append(i)
        culprits.setdefault(i, set()).update(root.culprits)
        suspects.setdefault(i, set()).update(root.suspects if root.kind in (RANK, CYCLE) else ())
    roots: list[tuple[int, Finding]] = []
    blocked: list[tuple[int, int]] = list(in_conflict)  # (finding, finding of its root)
    for i, f in enumerate(items):
        if any(i == j for j, _ in in_conflict):
            continue
        if i in culprits:
            roots.append((i, _with_roots(f, culprits[i], suspects[i])))
        elif i in waits and (leads := graph.blocked_by(waits[i])):
            blocked.append((i, told_by[leads[0]]))
        elif f.kind == NO_DUMP:  # ranks without data, the wait on them (if any) told elsewhere
            roots.append((i, _with_roots(f, set(), set(f.culprit_ranks) | set(f.suspect_ranks))))
        else:
            roots.append((i, f))
    roots.sort(key=lambda item: _order_key(item[1]))
    number = {i: n for n, (i, _) in enumerate(roots, 1)}
    rest = [replace(items[i], culprit_ranks=(), suspect_ranks=(), blocked_by=number.get(r),
                    action=f"This wait follows from [{number.get(r)}]: act on that first.") for i, r in blocked]
    return [f for _, f in roots] + sorted(rest, key=_order_key)


def _t(f: Finding) -> int:
    return f.t_ns if f.t_ns is not None else 0


def _order_key(f: Finding) -> tuple:
    return (ORDER[f.kind], f.resolved, _t(f))


def _with_roots(f: Finding, culprits: set[int], suspects: set[int]) -> Finding:
    """A root finding with the root ranks the graph found in it; one about an operation (a mismatch, a stuck
    collective) or a rank that ended keeps the culprits its own rule chose."""
    if not culprits and not suspects:
        return f
    return replace(f, culprit_ranks=tuple(sorted(culprits)),
                   suspect_ranks=tuple(sorted(suspects | set(f.suspect_ranks))))


def _root_finding(root: Root, items: list[Finding], graph: Graph) -> int:
    """The index of the finding that tells a root (appending a new one for a cycle without a p2p to tell it)."""
    assert root.kind in (RANK, OPERATION, CYCLE)
    if root.kind == RANK:
        rank = (root.culprits or root.suspects)[0]
        own = next((i for i, f in enumerate(items) if f.kind in RANK_LEVEL and f.culprit_ranks == (rank,)), None)
        if own is not None:
            return own
    if root.kind in (RANK, OPERATION):
        assert root.wait is not None
        return int(root.wait.ref)
    if root.wait is not None and root.wait.op.kind in (SEND, RECV):  # a send or recv the deviating rank skipped
        i = int(root.wait.ref)
        items[i] = replace(items[i], detail=items[i].detail + _instead(root, items))
        return i
    items.append(_cycle_finding(root, items, graph))
    return len(items) - 1


def _instead(root: Root, items: Sequence[Finding]) -> str:
    out = ""
    for rank, (_skipped, went) in sorted(root.deviations.items()):
        f = items[int(went.ref)]
        out += f" Rank {rank} went on to {f.op} #{f.seq} on {f.process_group} instead, where it waits."
    return out


def _cycle_finding(root: Root, items: Sequence[Finding], graph: Graph) -> Finding:
    """Ranks that wait on each other: who deviates, and between which two operations."""
    cycle = root.waits_for
    inside = [w for w in graph.waits if set(w.blocked) & set(cycle) and set(w.waits_for) & set(cycle)]
    parts = []
    for w in inside:
        f = items[int(w.ref)]
        ranks = sorted(set(w.blocked) & set(cycle))
        parts.append(f"{ranks_text(ranks)} in {f.op} #{f.seq} on {f.process_group} "
                     f"waiting for {ranks_text(sorted(set(w.waits_for) & set(cycle)))}")
    detail = f"{ranks_text(list(cycle)).capitalize()} wait on each other: {'; '.join(parts)}."
    call_sites: dict[int, str] = {}
    stacks: dict[int, tuple[str, ...]] = {}
    went_to = {}
    for rank, (skipped, went) in sorted(root.deviations.items()):
        a, b = items[int(skipped.ref)], items[int(went.ref)]
        waiting = ranks_text(list(skipped.blocked))
        detail += (f" Rank {rank} issued {b.op} #{b.seq} on {b.process_group} before {a.op} #{a.seq} on "
                   f"{a.process_group}, which {waiting} {'wait' if len(skipped.blocked) > 1 else 'waits'} in for "
                   f"it: its own earlier steps issue {a.process_group}'s first.")
        went_to[str(rank)] = {"process_group": b.process_group, "seq": b.seq, "op": b.op}
        for f in (a, b):
            call_sites.update(f.call_sites)
            stacks.update({r: s for r, s in f.stacks.items() if r == rank})
    if root.culprits:
        first = items[int(root.deviations[root.culprits[0]][0].ref)]
        action = (f"Make {ranks_text(list(root.culprits))} issue {first.process_group}'s {first.op} #{first.seq} "
                  f"where the other ranks do: a rank that skips or reorders one group's collective deadlocks the "
                  "groups it shares with the others.")
    else:
        first = items[int(inside[0].ref)] if inside else items[0]
        detail += (" One of them issued these collectives in another order than its peers; no history of their "
                   "order tells which.")
        action = (f"Compare the order in which {ranks_text(list(cycle))} issue these collectives (the call sites "
                  "above): a rank that skips or reorders one group's collective deadlocks the groups it shares.")
    return Finding(
        kind=ORDER_MISMATCH, process_group=first.process_group, group_uid=first.group_uid, seq=first.seq,
        op=first.op, ranks_joined=tuple(sorted(set(first.ranks_joined))), ranks_missing=root.culprits,
        culprit_ranks=root.culprits, suspect_ranks=root.suspects, detail=detail, action=action,
        call_sites=call_sites, stacks=stacks, evidence={"cycle": list(cycle), "went_to": went_to},
        t_ns=min((_t(items[int(w.ref)]) for w in inside), default=None),
        basis="its own earlier steps issue these groups' collectives in the other order" if root.culprits
        else "the ranks wait on each other, and no history of their order tells which one deviates",
    )


def account(states: Mapping[int, str], findings: Sequence[Finding]) -> dict[int, RankAccount]:
    """Where every rank stood (``RankAccount``): blocked in the operation an unresolved finding has it join, a
    victim of one, or its state (``states``: outside, exited, dead, frozen, no data), with the operation others
    awaited it in. Every rank of ``states`` and of the findings gets one."""
    out: dict[int, RankAccount] = {}
    awaited: dict[int, str] = {}
    for f in findings:
        if f.resolved:
            continue
        where = _where(f)
        for r in f.victim_ranks:
            out.setdefault(r, RankAccount("victim", where))
        for r in f.ranks_missing:
            awaited.setdefault(r, where)
        if f.kind not in RANK_LEVEL:
            for r in f.ranks_joined:
                if r not in f.victim_ranks:
                    out.setdefault(r, RankAccount("blocked", where))
    for f in findings:  # a rank told by its own finding (died, frozen) is that, wherever it was
        if not f.resolved and f.kind in RANK_LEVEL:
            for r in f.culprit_ranks:
                out[r] = RankAccount("dead" if f.kind == RANK_DIED else "frozen", awaited.get(r, ""))
    for r in sorted(set(states) | set(awaited)):
        if r not in out:
            out[r] = RankAccount(states.get(r, NO_DATA), f"awaited in {awaited[r]}" if r in awaited else "")
    return dict(sorted(out.items()))


def _where(f: Finding) -> str:
    if f.op and f.seq is not None:
        return f"{f.op} #{f.seq}" + (f" on {f.process_group}" if f.process_group else "")
    return f.op or ""
