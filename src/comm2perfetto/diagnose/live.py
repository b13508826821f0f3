"""The live verdict: who a stalled job waits for, from every rank's position gathered at the stall.

A pure function over a live snapshot (written by record/live.py while the job hangs; the raw format is shown
in sources/live.py), returning the same ``Diagnosis`` and ``Finding`` kinds as ``diagnose`` and arranged by
the same wait-for graph (``waits``, ``roots``), so that both speak alike and cannot disagree. Each rank's
position is the collective it waits in per group, the sends and receives it is inside (a batch: one per peer),
and how many collectives it has issued per group. It sees less than ``diagnose`` (no shapes, a short history),
so it only says what positions prove:

- a member whose group counter shows it has not issued the collective others wait in: ``missing_ranks``;
- members waiting at one sequence number with different ops: ``op_mismatch``, culprit the minority (with
  one op and different roots, a broadcast's src for instance: ``root_mismatch``);
- every member waiting: ``stuck_all_joined``, the last to arrive named as the slowest;
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
from typing import Any

from comm2perfetto.diagnose.diagnosis import verdict_status
from comm2perfetto.diagnose.findings import (
    MISSING_RANKS,
    NO_DUMP,
    OP_MISMATCH,
    P2P_MISMATCH,
    RANK_FROZEN,
    ROOT_MISMATCH,
    STUCK_ALL_JOINED,
    Diagnosis,
    Finding,
)
from comm2perfetto.diagnose.roots import arrange
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
from comm2perfetto.model import ClockAlignment
from comm2perfetto.render.words import duration, ranks_text

__all__ = ["live_diagnosis"]

SENDS = ("send", "isend")
NOTE = ("a live verdict, from each rank's position at the stall; `comm2perfetto diagnose` on the folder "
        "afterwards gives the full picture")


def live_diagnosis(snapshot: Mapping[str, Any], probes: Mapping[int, Mapping[str, Any]] | None = None) -> Diagnosis:
    """The verdict of one stall snapshot (``.live/stall.<gen>.json``, as ``sources.live.read_snapshot`` checked
    it). ``probes``: the ranks that did not answer whose process `record` found alive and making no progress
    (frozen), by rank: ``{"state": "stopped", "detail": "stopped (SIGSTOP, process state T)", ...}``."""
    ranks = {s["rank"]: s for s in snapshot["ranks"]}
    world = snapshot["world_size"]
    groups = _groups(ranks, world)
    members = {name: tuple(m) for name, _, m in groups}
    labels = {name: desc or name for name, desc, _ in groups}
    positions = {r: _position(r, s) for r, s in ranks.items()}
    silent = sorted(set(range(world)) - set(ranks)) if world else []
    frozen = {r: probes[r] for r in silent if probes and r in probes}
    states = {r: FROZEN if r in frozen else NO_DATA for r in silent}
    states.update({r: p.state for r, p in positions.items()})
    findings = [f for w in waits_of(positions, members)
                if not _unknown(w, members, positions) and (f := _finding(w, labels, ranks, set(silent))) is not None]
    findings = _fold_frozen(findings, frozen)
    waited_for = {r for f in findings for r in f.ranks_missing}
    absent = [r for r in silent if r not in frozen and r not in waited_for]
    if absent:
        findings.append(_silent(absent, world))
    findings = arrange(findings, states, order=recent_order(positions), halted=frozenset(frozen))
    return Diagnosis(
        status=verdict_status(findings), world_size=world, ranks_with_data=tuple(sorted(ranks)),
        findings=tuple(findings), skipped=(), notes=(NOTE,), clock=ClockAlignment(),
        groups_checked=tuple(name for name, _, _ in groups),
    )


def _position(rank: int, summary: Mapping[str, Any]) -> Position:
    ops: list[Op] = []
    issued: dict[str, int] = {}
    recent: dict[str, list[tuple[int, int]]] = {}
    p2p_issued: dict[tuple[str, str, int], int] = {}
    for name, g in (summary.get("groups") or {}).items():
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
    return Position(rank, BLOCKED if ops else OUTSIDE, tuple(ops), issued, recent, p2p_issued)


def _groups(ranks: Mapping[int, dict], world: int | None) -> list[tuple[str, str, list[int]]]:
    """(name, description, member ranks) of every group some rank reported, default group first."""
    seen: dict[str, tuple[str, list[int]]] = {}
    for summary in ranks.values():
        for name, g in (summary.get("groups") or {}).items():
            members = [r for r in g.get("ranks") or () if isinstance(r, int)]
            desc = str(g.get("desc") or "")
            if name not in seen or len(members) > len(seen[name][1]):
                seen[name] = (desc or seen.get(name, ("", []))[0], members)
    out = []
    for name, (desc, members) in seen.items():
        if not members and name == "0" and world:
            members = list(range(world))
        out.append((name, desc, sorted(set(members))))
    return sorted(out, key=lambda g: (0, int(g[0])) if g[0].isdigit() else (1, g[0]))


def _unknown(w: Wait, members: Mapping[str, Sequence[int]], positions: Mapping[int, Position]) -> bool:
    """A collective nobody is known to be missing from, with a member that answered but whose counter is not
    known: neither stuck nor waiting for anyone that can be named."""
    if w.op.kind != COLLECTIVE or w.waits_for:
        return False
    return any(m not in w.blocked and m in positions and w.op.group not in positions[m].issued
               for m in members.get(w.op.group, ()))


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
    if len(ops) > 1 or len({_root(ranks, r, op.group) for r in waiting} - {None}) > 1:
        return _op_mismatch(common, waiting, ranks)
    if not w.waits_for:
        return _stuck(common, waiting, ranks)
    if set(w.waits_for) <= silent:
        return _waiting_for_silent(common, waiting, list(w.waits_for))
    return _missing(common, waiting, list(w.waits_for), ranks, silent)


def _pending_op(ranks: Mapping[int, dict], rank: int, group: str) -> str:
    return str(ranks[rank]["groups"][group]["pending"]["op"])


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
                   action=action, call_sites=sites, stacks=_stacks(ranks, culprits), **common)


def _blocked_elsewhere(summary: Mapping[str, Any], group: str) -> str:
    """``it was waiting in all_reduce #5 on 2`` when the rank is blocked in another group's operation."""
    for name, g in (summary.get("groups") or {}).items():
        if name == group:
            continue
        p = g.get("pending")
        if p is not None:
            return f"it was waiting in {p['op']} #{p['seq']} on {g.get('desc') or name}"
        for q in g.get("p2p") or ():
            return f"it was inside {q['op']} {'to' if q['op'] in SENDS else 'from'} rank {q['peer']}"
    return ""


def _root(ranks: Mapping[int, dict], rank: int, group: str) -> int | None:
    root = ranks[rank]["groups"][group]["pending"].get("root")
    return root if isinstance(root, int) else None


def _op_mismatch(common: dict, waiting: list[int], ranks: Mapping[int, dict]) -> Finding:
    """Different ops at one sequence number, or one rooted op with different roots: the minority is the
    culprit (on a tie, the ranks that differ from the lowest)."""
    by_op: dict[tuple[str, int | None], list[int]] = {}
    for r in waiting:
        by_op.setdefault((_pending_op(ranks, r, common["group_uid"]), _root(ranks, r, common["group_uid"])),
                         []).append(r)
    clusters = sorted(by_op.items(), key=lambda kv: (-len(kv[1]), min(kv[1])))
    culprits = sorted(r for _, rs in clusters[1:] for r in rs)
    same_op = len({op for (op, _), _ in clusters}) == 1
    described = "; ".join(f"{ranks_text(rs)}: {op}" + (f" root {root}" if root is not None else "")
                          for (op, root), rs in clusters)
    what = "different roots (src/dst)" if same_op else "different collectives"
    detail = f"Ranks issued {what} as #{common['seq']} on {common['process_group']}: {described}."
    action = (f"Make {ranks_text(culprits)} issue the same {'root' if same_op else 'collective'} as the others at "
              "this point.")
    sites = _sites(ranks, waiting[:4])
    return Finding(kind=ROOT_MISMATCH if same_op else OP_MISMATCH, ranks_joined=tuple(waiting), ranks_missing=(),
                   culprit_ranks=tuple(culprits), detail=detail, action=action, call_sites=sites,
                   stacks=_stacks(ranks, culprits), **common)


def _stuck(common: dict, waiting: list[int], ranks: Mapping[int, dict]) -> Finding:
    since = {r: _since(ranks, r, Op(common["group_uid"], COLLECTIVE, common["seq"])) or 0 for r in waiting}
    slowest = max(waiting, key=lambda r: (since[r], -r))
    late = since[slowest] - (common["t_ns"] or since[slowest])
    detail = (f"Every rank of {common['process_group']} issued {common['op']} #{common['seq']} and "
              f"{ranks_text(waiting)} {'are' if len(waiting) > 1 else 'is'} still waiting in it. The last to "
              f"arrive was rank {slowest}" + (f", {duration(late)} after the first." if late > 0 else "."))
    action = (f"Check rank {slowest} first (its host, GPU and network, or work it queued before this collective); "
              "if every rank looks healthy, suspect the network between them.")
    return Finding(kind=STUCK_ALL_JOINED, ranks_joined=tuple(waiting), ranks_missing=(), culprit_ranks=(slowest,),
                   detail=detail, action=action, stacks=_stacks(ranks, [slowest]), **common)


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
                   stacks=_stacks(ranks, [peer]), evidence={"src": src, "dst": dst}, op=op.kind,
                   **{**common, "seq": None})


def _waiting_for_silent(common: dict, waiting: list[int], silent: list[int]) -> Finding:
    detail = (f"{ranks_text(waiting)} {'are' if len(waiting) > 1 else 'is'} waiting in {common['op']} "
              f"#{common['seq']} on {common['process_group']}; {ranks_text(silent)} did not answer the live "
              "gather, so whether it issued it cannot be told.")
    action = f"Look at {ranks_text(silent)} first: is the process alive, and what is it doing (py-spy dump)?"
    return Finding(kind=NO_DUMP, ranks_joined=tuple(waiting), ranks_missing=tuple(silent), culprit_ranks=(),
                   suspect_ranks=tuple(silent), detail=detail, action=action, **common)


def _fold_frozen(findings: list[Finding], frozen: Mapping[int, Mapping[str, Any]]) -> list[Finding]:
    """A rank that did not answer while its process existed is frozen: a ``rank_frozen`` finding that takes the
    first wait on it."""
    out = list(findings)
    for rank, probe in sorted(frozen.items()):
        wait = next((f for f in out if rank in f.ranks_missing and f.kind in (MISSING_RANKS, NO_DUMP)), None)
        state = probe.get("detail") or probe.get("state") or "alive"
        detail = (f"Rank {rank} did not answer the live gather although its process exists ({state}): it stopped "
                  "making progress; its process was alive at the stall.")
        if wait is not None:
            out.remove(wait)
            others = [r for r in wait.ranks_joined if r != rank]
            detail += f" {ranks_text(others).capitalize()} {'wait' if len(others) > 1 else 'waits'} in " \
                      f"{wait.op} #{wait.seq} on {wait.process_group} for it."
        action = (f"Look at what rank {rank} is doing: `py-spy dump --pid PID` of its process, its GPU "
                  "(`nvidia-smi`); a stopped process (SIGSTOP, a debugger) goes on after SIGCONT.")
        out.append(Finding(
            kind=RANK_FROZEN, process_group=wait.process_group if wait else "",
            group_uid=wait.group_uid if wait else "",
            seq=wait.seq if wait else None, op=wait.op if wait else None,
            ranks_joined=tuple(r for r in wait.ranks_joined if r != rank) if wait else (), ranks_missing=(rank,),
            culprit_ranks=(rank,), detail=detail, action=action, call_sites=wait.call_sites if wait else {},
            evidence={"how": "frozen", "process": dict(probe)}, t_ns=wait.t_ns if wait else None))
    return out


def _silent(absent: list[int], world: int) -> Finding:
    detail = (f"{ranks_text(absent)} of {world} did not answer the live gather (its recorder's watchdog did not "
              "run: the process may have died, or it holds the GIL); the verdict covers the other ranks only.")
    action = f"Check whether {ranks_text(absent)} {'are' if len(absent) > 1 else 'is'} still alive."
    return Finding(kind=NO_DUMP, process_group="", group_uid="", seq=None, op=None, ranks_joined=(),
                   ranks_missing=tuple(absent), culprit_ranks=(), suspect_ranks=tuple(absent), detail=detail,
                   action=action)


def _sites(ranks: Mapping[int, dict], which: Sequence[int]) -> dict[int, str]:
    """``file:line`` where each of these ranks is: the innermost user frame of its stack."""
    return {r: ranks[r]["stack"][0].split(" ")[0] for r in which if r in ranks and ranks[r].get("stack")}


def _stacks(ranks: Mapping[int, dict], which: Sequence[int]) -> dict[int, tuple[str, ...]]:
    return {r: tuple(str(line) for line in ranks[r]["stack"]) for r in which if ranks.get(r, {}).get("stack")}
