"""The live verdict: who a stalled job waits for, from every rank's position gathered at the stall.

A pure function over a live snapshot (written by record/live.py while the job hangs; the raw format is shown
there), returning the same ``Diagnosis`` and ``Finding`` kinds as ``diagnose`` so that both speak alike. It
sees less than ``diagnose`` (no history, no shapes), so it only says what positions prove:

- in a process group where some ranks wait in collective #S, a member whose group counter shows it has issued
  fewer than S collectives has not issued #S: ``missing_ranks``, culprit that rank;
- members waiting in #S with different ops: ``op_mismatch``, culprit the minority;
- every member waiting in #S: ``stuck_all_joined``, the last to arrive named as the slowest;
- members that did not answer the gather (their watchdog did not run: the process may be dead, or stuck
  holding the GIL): ``no_dump``, named as suspects where the group waits for them.

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
    ORDER,
    STUCK_ALL_JOINED,
    Diagnosis,
    Finding,
)
from comm2perfetto.model import ClockAlignment
from comm2perfetto.render.words import duration, ranks_text

__all__ = ["live_diagnosis"]

_WAITING, _MISSING, _ISSUED, _SILENT, _UNKNOWN = "waiting", "missing", "issued", "silent", "unknown"


def live_diagnosis(snapshot: Mapping[str, Any]) -> Diagnosis:
    """The verdict of one stall snapshot (``.live/stall.<gen>.json``, as ``sources.live.read_snapshot`` checked
    it)."""
    ranks = {s["rank"]: s for s in snapshot["ranks"]}
    world = snapshot["world_size"]
    findings: list[Finding] = []
    silent_named: set[int] = set()
    groups = _groups(ranks, world)
    for name, desc, members in groups:
        finding, silent = _group_verdict(name, desc, members, ranks)
        if finding is not None:
            findings.append(finding)
            silent_named.update(silent)
    absent = sorted(set(range(world)) - set(ranks) - silent_named) if world else []
    if absent:
        findings.append(_silent(absent, world))
    findings.sort(key=lambda f: (ORDER[f.kind], f.t_ns if f.t_ns is not None else 0))
    notes = ("a live verdict, from each rank's position at the stall; `comm2perfetto diagnose` on the folder "
             "afterwards gives the full picture",)
    return Diagnosis(
        status=verdict_status(findings), world_size=world, ranks_with_data=tuple(sorted(ranks)),
        findings=tuple(findings), skipped=(), notes=notes, clock=ClockAlignment(),
        groups_checked=tuple(name for name, _, _ in groups),
    )


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


def _group_verdict(name: str, desc: str, members: Sequence[int],
                   ranks: Mapping[int, dict]) -> tuple[Finding | None, list[int]]:
    label = desc or name
    pending = {r: ranks[r]["groups"][name]["pending"] for r in members
               if r in ranks and isinstance((ranks[r].get("groups") or {}).get(name, {}).get("pending"), dict)}
    if not pending:
        return None, []
    seq = min(p["seq"] for p in pending.values())
    status: dict[int, str] = {}
    for r in members:
        if r not in ranks:
            status[r] = _SILENT
            continue
        g = (ranks[r].get("groups") or {}).get(name)
        p = pending.get(r)
        if p is not None and p["seq"] == seq:
            status[r] = _WAITING
        elif g is not None and isinstance(g.get("issued"), int):
            status[r] = _ISSUED if g["issued"] >= seq else _MISSING
        else:
            status[r] = _UNKNOWN
    waiting = sorted(r for r, s in status.items() if s == _WAITING)
    missing = sorted(r for r, s in status.items() if s == _MISSING)
    silent = sorted(r for r, s in status.items() if s == _SILENT)
    ops = Counter(pending[r]["op"] for r in waiting)
    op = ops.most_common(1)[0][0]
    first_ns = min(pending[r]["since_ns"] for r in waiting)
    common = dict(process_group=label, group_uid=name, seq=seq, op=op, t_ns=first_ns)
    if len(ops) > 1:
        return _op_mismatch(common, waiting, pending, ranks), silent
    if missing:
        return _missing(common, waiting, missing, ranks, name), silent
    if silent:
        return _waiting_for_silent(common, waiting, silent), silent
    if all(s in (_WAITING, _ISSUED) for s in status.values()):
        return _stuck(common, waiting, pending, ranks), silent
    return None, silent


def _missing(common: dict, waiting: list[int], missing: list[int], ranks: Mapping[int, dict],
             name: str) -> Finding:
    op, seq, label = common["op"], common["seq"], common["process_group"]
    sites = _sites(ranks, waiting[:2])
    doing = []
    for r in missing[:4]:
        issued = ranks[r]["groups"][name]["issued"]
        last = f"Rank {r}'s last collective on {label} was #{issued}" if issued else \
            f"Rank {r} had issued no collective on {label}"
        stack = ranks[r].get("stack")
        doing.append(last + (f"; it was at {stack[0]}." if stack else "."))
    detail = (f"{ranks_text(missing)} had not issued {op} #{seq} on {label} when the stall was detected while "
              f"{ranks_text(waiting)} {'were' if len(waiting) > 1 else 'was'} waiting in it"
              + (f" (rank {next(iter(sites))} called it at {next(iter(sites.values()))})" if sites else "")
              + ". " + " ".join(doing))
    action = (f"Look at what {ranks_text(missing)} {'were' if len(missing) > 1 else 'was'} doing instead (its "
              f"stack above): a rank that skips or delays a collective the others issue hangs the group.")
    return Finding(kind=MISSING_RANKS, ranks_joined=tuple(waiting), ranks_missing=tuple(missing),
                   culprit_ranks=tuple(missing), detail=detail, action=action, call_sites=sites,
                   stacks=_stacks(ranks, missing), **common)


def _op_mismatch(common: dict, waiting: list[int], pending: Mapping[int, dict],
                 ranks: Mapping[int, dict]) -> Finding:
    by_op: dict[str, list[int]] = {}
    for r in waiting:
        by_op.setdefault(pending[r]["op"], []).append(r)
    clusters = sorted(by_op.items(), key=lambda kv: (-len(kv[1]), min(kv[1])))
    culprits = sorted(r for _, rs in clusters[1:] for r in rs)
    described = "; ".join(f"{ranks_text(rs)}: {op}" for op, rs in clusters)
    detail = (f"Ranks issued different collectives as #{common['seq']} on {common['process_group']}: "
              f"{described}.")
    action = f"Make {ranks_text(culprits)} issue the same collective as the others at this point."
    sites = _sites(ranks, waiting[:4])
    return Finding(kind=OP_MISMATCH, ranks_joined=tuple(waiting), ranks_missing=(), culprit_ranks=tuple(culprits),
                   detail=detail, action=action, call_sites=sites, stacks=_stacks(ranks, culprits), **common)


def _stuck(common: dict, waiting: list[int], pending: Mapping[int, dict], ranks: Mapping[int, dict]) -> Finding:
    slowest = max(waiting, key=lambda r: (pending[r]["since_ns"], -r))
    late = pending[slowest]["since_ns"] - common["t_ns"]
    detail = (f"Every rank of {common['process_group']} issued {common['op']} #{common['seq']} and "
              f"{ranks_text(waiting)} {'are' if len(waiting) > 1 else 'is'} still waiting in it. The last to "
              f"arrive was rank {slowest}" + (f", {duration(late)} after the first." if late > 0 else "."))
    action = (f"Check rank {slowest} first (its host, GPU and network, or work it queued before this collective); "
              "if every rank looks healthy, suspect the network between them.")
    return Finding(kind=STUCK_ALL_JOINED, ranks_joined=tuple(waiting), ranks_missing=(), culprit_ranks=(slowest,),
                   detail=detail, action=action, stacks=_stacks(ranks, [slowest]), **common)


def _waiting_for_silent(common: dict, waiting: list[int], silent: list[int]) -> Finding:
    detail = (f"{ranks_text(waiting)} {'are' if len(waiting) > 1 else 'is'} waiting in {common['op']} "
              f"#{common['seq']} on {common['process_group']}; {ranks_text(silent)} did not answer the live "
              "gather, so whether it issued it cannot be told.")
    action = f"Look at {ranks_text(silent)} first: is the process alive, and what is it doing (py-spy dump)?"
    return Finding(kind=NO_DUMP, ranks_joined=tuple(waiting), ranks_missing=tuple(silent),
                   culprit_ranks=tuple(silent), detail=detail, action=action, **common)


def _silent(absent: list[int], world: int) -> Finding:
    detail = (f"{ranks_text(absent)} of {world} did not answer the live gather (its recorder's watchdog did not "
              "run: the process may have died, or it holds the GIL); the verdict covers the other ranks only.")
    action = f"Check whether {ranks_text(absent)} {'are' if len(absent) > 1 else 'is'} still alive."
    return Finding(kind=NO_DUMP, process_group="", group_uid="", seq=None, op=None, ranks_joined=(),
                   ranks_missing=tuple(absent), culprit_ranks=tuple(absent), detail=detail, action=action)


def _sites(ranks: Mapping[int, dict], which: Sequence[int]) -> dict[int, str]:
    """``file:line`` where each of these ranks is: the innermost user frame of its stack."""
    return {r: ranks[r]["stack"][0].split(" ")[0] for r in which if ranks[r].get("stack")}


def _stacks(ranks: Mapping[int, dict], which: Sequence[int]) -> dict[int, tuple[str, ...]]:
    return {r: tuple(str(line) for line in ranks[r]["stack"]) for r in which if ranks.get(r, {}).get("stack")}
