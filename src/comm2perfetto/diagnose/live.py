"""The live verdict: who a stalled job waits for, from every rank's position gathered at the stall.

A pure function over a live snapshot (written by record/live.py while the job hangs; the raw format is shown
in sources/live.py), returning the same ``Diagnosis`` and ``Finding`` kinds as ``diagnose`` and arranged by
the same wait-for graph (``waits``, ``roots``), so that both speak alike and cannot disagree. Each rank's
position is the collective it waits in per group, the sends and receives it is inside (a batch: one per peer),
and how many collectives it has issued per group, with the elements it passed to the one it waits in and to
its recent ones (Python-issued calls only). It sees less than ``diagnose`` (a short history, no call sites to
compare), so it only says what positions prove:

- a member whose group counter shows it has not issued the collective others wait in: ``missing_ranks``;
- members at one sequence number with different ops, roots, element counts or dtypes, waiting in it or gone
  past it while the others wait: ``op_mismatch`` (``root_mismatch``, ``size_mismatch``, ``dtype_mismatch``),
  every one of them a suspect, no culprit (no history tells which side is wrong);
- every member waiting: ``stuck_all_joined``, the last to arrive told, no culprit;
- a send or recv whose peer is not in the matching one: ``p2p_mismatch``;
- ranks waiting on each other across groups: ``order_mismatch`` (from the order of each rank's recent
  collectives), or the rank that went on to a collective instead of the send or recv its peer waits in;
- a rank that did not answer the gather: a suspect (``no_dump``), unless `record` saw its process alive:
  then it is frozen (``rank_frozen``), the culprit.

Only root causes are culprits; every other stalled operation is ``blocked_by`` the finding of its root.
Never imports torch.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from comm2perfetto.diagnose.findings import (
    DTYPE_MISMATCH,
    MISSING_RANKS,
    NO_DUMP,
    OP_MISMATCH,
    P2P_MISMATCH,
    RANK_FROZEN,
    ROOT_MISMATCH,
    SIZE_MISMATCH,
    STUCK_ALL_JOINED,
    Diagnosis,
    Finding,
)
from comm2perfetto.diagnose.groups import conflict_uids, group_mismatch
from comm2perfetto.diagnose.roots import account, arrange
from comm2perfetto.diagnose.verdict import conclude, unexplained_stall
from comm2perfetto.diagnose.waits import (
    BLOCKED,
    COLLECTIVE,
    FROZEN,
    NO_DATA,
    OUTSIDE,
    RECV,
    SEND,
    Op,
    Position,
    Wait,
    recent_order,
    waits_of,
)
from comm2perfetto.group_names import conflicts as group_conflicts
from comm2perfetto.model import ClockAlignment
from comm2perfetto.words import duration, ranks_text

__all__ = ["live_diagnosis"]

SENDS = ("send", "isend")
NOTE = ("a live verdict, from each rank's position at the stall; `comm2perfetto diagnose` on the folder "
        "afterwards gives the full picture")


def live_diagnosis(snapshot: Mapping[str, Any], probes: Mapping[int, Mapping[str, Any]] | None = None) -> Diagnosis:
    """The verdict of one stall snapshot (``.live/stall.<gen>.json``, as ``sources.live.read_snapshot`` checked
    it). ``probes``: the ranks that did not answer whose process `record` found alive and making no progress
    (frozen), by rank: ``{"state": "stopped", "detail": "stopped (SIGSTOP, process state T)", ...}``.

    It is a verdict at a stall, so it is never OK: a stall nothing here explains is ``stall_unexplained``."""
    ranks = {s["rank"]: s for s in snapshot["ranks"]}
    world = snapshot["world_size"]
    groups = _groups(ranks, world)
    members = {name: tuple(m) for name, _, m in groups}
    labels = {name: label for name, label, _ in groups}
    positions = {r: _position(r, s, members) for r, s in ranks.items()}
    silent = sorted(set(range(world)) - set(ranks)) if world else []
    frozen = {r: probes[r] for r in silent if probes and r in probes}
    states = {r: FROZEN if r in frozen else NO_DATA for r in silent}
    states.update({r: p.state for r, p in positions.items()})
    findings: list[Finding] = []
    conflicts = group_conflicts((r, name, str(g.get("desc") or ""), g.get("ranks") or members.get(name, ()))
                                for r, s in ranks.items() for name, g in (s.get("groups") or {}).items())
    if conflicts:
        findings.append(group_mismatch(conflicts, conflict_uids(conflicts, {n: (n, m) for n, m in members.items()})))
    for w in waits_of(positions, members):
        f = _unknown(w, members, positions, labels, ranks) or _finding(w, labels, ranks, set(silent))
        if f is not None:
            findings.append(f)
    findings = _fold_frozen(findings, frozen)
    waited_for = {r for f in findings for r in f.ranks_missing}
    absent = [r for r in silent if r not in frozen and r not in waited_for]
    if absent:
        findings.append(_silent(absent, world))
    findings = arrange(findings, states, order=recent_order(positions), halted=frozenset(frozen))
    status, findings = conclude(findings, stall=_stall(positions, labels))
    return Diagnosis(
        status=status, world_size=world, ranks_with_data=tuple(sorted(ranks)),
        findings=tuple(findings), skipped=(), notes=(NOTE,), clock=ClockAlignment(),
        groups_checked=tuple(name for name, _, _ in groups), ranks=account(states, findings),
    )


def _stall(positions: Mapping[int, Position], labels: Mapping[str, str]) -> Finding:
    """The stall itself, told when nothing else explains it: the ranks blocked, and where."""
    blocked = [(r, op) for r, pos in sorted(positions.items()) for op in pos.ops]
    if not blocked:
        return unexplained_stall([], "", "", None, None, None,
                                 known="At the gather no rank was inside a collective or a send or recv that the "
                                       "recorder saw: the stalled operation finished, or is one the patch layer "
                                       "does not see and Flight Recorder had not shown yet.")
    first = blocked[0][1]
    waiting = [r for r, op in blocked if op == first]
    return unexplained_stall(waiting, labels.get(first.group, first.group), first.group, first.name, first.seq,
                             None)


def _position(rank: int, summary: Mapping[str, Any], members: Mapping[str, Sequence[int]]) -> Position:
    """Where one rank is. A rank that listed every group it has (``groups_complete``) and lists none of a group
    it is a member of has issued nothing there (it has not created it yet)."""
    ops: list[Op] = []
    issued: dict[str, int] = {}
    recent: dict[str, list[tuple[int, int]]] = {}
    p2p_issued: dict[tuple[str, str, int], int] = {}
    reported = summary.get("groups") or {}
    for name, g in reported.items():
        if g.get("issued") is not None:
            issued[name] = g["issued"]
        p = g.get("pending")
        if p is not None:
            ops.append(Op(name, COLLECTIVE, p["seq"], p["op"]))
        for q in g.get("p2p") or ():
            ops.append(Op(name, SEND if q["op"] in SENDS else RECV, q.get("n"), q["op"], peer=q["peer"]))
        if g.get("recent"):
            recent[name] = [(x[0], x[1]) for x in g["recent"]]
        for kind, peer, n in g.get("p2p_issued") or ():
            p2p_issued[(name, SEND if kind in SENDS else RECV, peer)] = n
    if summary.get("groups_complete"):
        for name, ranks in members.items():
            if name not in reported and rank in ranks:
                issued[name] = 0
    return Position(rank, BLOCKED if ops else OUTSIDE, tuple(ops), issued, recent, p2p_issued)


def _groups(ranks: Mapping[int, dict], world: int | None) -> list[tuple[str, str, list[int]]]:
    """(name, label, member ranks) of every group some rank reported, default group first. The label is the
    description; where two names share one (ranks that created their groups in different orders), the name
    too: ``X (group 2)``."""
    seen: dict[str, tuple[str, list[int]]] = {}
    descs: dict[str, Counter[str]] = {}  # per name, how many ranks gave it each description
    for summary in ranks.values():
        for name, g in (summary.get("groups") or {}).items():
            members = [r for r in g.get("ranks") or () if isinstance(r, int)]
            desc = _description(g)
            if desc:
                descs.setdefault(name, Counter())[desc] += 1
            if name not in seen or len(members) > len(seen[name][1]):
                seen[name] = (desc or seen.get(name, ("", []))[0], members)
    out = []
    for name, (desc, members) in seen.items():
        if not members and name == "0" and world:
            members = list(range(world))
        out.append((name, desc, sorted(set(members))))
    # Groups of one description and other members go by it (DeviceMesh's mesh_tp of ranks 0, 1 and of 2, 3);
    # of one description and the same members, only their name tells them apart.
    shared = Counter((desc, tuple(m)) for _, desc, m in out if desc)

    def label(name: str, desc: str, members: list[int]) -> str:
        told = descs.get(name, Counter())
        if len(told) > 1:  # the ranks describe this group differently: they created their groups in other orders
            return f"group {name} ({'/'.join(d for d, _ in told.most_common())})"
        return f"{desc} (group {name})" if shared[(desc, tuple(members))] > 1 else (desc or name)

    out = [(name, label(name, desc, m), m) for name, desc, m in out]
    return sorted(out, key=lambda g: (0, int(g[0])) if g[0].isdigit() else (1, g[0]))


def _unknown(w: Wait, members: Mapping[str, Sequence[int]], positions: Mapping[int, Position],
             labels: Mapping[str, str], ranks: Mapping[int, dict]) -> Finding | None:
    """A collective nobody is known to be missing from, with members that answered but whose count of issued
    collectives there is not known: they are suspects (nothing says whether they issued it), never "fine"."""
    if w.op.kind != COLLECTIVE or w.waits_for:
        return None
    unknown = [m for m in members.get(w.op.group, ()) if m not in w.blocked and m in positions
               and w.op.group not in positions[m].issued]
    if not unknown:
        return None
    waiting = [r for r in w.blocked if r in ranks]
    times = [t for r in waiting if (t := _since(ranks, r, w.op)) is not None]
    label = labels.get(w.op.group, w.op.group)
    detail = (f"{ranks_text(waiting)} {'are' if len(waiting) > 1 else 'is'} waiting in {w.op.name} #{w.op.seq} on "
              f"{label}; {ranks_text(unknown)} answered the gather but without a count of the collectives "
              f"{'they' if len(unknown) > 1 else 'it'} issued on {label}, so whether "
              f"{'they' if len(unknown) > 1 else 'it'} issued this one cannot be told.")
    return Finding(kind=NO_DUMP, process_group=label, group_uid=w.op.group, seq=w.op.seq, op=w.op.name,
                   ranks_joined=tuple(waiting), ranks_missing=tuple(unknown), culprit_ranks=(),
                   suspect_ranks=tuple(unknown), detail=detail,
                   action=f"Look at {ranks_text(unknown)} first (py-spy dump of its process).",
                   t_ns=min(times) if times else None, basis="no count of its collectives on this group")


def _since(ranks: Mapping[int, dict], rank: int, op: Op) -> int | None:
    g = (ranks[rank].get("groups") or {}).get(op.group) or {}
    if op.kind == COLLECTIVE:
        p = g.get("pending")
        return p["since_ns"] if p else None
    return next((q["since_ns"] for q in g.get("p2p") or () if q["peer"] == op.peer), None)


def _finding(w: Wait, labels: Mapping[str, str], ranks: Mapping[int, dict], silent: set[int]) -> Finding | None:
    """The finding of one wait, before the graph says which ones are roots."""
    op = w.op
    label = labels.get(op.group, op.group)
    waiting = [r for r in w.blocked if r in ranks]
    times = [t for r in waiting if (t := _since(ranks, r, op)) is not None]
    common: dict[str, Any] = dict(process_group=label, group_uid=op.group, seq=op.seq,
                                  t_ns=min(times) if times else None)
    if op.kind != COLLECTIVE:
        if not w.waits_for:
            return None  # both sides inside the transfer: data is moving, or will be told by a collective
        return _p2p(common, w, ranks)
    ops = Counter(_pending_op(ranks, r, op.group) for r in waiting)
    name = ops.most_common(1)[0][0]
    common["op"] = name
    calls = {r: _passed(ranks, r, op.group) for r in waiting}
    if _differs(set(calls.values())) is not None:
        return _op_mismatch(common, calls, ranks)
    if not w.waits_for:
        # members that went past the collective the others hang in: what they passed to it, where known
        passers = _passed_on(ranks, op, waiting)
        if passers and _differs(set(calls.values()) | set(passers.values())) is not None:
            return _op_mismatch(common, {**calls, **passers}, ranks, went_on=sorted(passers))
        return _stuck(common, waiting, ranks)
    if set(w.waits_for) <= silent:
        return _waiting_for_silent(common, waiting, list(w.waits_for))
    return _missing(common, waiting, list(w.waits_for), ranks, silent)


def _pending_op(ranks: Mapping[int, dict], rank: int, group: str) -> str:
    return str(ranks[rank]["groups"][group]["pending"]["op"])


# Collectives whose ranks must pass the same number of elements (the all-to-all, gather, scatter and object
# families may differ between ranks; the recorder gives no sizes for those here).
_SAME_SIZE = frozenset({"all_reduce", "broadcast", "reduce", "all_gather_into_tensor", "all_gather",
                        "reduce_scatter_tensor"})


def _passed_on(ranks: Mapping[int, dict], op: Op, waiting: list[int]) -> dict[int, tuple]:
    """The members of ``op``'s group not waiting in it that issued it and went on, with what they passed to it
    (``_passed``'s tuple, from their recent collectives), where known."""
    out = {}
    for r, summary in ranks.items():
        g = (summary.get("groups") or {}).get(op.group)
        if r in waiting or g is None:
            continue
        for seq, name, numel in g.get("passed") or ():
            if seq == op.seq:
                out[r] = (name, None, numel if name in _SAME_SIZE else None, None)
    return out


def _passed(ranks: Mapping[int, dict], rank: int, group: str) -> tuple:
    """What a waiting rank asked of its collective, as far as the positions tell: (op, root, elements, dtypes);
    None where not known (Flight Recorder's pending entries carry no sizes)."""
    pending = ranks[rank]["groups"][group]["pending"]
    op = str(pending["op"])
    numel = pending.get("numel") if op in _SAME_SIZE else None
    dtypes = tuple(pending.get("dtypes") or ()) or None
    return op, _root(ranks, rank, group), numel, dtypes


def _missing(common: dict, waiting: list[int], missing: list[int], ranks: Mapping[int, dict],
             silent: set[int]) -> Finding:
    op, seq, label, name = common["op"], common["seq"], common["process_group"], common["group_uid"]
    sites = _sites(ranks, waiting[:2])
    doing = []
    for r in missing[:4]:
        if r in silent:
            doing.append(f"Rank {r} did not answer the live gather.")
            continue
        g = ranks[r]["groups"].get(name) or {}
        issued = g.get("issued")
        last = f"Rank {r}'s last collective on {label} was #{issued}" if issued else \
            f"Rank {r} had issued no collective on {label}"
        elsewhere = _blocked_elsewhere(ranks[r], name)
        stack = ranks[r].get("stack")
        doing.append(last + (f"; {elsewhere}" if elsewhere else "") + (f"; it was at {stack[0]}." if stack else "."))
    detail = (f"{ranks_text(missing)} had not issued {op} #{seq} on {label} when the stall was detected while "
              f"{ranks_text(waiting)} {'were' if len(waiting) > 1 else 'was'} waiting in it"
              + (f" (rank {next(iter(sites))} called it at {next(iter(sites.values()))})" if sites else "")
              + ". " + " ".join(doing))
    action = (f"Look at what {ranks_text(missing)} {'were' if len(missing) > 1 else 'was'} doing instead (its "
              f"stack above): a rank that skips or delays a collective the others issue hangs the group.")
    culprits = tuple(r for r in missing if r not in silent)
    return Finding(kind=MISSING_RANKS, ranks_joined=tuple(waiting), ranks_missing=tuple(missing),
                   culprit_ranks=culprits, suspect_ranks=tuple(r for r in missing if r in silent), detail=detail,
                   action=action, call_sites=sites, stacks=_stacks(ranks, culprits),
                   basis=f"its count of collectives on {label} is short of #{seq}", **common)


def _description(group: Mapping[str, Any]) -> str:
    """A group's description as a rank reported it, or "" where torch gave none (2.4 reports ``undefined`` for
    groups made without one, DeviceMesh's included): the group then goes by its name, as model.Group.label."""
    desc = str(group.get("desc") or "")
    return "" if desc == "undefined" else desc


def _blocked_elsewhere(summary: Mapping[str, Any], group: str) -> str:
    """``it was waiting in all_reduce #5 on 2`` when the rank is blocked in another group's operation."""
    for name, g in (summary.get("groups") or {}).items():
        if name == group:
            continue
        p = g.get("pending")
        if p is not None:
            return f"it was waiting in {p['op']} #{p['seq']} on {_description(g) or name}"
        for q in g.get("p2p") or ():
            return f"it was inside {q['op']} {'to' if q['op'] in SENDS else 'from'} rank {q['peer']}"
    return ""


def _root(ranks: Mapping[int, dict], rank: int, group: str) -> int | None:
    root = ranks[rank]["groups"][group]["pending"].get("root")
    return root if isinstance(root, int) else None


def _differs(calls: set[tuple]) -> int | None:
    """Which part of ``_passed`` the ranks' calls differ in first (op, root, elements, dtypes), where known."""
    return next((i for i in range(4) if len({c[i] for c in calls} - {None}) > 1), None)


def _op_mismatch(common: dict, calls: Mapping[int, tuple], ranks: Mapping[int, dict],
                 went_on: Sequence[int] = ()) -> Finding:
    """Ranks at one sequence number with different ops, roots, element counts or dtypes (``calls``: each rank's
    ``_passed``), waiting in it or, ``went_on``, past it while the others wait (gloo lets the rank with the
    smaller buffer finish). Positions carry no history of what each rank issued before, so nothing shows which
    side is wrong: every such rank is a suspect, none a culprit."""
    waiting = sorted(calls)
    by_call: dict[tuple, list[int]] = {}
    for r in waiting:
        by_call.setdefault(calls[r], []).append(r)
    clusters = sorted(by_call.items(), key=lambda kv: (-len(kv[1]), min(kv[1])))
    suspects = sorted(waiting)  # no vote: two faulty ranks would outvote a sound one
    kind, what, same = [(OP_MISMATCH, "different collectives", "collective"),
                        (ROOT_MISMATCH, "different roots (src/dst)", "root"),
                        (SIZE_MISMATCH, "different sizes", "tensor size"),
                        (DTYPE_MISMATCH, "different dtypes", "tensor dtype")][_differs(set(by_call)) or 0]

    def told(call: tuple) -> str:
        op, root, numel, dtypes = call
        return op + (f" root {root}" if root is not None else "") + (f" {numel:,} elements" if numel is not None
                                                                     else "") + (f" {'/'.join(dtypes)}"
                                                                                 if dtypes else "")

    described = "; ".join(f"{ranks_text(rs)}: {told(call)}" for call, rs in clusters)
    detail = f"Ranks issued {what} as #{common['seq']} on {common['process_group']}: {described}."
    if went_on:
        detail += (f" {ranks_text(list(went_on)).capitalize()} went past it while the others still wait in it (gloo "
                   "can complete a collective on one rank whose sizes differ from the others').")
    action = (f"Compare what {ranks_text(suspects)} issue here with the other ranks (`comm2perfetto diagnose` on "
              f"the folder afterwards compares their call sites and history): every rank must issue the same {same} "
              "at this point.")
    sites = _sites(ranks, waiting[:4])
    return Finding(kind=kind, ranks_joined=tuple(waiting), ranks_missing=(),
                   culprit_ranks=(), suspect_ranks=tuple(suspects), detail=detail, action=action, call_sites=sites,
                   stacks=_stacks(ranks, suspects), basis="the positions carry no history to tell which side is wrong",
                   **common)


def _stuck(common: dict, waiting: list[int], ranks: Mapping[int, dict]) -> Finding:
    """Every member waits in it: the operation itself is stuck. The last to arrive is told, but arriving last
    (on clocks not aligned here) says nothing about why every rank still waits: no culprit."""
    since = {r: _since(ranks, r, Op(common["group_uid"], COLLECTIVE, common["seq"])) or 0 for r in waiting}
    last = max(waiting, key=lambda r: (since[r], -r))
    late = since[last] - (common["t_ns"] or since[last])
    detail = (f"Every rank of {common['process_group']} issued {common['op']} #{common['seq']} and "
              f"{ranks_text(waiting)} {'are' if len(waiting) > 1 else 'is'} still waiting in it: the collective "
              f"itself does not complete. Rank {last} arrived last"
              + (f", {duration(late)} after the first (each rank's own clock)." if late > 0 else "."))
    action = ("Look at the network between these ranks and at the ranks' hosts; if the collective's sizes or "
              "dtypes may differ, `comm2perfetto diagnose` on the folder afterwards compares them.")
    return Finding(kind=STUCK_ALL_JOINED, ranks_joined=tuple(waiting), ranks_missing=(), culprit_ranks=(),
                   detail=detail, action=action, stacks=_stacks(ranks, [last]),
                   basis="every rank joined it: nothing singles one out", **common)


def _p2p(common: dict, w: Wait, ranks: Mapping[int, dict]) -> Finding:
    op = w.op
    (rank,), peer = w.blocked, op.peer
    assert peer is not None
    src, dst = (rank, peer) if op.kind == SEND else (peer, rank)
    if op.kind == SEND:
        detail = f"Rank {rank} is sending to rank {peer} on {common['process_group']} ({op.name}) but rank {peer} " \
                 "has not posted the matching recv."
        action = f"Make rank {peer} post a recv from rank {rank} for this send (or drop the send)."
    else:
        detail = f"Rank {rank} waits to receive from rank {peer} on {common['process_group']} ({op.name}) but " \
                 f"rank {peer} is not sending it."
        action = f"Make rank {peer} send to rank {rank} here (or drop the recv)."
    elsewhere = _blocked_elsewhere(ranks[peer], "") if peer in ranks else ""
    if elsewhere:
        detail += f" Rank {peer}: {elsewhere}."
    return Finding(kind=P2P_MISMATCH, ranks_joined=(rank,), ranks_missing=(peer,), culprit_ranks=(peer,),
                   detail=detail, action=action, call_sites=_sites(ranks, [rank]),
                   stacks=_stacks(ranks, [peer]), op=op.kind,
                   evidence={"src": src, "dst": dst, "waiting": peer in ranks and not elsewhere},
                   **{**common, "seq": None})


def _waiting_for_silent(common: dict, waiting: list[int], silent: list[int]) -> Finding:
    detail = (f"{ranks_text(waiting)} {'are' if len(waiting) > 1 else 'is'} waiting in {common['op']} "
              f"#{common['seq']} on {common['process_group']}; {ranks_text(silent)} did not answer the live "
              "gather, so whether it issued it cannot be told.")
    action = f"Look at {ranks_text(silent)} first: is the process alive, and what is it doing (py-spy dump)?"
    return Finding(kind=NO_DUMP, ranks_joined=tuple(waiting), ranks_missing=tuple(silent), culprit_ranks=(),
                   suspect_ranks=tuple(silent), detail=detail, action=action, basis="no answer from them", **common)


def _fold_frozen(findings: list[Finding], frozen: Mapping[int, Mapping[str, Any]]) -> list[Finding]:
    """A rank that did not answer while its process existed is frozen: a ``rank_frozen`` finding that takes the
    first wait on it."""
    out = list(findings)
    for rank, probe in sorted(frozen.items()):
        p2p = [f for f in out if f.kind == P2P_MISMATCH and f.ranks_missing == (rank,)]  # the sends and receives
        out = [f for f in out if f not in p2p]  # it left unmatched: the waits its freeze left, no desync
        wait = next((f for f in out if rank in f.ranks_missing and f.kind in (MISSING_RANKS, NO_DUMP)),
                    p2p[0] if p2p else None)
        state = probe.get("detail") or probe.get("state") or "alive"
        detail = (f"Rank {rank} did not answer the live gather although its process exists ({state}): it stopped "
                  "making progress; its process was alive at the stall.")
        if wait is not None and wait in out:
            i = out.index(wait)
            rest = tuple(r for r in wait.ranks_missing if r != rank)
            if rest:  # the others it waits for are told on their own (a rank computing elsewhere: a culprit too)
                out[i] = replace(wait, ranks_missing=rest,
                                 culprit_ranks=tuple(r for r in wait.culprit_ranks if r in rest),
                                 suspect_ranks=tuple(r for r in wait.suspect_ranks if r in rest))
            else:
                del out[i]
        if wait is not None:
            others = [r for r in wait.ranks_joined if r != rank]
            what = f"{wait.op} #{wait.seq}" if wait.seq is not None else f"{wait.op}"
            detail += f" {ranks_text(others).capitalize()} {'wait' if len(others) > 1 else 'waits'} in " \
                      f"{what} on {wait.process_group} for it."
        action = (f"Look at what rank {rank} is doing: `py-spy dump --pid PID` of its process, its GPU "
                  "(`nvidia-smi`); a stopped process (SIGSTOP, a debugger) goes on after SIGCONT.")
        out.append(Finding(
            kind=RANK_FROZEN, process_group=wait.process_group if wait else "",
            group_uid=wait.group_uid if wait else "",
            seq=wait.seq if wait else None, op=wait.op if wait else None,
            ranks_joined=tuple(r for r in wait.ranks_joined if r != rank) if wait else (), ranks_missing=(rank,),
            culprit_ranks=(rank,), detail=detail, action=action, call_sites=wait.call_sites if wait else {},
            evidence={"how": "frozen", "process": dict(probe)}, t_ns=wait.t_ns if wait else None,
            basis="its process existed at the stall and did not answer"))
    return out


def _silent(absent: list[int], world: int) -> Finding:
    detail = (f"{ranks_text(absent)} of {world} did not answer the live gather (its recorder's watchdog did not "
              "run: the process may have died, or it holds the GIL); the verdict covers the other ranks only.")
    action = f"Check whether {ranks_text(absent)} {'are' if len(absent) > 1 else 'is'} still alive."
    return Finding(kind=NO_DUMP, process_group="", group_uid="", seq=None, op=None, ranks_joined=(),
                   ranks_missing=tuple(absent), culprit_ranks=(), suspect_ranks=tuple(absent), detail=detail,
                   action=action, basis="no answer from them")


def _sites(ranks: Mapping[int, dict], which: Sequence[int]) -> dict[int, str]:
    """``file:line`` where each of these ranks is: the innermost user frame of its stack."""
    return {r: ranks[r]["stack"][0].split(" ")[0] for r in which if r in ranks and ranks[r].get("stack")}


def _stacks(ranks: Mapping[int, dict], which: Sequence[int]) -> dict[int, tuple[str, ...]]:
    return {r: tuple(str(line) for line in ranks[r]["stack"]) for r in which if ranks.get(r, {}).get("stack")}
