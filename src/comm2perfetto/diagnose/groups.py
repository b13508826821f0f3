"""``group_mismatch``: ranks that created their process groups in different orders (``group_names``), as a
finding that the waits in those groups follow from. For diagnose and the live verdict alike. No torch."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from comm2perfetto.diagnose.findings import GROUP_MISMATCH, Finding
from comm2perfetto.group_names import GroupConflict, deviating
from comm2perfetto.words import ranks_text

__all__ = ["conflict_uids", "group_mismatch"]


def group_mismatch(conflicts: Sequence[GroupConflict], uids: Sequence[str], t_ns: int | None = None) -> Finding:
    """One finding for the groups the ranks know by different names (``conflicts``, often two: the groups
    whose creation one rank swapped); ``uids``: the job's groups they concern (what the waits in them go by)."""
    odd = sorted({r for c in conflicts for r in deviating(c)})
    everyone = sorted({r for c in conflicts for rs in c.names.values() for r in rs})
    told = "; ".join(c.text() for c in conflicts)
    detail = (f"The ranks know the same group by different c10d names: {told}. c10d numbers a process's groups "
              "in the order it creates them, so these ranks created their groups in different orders, and their "
              "collectives on one group went to different groups, where they wait for each other.")
    if odd:
        others = [r for r in everyone if r not in odd]
        detail += (f" {ranks_text(odd).capitalize()} created {'their' if len(odd) > 1 else 'its'} groups in "
                   f"another order than {ranks_text(others)}.")
        basis = (f"{ranks_text(odd)} named the groups differently from the other {len(others)} ranks, but which "
                 "order the program meant cannot be read from the data (two ranks that swapped it would outvote one)")
    else:
        detail += " As many ranks use one name as the other: nothing tells which order the program meant."
        basis = "the ranks split evenly between the names"
    return Finding(
        kind=GROUP_MISMATCH, process_group=", ".join(dict.fromkeys(c.desc for c in conflicts)),
        group_uid=uids[0] if uids else "", seq=None, op=None,
        ranks_joined=(), ranks_missing=(), culprit_ranks=(), suspect_ranks=tuple(everyone), detail=detail,
        action=("Create the process groups (new_group, init_device_mesh, split_group) in the same order on every "
                "rank: a group created under a rank-dependent condition shifts the numbers of every group "
                "created after it."),
        evidence={"groups": [{"desc": c.desc, "names": {n: list(rs) for n, rs in c.names.items()}}
                             for c in conflicts], "group_uids": list(uids)},
        t_ns=t_ns, basis=basis,
    )


def conflict_uids(conflicts: Sequence[GroupConflict], groups: Mapping[str, tuple[str, Sequence[int]]]) -> list[str]:
    """The uids (of ``groups``: uid -> (c10d name, members)) of the groups the conflicts name, in order."""
    out: list[str] = []
    for c in conflicts:
        members = list(c.members)
        out += [uid for uid, (name, ranks) in groups.items() if name in c.names and uid not in out
                and len(ranks) == len(members) and list(ranks) == members]
    return out
