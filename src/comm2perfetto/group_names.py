"""Groups that the ranks created in different orders: one group known by different c10d names on different ranks.

c10d numbers the groups a process creates in creation order (``"1"``, ``"2"`` ...), and every rank must create
them in the same order: a rank that creates ``X`` and ``Y`` the other way round knows ``X`` as group 2 while its
peers know it as group 1, so their collectives on ``X`` meet nobody. The evidence is one group (the same
description and members) under different names, or one name with other members, on different ranks. Pure data,
for diagnose (from dumps and logs) and the live verdict (from the ranks' positions). No torch.

    >>> named = [(0, "1", "X", (0, 1, 2)), (1, "1", "X", (0, 1, 2)), (2, "2", "X", (0, 1, 2)),
    ...          (2, "1", "Y", (0, 1, 2))]
    >>> [(c.desc, dict(c.names)) for c in conflicts(named)]
    [('X', {'1': (0, 1), '2': (2,)})]
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from comm2perfetto.words import ranks_text

__all__ = ["GroupConflict", "conflicts", "deviating"]

_MEANINGLESS = ("", "undefined", "default_pg")


@dataclass(frozen=True, slots=True)
class GroupConflict:
    """One group the ranks know by different c10d names: ``desc`` (its description, or its members written out
    where it has none) and ``names``: c10d name -> the ranks that gave it that name."""

    desc: str
    members: tuple[int, ...]
    names: Mapping[str, tuple[int, ...]]

    def text(self) -> str:
        """``X is group 1 on ranks 0, 1 and group 2 on rank 2`` (rank lists short, as ``ranks_text``)."""
        parts = [f"group {name} on {ranks_text(self.names[name])}" for name in sorted(self.names, key=_name_order)]
        return f"{self.desc} is " + " and ".join(parts)


def conflicts(named: Iterable[tuple[int, str, str, Sequence[int]]]) -> list[GroupConflict]:
    """From (rank, c10d name, description, members) of every group each rank knows: the groups (a meaningful
    description with its members) that more than one name stands for across ranks, each name with its ranks.
    Members are compared per (description, name), not per rank: a 16,384-rank group is compared once."""
    by_desc: dict[str, dict[str, tuple[Sequence[int], set[int]]]] = {}
    for rank, name, desc, members in named:
        if desc in _MEANINGLESS:
            continue
        names = by_desc.setdefault(desc, {})
        known = names.get(name)
        if known is None:
            names[name] = (members, {rank})
        elif known[0] is members or list(known[0]) == list(members):
            known[1].add(rank)
        else:  # one name with other members: another group, compared apart
            names.setdefault(f"{name}\0{len(names)}", (members, {rank}))
    out = []
    for desc, names in sorted(by_desc.items()):
        classes: list[tuple[Sequence[int], dict[str, set[int]]]] = []
        for key, (members, ranks) in names.items():
            name = key.split("\0")[0]
            same = next((c for c in classes if list(c[0]) == list(members)), None)
            if same is None:
                classes.append((members, {name: set(ranks)}))
            else:
                same[1].setdefault(name, set()).update(ranks)
        for members, by_name in classes:
            if len(by_name) > 1:
                ordered = sorted(by_name, key=_name_order)
                out.append(GroupConflict(desc, tuple(members), {n: tuple(sorted(by_name[n])) for n in ordered}))
    return out


def deviating(conflict: GroupConflict) -> tuple[int, ...]:
    """The ranks on the minority's side of a conflict, where one name holds a strict majority of the ranks
    that named it; () on a tie (nothing tells which side created its groups in the order the program meant)."""
    sizes = sorted(((len(rs), n) for n, rs in conflict.names.items()), reverse=True)
    total = sum(s for s, _ in sizes)
    if sizes[0][0] * 2 <= total:
        return ()
    top = sizes[0][1]
    return tuple(sorted(r for n, rs in conflict.names.items() if n != top for r in rs))


def _name_order(name: str) -> tuple[int, str]:
    return (int(name), name) if name.isdigit() else (1 << 30, name)
