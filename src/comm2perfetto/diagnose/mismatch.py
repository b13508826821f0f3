"""Ranks that disagree on one collective (op, sizes, dtypes, roots, an all-to-all's pairs, object lists), and
which side is wrong: read from each rank's own history (``history``), never from a vote. No torch."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from comm2perfetto.diagnose import history
from comm2perfetto.diagnose.evidence import (
    numel,
    ordinal,
    site_list,
    sites_of,
)
from comm2perfetto.diagnose.findings import (
    DTYPE_MISMATCH,
    OP_MISMATCH,
    ROOT_MISMATCH,
    SIZE_MISMATCH,
    Finding,
)
from comm2perfetto.diagnose.signatures import compare
from comm2perfetto.job import Job
from comm2perfetto.model import (
    Collective,
    GroupView,
    Signature,
    op_family,
    peer_elements,
)
from comm2perfetto.words import ranks_text

__all__ = ["MAX_JUDGED", "mismatch"]


# --- mismatches ------------------------------------------------------------------------------------------

_KIND = {"op": OP_MISMATCH, "size": SIZE_MISMATCH, "dtype": DTYPE_MISMATCH, "root": ROOT_MISMATCH}
_SEVERITY = {"op": 0, "root": 1, "size": 2, "dtype": 3}


def mismatch(job: Job, c: Collective, cols: GroupView, index: int) -> Finding | None:
    """Cluster the joined ranks by compatible signature. Which side is wrong is read from each rank's own
    history (``history``), never from a vote: the clusters whose ranks break their own cycle here are the
    culprits, when some cluster keeps its cycle; otherwise every joined rank is a suspect."""
    group = c.group
    size = len(group.ranks)
    clusters: list[tuple[Signature, list[int]]] = []
    for r, sig in zip(c.ranks, c.signatures):
        if sig is None:
            continue
        for rep, members in clusters:
            if compare(rep, sig, size) is None and compare(sig, rep, size) is None:
                members.append(r)
                break
        else:
            clusters.append((sig, [r]))
    if len(clusters) < 2:
        return exchange_mismatch(job, c, cols, index) or all_to_all_totals(job, c, cols, index)
    clusters.sort(key=lambda cl: (-len(cl[1]), min(cl[1])))  # for the telling only: the largest first
    verdicts, whys = cluster_verdicts(job, cols, index, clusters)
    sound = [i for i, v in enumerate(verdicts) if v == history.CONFORMS]
    wrong = [i for i, v in enumerate(verdicts) if v == history.DEVIATES]
    joined = sorted(r for _, m in clusters for r in m)
    if sound and wrong:
        culprits = sorted(r for i in wrong for r in clusters[i][1])
        suspects = sorted(r for i, v in enumerate(verdicts) if v == history.UNKNOWN for r in clusters[i][1])
        kept = sorted(r for i in sound for r in clusters[i][1])
        basis = "; ".join(f"rank {r}: {why}" for r, why in whys[:3]) + (
            f"; {ranks_text(kept)} kept {'their' if len(kept) > 1 else 'its'} own cycle")
        ref = clusters[sound[0]][0]
        others = [clusters[i][0] for i in wrong]
    else:  # no vote either: a sound rank outvoted by two faulty ones would be named
        culprits, suspects = [], joined
        basis = ("no rank's history shows which side is wrong" if not any(v != history.UNKNOWN for v in verdicts)
                 else "the ranks' histories do not separate them")
        ref = clusters[0][0]
        others = [sig for sig, _ in clusters[1:]]
    worst = min((compare(ref, sig, size) or "dtype" for sig in others), key=_SEVERITY.__getitem__)
    kind = _KIND[worst]
    variants = [{"ranks": sorted(m), "signature": s.describe()} for s, m in clusters]
    sites = sites_of(job, c, culprits[:3] + [m[0] for _, m in clusters])  # the culprits, and a rank of each side
    what = {"op": "different collectives", "size": "different sizes", "dtype": "different dtypes",
            "root": "different roots"}[worst]
    described = "; ".join(f"{ranks_text(sorted(m))}: {s.describe()}" for s, m in clusters)
    detail = f"Ranks issued {what} as {c.op} #{c.seq} on {group.label}: {described}."
    member = differing_member(clusters[0][0], clusters[1][0], size)
    if member:
        detail += f" {member}"
    if sites:
        detail += f" Call sites: {site_list(sites)}."
    if not culprits:
        detail += (f" Nothing in the data shows which side is wrong ({basis}): "
                   f"{ranks_text(suspects)} {'are suspects' if len(suspects) > 1 else 'is a suspect'}.")
    same = {"op": "collective", "root": "root (src/dst)"}.get(worst, "tensor " + worst)
    if culprits:
        action = (f"Make {ranks_text(culprits)} issue the same {same} as the other ranks at this point: the code "
                  f"paths diverge before {c.op} #{c.seq}.")
    else:
        action = (f"Compare what {ranks_text(joined)} issue at this point (the call sites above): the ranks must "
                  f"issue the same {same}; the code paths diverge before {c.op} #{c.seq}.")
    return Finding(
        kind=kind, process_group=group.label, group_uid=group.uid, seq=c.seq, op=c.op,
        ranks_joined=c.joined_ranks, ranks_missing=(), culprit_ranks=tuple(culprits), detail=detail,
        action=action, call_sites=sites, evidence={"variants": variants},
        t_ns=min((x for x in c.arrive_ns if x is not None), default=None), suspect_ranks=tuple(suspects),
        basis=basis,
    )


MAX_JUDGED = 16  # ranks of one cluster whose history is read (a cluster of thousands is judged by a sample)


def cluster_verdicts(job: Job, cols: GroupView, index: int,
                      clusters: Sequence[tuple[Signature, list[int]]]) -> tuple[list[str], list[tuple[int, str]]]:
    """Per cluster, what its ranks' histories say (``history.CONFORMS``/``DEVIATES`` when every rank judged
    says so, else ``NOT_KNOWN``), and for the ranks that deviate, why. Judged where the ranks' call sites parted
    (``history.divergence``: an extra or skipped collective shifts the later ones) when that separates them,
    else at the ``index``-th collective itself."""
    judged_ranks = [r for _sig, members in clusters for r in members[:MAX_JUDGED]]
    parted = history.divergence(job, cols, index, judged_ranks)
    if parted is not None:
        verdicts, whys = judged_at(job, cols, parted, clusters)
        if history.DEVIATES in verdicts and history.CONFORMS in verdicts:
            seq = cols[parted].seq
            return verdicts, [(r, f"at #{seq}, where the ranks' call sites parted, {why}; its later collectives are "
                                  "shifted against its peers'") for r, why in whys]
    return judged_at(job, cols, index, clusters)


def judged_at(job: Job, cols: GroupView, index: int,
               clusters: Sequence[tuple[Signature, list[int]]]) -> tuple[list[str], list[tuple[int, str]]]:
    verdicts: list[str] = []
    whys: list[tuple[int, str]] = []
    for _sig, members in clusters:
        judged = [(r, history.judge(job, cols, index, r)) for r in members[:MAX_JUDGED]]
        kinds = {j.verdict for _, j in judged}
        verdicts.append(kinds.pop() if len(kinds) == 1 else history.UNKNOWN)
        whys += [(r, j.why) for r, j in judged if j.verdict == history.DEVIATES]
    return verdicts, whys


def differing_member(a: Signature, b: Signature, size: int) -> str:
    """``The 2nd member differs: all_reduce [[8]] Float against all_reduce [[9]] Float.`` for coalesced groups."""
    if not a.parts or not b.parts or len(a.parts) != len(b.parts):
        return ""
    for i, (pa, pb) in enumerate(zip(a.parts, b.parts)):
        if compare(pa, pb, size) is not None:
            return f"The {ordinal(i + 1)} member differs: {pa.describe()} against {pb.describe()}."
    return ""


MAX_PAIRS_TOLD = 4


def exchange_mismatch(job: Job, c: Collective, cols: GroupView, index: int) -> Finding | None:
    """Ranks that disagree on what passes between them, where the recorder logged it (or Flight Recorder's
    ``all_to_all`` lists show it, one tensor per peer: ``model.peer_elements``): an all-to-all whose rank A
    sends k elements to B while B expects j from A (gloo aborts the one that receives more than it expects, the
    other may return with wrong data), and the rank in every such pair where there is one (its splits are the
    ones that differ), or an object collective whose ranks pass lists of different lengths.
    Which side is wrong is read from each rank's history, as for other mismatches; otherwise the ranks of the
    pairs that disagree are suspects."""
    members = sorted(c.group.ranks)
    where = {r: i for i, r in enumerate(members)}
    sigs = {r: sig for r, sig in zip(c.ranks, c.signatures) if sig is not None}
    pairs: list[tuple[int, int, int, int]] = []  # (A, B, A sends to B, B expects from A)
    if op_family(c.op) == "all_to_all":
        sides = {r: peer_elements(sig, len(members)) for r, sig in sigs.items()}
        for a, xa in sides.items():
            for b, xb in sides.items():
                if xa is None or xb is None:
                    continue
                sent, expected = xa.sends_to(where[b]), xb.expects_from(where[a])
                if sent is not None and expected is not None and sent != expected:
                    pairs.append((a, b, sent, expected))
        if not pairs:
            return None
        told = "; ".join(f"rank {a} sends {k:,} elements to rank {b}, which expects {j:,} from it"
                         for a, b, k, j in pairs[:MAX_PAIRS_TOLD])
        if len(pairs) > MAX_PAIRS_TOLD:
            told += f" ({len(pairs) - MAX_PAIRS_TOLD} more pairs)"
        detail = f"The ranks of {c.group.label} disagree on what {c.op} #{c.seq} moves between them: {told}."
        involved = sorted({r for a, b, _, _ in pairs for r in (a, b)})
        evidence: dict[str, Any] = {"pairs": [{"src": a, "dst": b, "sends": k, "expects": j} for a, b, k, j in pairs]}
        # One rank in every pair that disagrees, with two or more pairs: the others agree among themselves, so
        # its splits are the ones that differ (which side is wrong is still read from the histories below)
        common = set.intersection(*({a, b} for a, b, _, _ in pairs))
        if len(pairs) > 1 and len(common) == 1:
            (odd,) = common
            detail += f" Rank {odd} is in every pair that disagrees: its split sizes differ from its peers'."
            evidence["splits_differ"] = odd
    else:
        lengths = {r: sig.objects for r, sig in sigs.items() if sig.objects is not None}
        if len(set(lengths.values())) < 2 or op_family(c.op) not in ("broadcast", "all_gather", "gather", "scatter"):
            return None
        by_length: dict[int, list[int]] = {}
        for r, n in sorted(lengths.items()):
            by_length.setdefault(n, []).append(r)
        told = "; ".join(f"{ranks_text(rs)}: {n}" for n, rs in sorted(by_length.items(), key=lambda kv: -len(kv[1])))
        detail = f"The ranks of {c.group.label} pass object lists of different lengths to {c.op} #{c.seq} ({told})."
        involved = sorted(lengths)
        evidence = {"objects": {str(r): n for r, n in sorted(lengths.items())}}
    clusters: dict[Signature, list[int]] = {}
    for r in involved:
        clusters.setdefault(sigs[r], []).append(r)
    ordered = sorted(clusters.items(), key=lambda kv: (-len(kv[1]), min(kv[1])))
    verdicts, whys = cluster_verdicts(job, cols, index, ordered)
    wrong = [i for i, v in enumerate(verdicts) if v == history.DEVIATES]
    if wrong and any(v == history.CONFORMS for v in verdicts):
        culprits, suspects = sorted(r for i in wrong for r in ordered[i][1]), []
        basis = "; ".join(f"rank {r}: {why}" for r, why in whys[:3])
    else:
        culprits, suspects = [], involved
        basis = "the ranks disagree, and nothing shows which side is wrong"
        detail += " Nothing in the data shows which side is wrong."
    sites = sites_of(job, c, (culprits or suspects)[:4])
    if sites:
        detail += f" Call sites: {site_list(sites)}."
    named = ranks_text(culprits or suspects)
    action = (f"Make the split sizes of {named} agree with what the other ranks send and expect."
              if op_family(c.op) == "all_to_all" else f"Give {named} object lists of the other ranks' length.")
    return Finding(
        kind=SIZE_MISMATCH, process_group=c.group.label, group_uid=c.group.uid, seq=c.seq, op=c.op,
        ranks_joined=c.joined_ranks, ranks_missing=(), culprit_ranks=tuple(culprits), suspect_ranks=tuple(suspects),
        detail=detail, action=action,
        call_sites=sites, evidence=evidence, t_ns=min((x for x in c.arrive_ns if x is not None), default=None),
        basis=basis,
    )


def all_to_all_totals(job: Job, c: Collective, cols: GroupView, index: int) -> Finding | None:
    """An all-to-all moves every element one rank sends to another: whatever the splits, what all ranks send
    adds up to what they receive. When it does not, the ranks disagree; which side is wrong is read from each
    rank's history as for other mismatches (``mismatch``): the ranks whose counts break their own cycle are the
    culprits when some rank keeps its cycle, otherwise every rank is a suspect."""
    if op_family(c.op) != "all_to_all":
        return None
    counts: dict[int, tuple[int, int]] = {}
    for r, sig in zip(c.ranks, c.signatures):
        if sig is None or sig.input_sizes is None or sig.output_sizes is None or sig.source != "fr":
            return None
        counts[r] = (numel(sig.input_sizes), numel(sig.output_sizes))
    sent, received = sum(a for a, _ in counts.values()), sum(b for _, b in counts.values())
    by_count: dict[tuple[int, int], list[int]] = {}
    for r, pair in counts.items():
        by_count.setdefault(pair, []).append(r)
    if sent == received or len(by_count) < 2:
        return None
    clusters = sorted(by_count.items(), key=lambda kv: (-len(kv[1]), min(kv[1])))
    sigs = {r: sig for r, sig in zip(c.ranks, c.signatures) if sig is not None}
    verdicts, whys = cluster_verdicts(job, cols, index, [(sigs[rs[0]], rs) for _, rs in clusters])
    wrong = [i for i, v in enumerate(verdicts) if v == history.DEVIATES]
    if wrong and any(v == history.CONFORMS for v in verdicts):
        culprits, suspects = sorted(r for i in wrong for r in clusters[i][1]), []
        basis = "; ".join(f"rank {r}: {why}" for r, why in whys[:3])
    else:
        culprits, suspects = [], sorted(counts)
        basis = "the totals show that the ranks disagree, not which of them is wrong"
    described = "; ".join(f"{ranks_text(rs)}: {a:,} sent, {b:,} received" for (a, b), rs in clusters)
    detail = (f"The ranks of {c.group.label} disagree on {c.op} #{c.seq}: together they send {sent:,} elements "
              f"and receive {received:,}, which an all-to-all cannot do ({described}).")
    named = culprits or suspects
    sites = sites_of(job, c, named[:3] + sorted(r for r in clusters[0][1] if r not in named)[:1])
    if sites:
        detail += f" Call sites: {site_list(sites)}."
    return Finding(
        kind=SIZE_MISMATCH, process_group=c.group.label, group_uid=c.group.uid, seq=c.seq, op=c.op,
        ranks_joined=c.joined_ranks, ranks_missing=(), culprit_ranks=tuple(culprits), suspect_ranks=tuple(suspects),
        detail=detail, action=f"Make the split sizes of {ranks_text(named)} agree with what the other ranks send to "
                              "them and expect from them.",
        call_sites=sites, evidence={"counts": {str(r): list(v) for r, v in sorted(counts.items())}},
        t_ns=min((x for x in c.arrive_ns if x is not None), default=None), basis=basis,
    )
