"""The job-wide wait-for graph: which rank waits for which, and the ranks nobody's wait explains. No torch.

Every rank has a position (``Position``): the operations it is blocked in (a collective on group G at sequence s;
a send to or a recv from peer P on G, a batch counting one operation per peer), or none, with the reason:
outside any communication, exited, dead, frozen, no data. A blocked rank waits for the ranks of its operation
that have not reached it (``Wait``). Following the waits (``explain``):

- a rank waited for that is blocked in nothing (outside, exited, dead, frozen, no data) is a **root**: nobody's
  wait explains it (a rank known to be blocked in an operation none of the waits describes is a suspect);
- an operation every member reached that still did not complete (a mismatch, a broken network) is a root;
- ranks that wait on each other in a **cycle** are a root: some rank's order of operations deviates (it issued one
  group's operation before another's that its peers, and its own earlier steps, put first). ``order`` says
  whether a rank's history puts one operation before another; without history, a rank blocked in a send or
  recv is taken as waiting and the peer that went on to a collective instead as the one that deviates.

Every other wait is blocked by the roots it leads to. diagnose builds the waits from the dumps and logs after
the fact, the live verdict from the positions every rank reported at the stall (``waits_of``): one graph code,
so the two cannot disagree. Hand-built example (rank 3 skipped all_reduce #5 of group tp = [2, 3] and went on to
dp = [1, 3] and the default group's #5, where rank 1 also waits; rank 2 waits in tp #5 for rank 3, rank 0 in
its dp = [0, 2] #5 for rank 2)::

    >>> tp5, dp5 = Op("tp", COLLECTIVE, 5, "all_reduce"), Op("dp", COLLECTIVE, 5, "all_reduce")
    >>> dflt5 = Op("0", COLLECTIVE, 5, "all_reduce")
    >>> waits = [Wait(tp5, (2,), (3,)), Wait(dp5, (0,), (2,)), Wait(dflt5, (1, 3), (0, 2))]
    >>> g = explain({}, waits, order=lambda rank, first, then: first.group == "tp")
    >>> [(r.kind, r.culprits, r.waits_for) for r in g.roots]
    [('cycle', (3,), (0, 2, 3))]
    >>> g.blocked_by(waits[2])
    [0]
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# Where a rank is (Position.state).
BLOCKED = "blocked"  # in one or more operations
OUTSIDE = "outside"  # running, outside any communication (computing, loading data, in another library)
EXITED = "exited"  # its process ended cleanly
DEAD = "dead"  # its process ended first: killed, crashed, an uncaught exception
FROZEN = "frozen"  # its process existed but made no progress (stopped, or holding the GIL)
NO_DATA = "no_data"  # nothing known: no dump, no log, no answer; a suspect, never a culprit by guess

# What a rank is blocked in (Op.kind).
COLLECTIVE, SEND, RECV = "collective", "send", "recv"

# Kinds of roots (Root.kind).
RANK, OPERATION, CYCLE = "rank", "operation", "cycle"


@dataclass(frozen=True, slots=True)
class Op:
    """An operation a rank is blocked in. ``seq``: a collective's sequence number on ``group``; for a send or
    recv, its p2p sequence number where known. ``peer``: the other side of a send or recv (global rank)."""

    group: str
    kind: str
    seq: int | None
    name: str = ""
    peer: int | None = None


@dataclass(frozen=True, slots=True)
class Wait:
    """Ranks blocked in one operation, and the ranks it waits for: members that have not reached it, or reached
    it and make no progress (frozen, dead). ``ref``: what the caller knows it by (a finding)."""

    op: Op
    blocked: tuple[int, ...]
    waits_for: tuple[int, ...]
    ref: Any = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class Position:
    """Where one rank is: ``state``, the operations it is blocked in (``ops``; a send or recv's ``seq`` is its
    1-based index among the rank's ops of that kind to that peer), and per group how many collectives it has
    issued (``issued``; a group missing: not known), the recent ones with their issue times (``recent``: group ->
    ((seq, t_ns), ...), oldest first) for ``order``, and how many sends and recvs it issued per peer
    (``p2p_issued``: (group, "send"/"recv", peer) -> count)."""

    rank: int
    state: str
    ops: tuple[Op, ...] = ()
    issued: Mapping[str, int] = field(default_factory=dict)
    recent: Mapping[str, Sequence[tuple[int, int]]] = field(default_factory=dict)
    p2p_issued: Mapping[tuple[str, str, int], int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Root:
    """What nobody's wait explains.

    - ``rank``: a rank waited for and blocked in nothing (``culprits`` or, for a rank without data, ``suspects``);
      ``wait``: the first wait for it;
    - ``operation``: a wait every member reached (``wait``); no culprit from the graph;
    - ``cycle``: ranks waiting on each other (``waits_for``: the cycle's ranks); ``culprits`` deviate: each
      issued ``went_to`` although its history puts ``wait``'s operation first (``deviations``). Undecided:
      no culprit, the cycle's ranks suspects.
    """

    kind: str
    culprits: tuple[int, ...]
    waits_for: tuple[int, ...] = ()
    suspects: tuple[int, ...] = ()
    wait: Wait | None = None
    deviations: Mapping[int, tuple[Wait, Wait]] = field(default_factory=dict)


Order = Callable[[int, Op, Op], "bool | None"]


@dataclass(frozen=True)
class Graph:
    """The waits, the ranks' states and the roots; ``blocked_by(wait)`` says which roots a wait leads to.
    ``blocked_in``: the waits each rank is blocked in (the graph is ranks -> their waits -> the ranks those wait
    for: linear in the waits' sizes, however many ranks wait for however many)."""

    states: Mapping[int, str]
    waits: tuple[Wait, ...]
    roots: tuple[Root, ...]
    blocked_in: Mapping[int, tuple[Wait, ...]]

    def blocked_by(self, wait: Wait) -> list[int]:
        """Indices (into ``roots``) of the roots this wait leads to, nearest first: following the waits from the
        ranks it waits for, a rank that is a root, a rank of a cycle, a rank blocked in an operation that is one."""
        out: list[int] = []
        seen: set[int] = set()
        todo = deque(wait.waits_for)
        while todo:
            rank = todo.popleft()
            if rank in seen:
                continue
            seen.add(rank)
            for i, root in enumerate(self.roots):
                if i not in out and _leads_to(root, rank):
                    out.append(i)
            for w in self.blocked_in.get(rank, ()):
                todo.extend(w.waits_for)
        return out


def _leads_to(root: Root, rank: int) -> bool:
    if root.kind == RANK:
        return rank in root.culprits or rank in root.suspects
    if root.kind == CYCLE:
        return rank in root.waits_for
    return root.wait is not None and rank in root.wait.blocked


def explain(states: Mapping[int, str], waits: Sequence[Wait], order: Order | None = None) -> Graph:
    """The graph of ``waits`` (earliest first: the first wait for a rank is the one its root is told with).
    ``states``: the state of ranks blocked in none of the waits (a rank missing: ``NO_DATA``, nothing known)."""
    blocked_in: dict[int, list[Wait]] = {}
    for w in waits:
        for b in w.blocked:
            blocked_in.setdefault(b, []).append(w)
    all_states = {r: BLOCKED for r in blocked_in}
    all_states.update({r: s for r, s in states.items() if r not in blocked_in})
    roots: list[Root] = []
    named: set[int] = set()
    for w in waits:
        for m in w.waits_for:
            if m in blocked_in or m in named:
                continue
            named.add(m)
            state = all_states.get(m, NO_DATA)
            if state in (NO_DATA, BLOCKED):  # no data; or blocked in an operation nothing here describes
                roots.append(Root(RANK, (), suspects=(m,), wait=w))
            else:
                roots.append(Root(RANK, (m,), wait=w))
    for w in waits:
        if not w.waits_for:
            roots.append(Root(OPERATION, (), wait=w))
    for cycle in _cycles(blocked_in):
        roots.append(_cycle_root(cycle, blocked_in, order))
    return Graph(states=all_states, waits=tuple(waits), roots=tuple(roots),
                 blocked_in={r: tuple(ws) for r, ws in blocked_in.items()})


def _cycles(blocked_in: Mapping[int, Sequence[Wait]]) -> list[tuple[int, ...]]:
    """Sets of more than one rank that wait on each other: the strongly connected components (Tarjan's
    algorithm, iterative) of the graph of ranks and waits (a rank leads to the waits it is blocked in, a wait to
    the ranks it waits for), their ranks sorted, in the order of their lowest rank."""
    waits = {id(w): w for ws in blocked_in.values() for w in ws}

    def successors(node: tuple[str, int]) -> Sequence[tuple[str, int]]:
        kind, key = node
        if kind == "r":
            return [("w", id(w)) for w in blocked_in.get(key, ())]
        w = waits[key]
        return [("r", m) for m in w.waits_for if m in blocked_in]  # a rank blocked in nothing ends a path

    index: dict[tuple[str, int], int] = {}
    low: dict[tuple[str, int], int] = {}
    on_stack: set[tuple[str, int]] = set()
    stack: list[tuple[str, int]] = []
    out: list[tuple[int, ...]] = []
    for start in sorted(blocked_in):
        if ("r", start) in index:
            continue
        work: list[tuple[tuple[str, int], int]] = [(("r", start), 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            nexts = successors(node)
            recurse = False
            while i < len(nexts):
                m = nexts[i]
                i += 1
                if m not in index:
                    work.append((node, i))
                    work.append((m, 0))
                    recurse = True
                    break
                if m in on_stack:
                    low[node] = min(low[node], index[m])
            if recurse:
                continue
            if low[node] == index[node]:
                ranks = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    if m[0] == "r":
                        ranks.append(m[1])
                    if m == node:
                        break
                if len(ranks) > 1:
                    out.append(tuple(sorted(ranks)))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return sorted(out)


def _cycle_root(cycle: tuple[int, ...], blocked_in: Mapping[int, Sequence[Wait]], order: Order | None) -> Root:
    """Which ranks of a cycle deviate. For each wait of rank r on rank n inside the cycle, n is blocked in
    operations of its own although it has not reached r's: n deviates when its history puts r's operation
    first. Without an answer from history, a rank blocked in a send or recv waits, and the peer it waits for,
    blocked in a collective instead, deviates."""
    members = set(cycle)
    inside = {id(w): w for r in cycle for w in blocked_in.get(r, ())}  # each wait once, however many wait in it
    pairs = [(n, w) for w in inside.values() for n in w.waits_for if n in members]
    deviations: dict[int, tuple[Wait, Wait]] = {}
    if order is not None:
        for n, w in pairs:
            if n in deviations:
                continue
            went = next((x for x in blocked_in[n] if order(n, w.op, x.op) is True), None)
            if went is not None:
                deviations[n] = (w, went)
    if not deviations:
        for n, w in pairs:
            if n not in deviations and w.op.kind in (SEND, RECV):
                instead = next((x for x in blocked_in[n] if x.op.kind == COLLECTIVE), None)
                if instead is not None:
                    deviations[n] = (w, instead)
    culprits = tuple(sorted(deviations))
    return Root(CYCLE, culprits, waits_for=cycle, suspects=() if culprits else cycle,
                wait=deviations[culprits[0]][0] if culprits else None, deviations=deviations)


# --- what the waits are, from positions (the live verdict) -----------------------------------------------


def waits_of(positions: Mapping[int, Position], members: Mapping[str, Sequence[int]]) -> list[Wait]:
    """The waits of ranks' positions. A member reached a collective when it is blocked in it or has issued it
    (``issued``); a rank without a position, or whose counter is short of it, is waited for, and so is a frozen
    or dead member that reached it; a member whose counter is not known is not (no evidence). A send is
    reached when the peer is blocked in the matching recv, and the reverse."""
    by_key: dict[tuple, list[tuple[int, Op]]] = {}
    for rank, pos in sorted(positions.items()):
        for op in pos.ops:
            by_key.setdefault(_key(rank, op), []).append((rank, op))
    out: list[Wait] = []
    for key, holders in by_key.items():
        op = holders[0][1]
        blocked = tuple(r for r, _ in holders)
        if op.kind == COLLECTIVE:
            group = members.get(op.group, ())
            waiting_for = [m for m in group if m not in blocked and not _issued(positions.get(m), op)]
            waiting_for += [m for m in group if m not in blocked and m not in waiting_for
                            and (p := positions.get(m)) is not None and p.state in (FROZEN, DEAD)]
        else:  # both sides hold the same key when both are blocked in the transfer: it is matched
            src, dst = key[2], key[3]
            peer = dst if op.kind == SEND else src
            if peer is None or (peer not in blocked and _posted(positions.get(peer), op, holders[0][0])):
                continue  # the other side issued its part: done, or moving (gloo's unwaited works stay "pending")
            waiting_for = [r for r in (src, dst) if r not in blocked]
        out.append(Wait(op, blocked, tuple(sorted(waiting_for))))
    return out


def _key(rank: int, op: Op) -> tuple:
    if op.kind == COLLECTIVE:
        return (op.group, COLLECTIVE, op.seq)
    src, dst = (rank, op.peer) if op.kind == SEND else (op.peer, rank)
    return (op.group, "p2p", src, dst, op.seq)


def _posted(peer: Position | None, op: Op, rank: int) -> bool:
    """The peer issued its side of ``rank``'s send or recv (the i-th send from A to B pairs with B's i-th recv
    from A): by its counts, or by a matching op it is in with a later index."""
    if peer is None or op.seq is None:
        return False
    other = RECV if op.kind == SEND else SEND
    if peer.p2p_issued.get((op.group, other, rank), 0) >= op.seq:
        return True
    return any(o.kind == other and o.peer == rank and o.group == op.group and o.seq is not None and o.seq >= op.seq
               for o in peer.ops)


def _issued(pos: Position | None, op: Op) -> bool:
    """The rank is not known to be short of this collective: it issued it, or its counter is not known (no
    evidence either way). A rank without a position is waited for (no data)."""
    if pos is None:
        return False
    n = pos.issued.get(op.group)
    return n is None or op.seq is None or n >= op.seq


# --- order history ----------------------------------------------------------------------------------------


def precedes(first: Sequence[tuple[int, int]], then: Sequence[tuple[int, int]], first_seq: int,
             then_seq: int) -> bool | None:
    """On one rank, should collective ``first_seq`` of one group come before ``then_seq`` of another, going by
    the rank's own history? ``first`` and ``then``: the rank's (seq, issue time) on each group, any order.

    How many of the first group's collectives the rank had issued before the other group's previous one
    (``then_seq - 1``), plus how many came between the two before that (the program's period), is how many
    should come before ``then_seq``; None without that much history.

    >>> tp = [(s, 10 * s) for s in range(1, 6)]            # tp #1..#5 at 10, 20 .. 50
    >>> dflt = [(s, 10 * s + 5) for s in range(1, 5)]      # default #1..#4 right after each tp
    >>> precedes(tp, dflt + [(5, 41)], 5, 5)              # default #5 came before tp #5: tp #5 belonged first
    True
    >>> precedes(dflt, tp, 5, 5)                           # tp #5 before default #5 is the program's order
    False
    """
    times = sorted(t for _, t in first)
    seqs_by_time = sorted(first, key=lambda st: st[1])
    then_t = dict(then)
    prev, before = then_t.get(then_seq - 1), then_t.get(then_seq - 2)
    if prev is None or before is None or not first:
        return None

    def count_before(t: int) -> int:
        i = bisect.bisect_left(times, t)
        return seqs_by_time[i - 1][0] if i else _lowest_known(seqs_by_time)

    c_prev, c_before = count_before(prev), count_before(before)
    if c_before < 0:
        return None  # the history starts after it: nothing to count from
    expected = c_prev + (c_prev - c_before)
    return expected >= first_seq


def _lowest_known(seqs_by_time: Sequence[tuple[int, int]]) -> int:
    """Before the first collective the history holds: the one before it, if it is the group's first."""
    first_seq = seqs_by_time[0][0]
    return first_seq - 1 if first_seq <= 1 else -1


def recent_order(positions: Mapping[int, Position]) -> Order:
    """``Order`` from the recent issues each position carries (``Position.recent``)."""
    def order(rank: int, first: Op, then: Op) -> bool | None:
        pos = positions.get(rank)
        if pos is None or first.kind != COLLECTIVE or then.kind != COLLECTIVE or first.seq is None \
                or then.seq is None:
            return None
        return precedes(pos.recent.get(first.group, ()), pos.recent.get(then.group, ()), first.seq, then.seq)

    return order


def recent_by_group(issues: Iterable[tuple[str, int, int]], keep: int = 8) -> dict[str, list[tuple[int, int]]]:
    """(group, seq, t_ns) issues -> per group its last ``keep`` (seq, t_ns), oldest first."""
    out: dict[str, list[tuple[int, int]]] = {}
    for group, seq, t in issues:
        out.setdefault(group, []).append((seq, t))
    return {g: sorted(v, key=lambda st: st[1])[-keep:] for g, v in out.items()}
