"""What is the same thing in both runs: process groups, message-size buckets and steps.

- **Groups** are matched by their ranks and description: c10d numbers groups in creation order, so a uid
  (``"3[0,1]"``) of one run means nothing in the other. A group whose ranks changed (another world size or
  layout) is still matched by its description when that description names one group on each side.
- **Message sizes** fall in power-of-two buckets, ``[2^k, 2^(k+1))`` bytes: a DDP bucket that grew from
  1 MiB to 4 MiB is a collective that is gone and one that is new, not a slower one.
- **Steps** pair by number, or by position within two ranges (``--steps 10-19:30-39``).

>>> size_bucket(1_048_576), size_bucket(1_048_575), size_bucket(0), size_bucket(None)
((1048576, 2097152), (524288, 1048576), (0, 1), None)
>>> step_pairs((1, 2, 3), (2, 3, 4), by_position=False), step_pairs((1, 2), (7, 8), by_position=True)
([(2, 2), (3, 3)], [(1, 7), (2, 8)])
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from comm2perfetto.report.document import steps_text
from comm2perfetto.report_doc import GroupRow, SavedReport

Bucket = tuple[int, int]  # [low, high) bytes


@dataclass(frozen=True)
class GroupMatch:
    """One process group as the comparison names it: its uid on each side (None where it is absent), a
    label (the description, with its ranks when another group shares the description) and how it matched."""

    label: str
    base_uid: str | None
    new_uid: str | None
    base_ranks: tuple[int, ...] | None
    new_ranks: tuple[int, ...] | None
    how: str  # "ranks and description", "description" (its ranks changed), "base only", "new only"


def size_bucket(nbytes: int | None) -> Bucket | None:
    """The power-of-two bucket of a message size; None when the size is unknown."""
    if nbytes is None:
        return None
    if nbytes <= 0:
        return (0, 1)
    low = 1 << (nbytes.bit_length() - 1)
    return (low, 2 * low)


def step_pairs(base: Iterable[int], new: Iterable[int], by_position: bool) -> list[tuple[int, int]]:
    """Which step of BASE is shown beside which step of NEW: equal numbers, or the i-th of each range."""
    if by_position:
        return list(zip(base, new))
    common = set(new)
    return [(n, n) for n in base if n in common]


def _description(group: GroupRow) -> str:
    """What a user named the group (``group_desc``), else c10d's name."""
    desc = group["desc"]
    return desc if desc and desc != "undefined" else group["name"]


def _groups_of(doc: SavedReport) -> dict[str, tuple[str, tuple[int, ...] | None]]:
    """uid -> (description, ranks) for every group the document's collectives name. A report saved before
    it listed its groups names them by label only: the label is the uid and the ranks are unknown."""
    groups = doc["groups"]
    out: dict[str, tuple[str, tuple[int, ...] | None]] = {}
    for row in doc["collectives"]:
        uid = row["group_uid"] or row["process_group"]
        if uid in groups:
            out[uid] = (_description(groups[uid]), tuple(groups[uid]["ranks"]))
        else:
            out[uid] = (row["process_group"], None)
    return out


def match_groups(base_doc: SavedReport, new_doc: SavedReport) -> list[GroupMatch]:
    """Every group of either run, matched (see the module docstring), in label order."""
    base, new = _groups_of(base_doc), _groups_of(new_doc)
    by_key_new: dict[tuple[str, tuple[int, ...] | None], list[str]] = {}
    for uid, key in sorted(new.items()):
        by_key_new.setdefault(key, []).append(uid)
    pairs: list[tuple[str | None, str | None, str, tuple[str, tuple[int, ...] | None]]] = []
    left_base = []
    for uid, key in sorted(base.items()):
        candidates = by_key_new.get(key)
        if candidates:
            pairs.append((uid, candidates.pop(0), "ranks and description", key))
        else:
            left_base.append(uid)
    left_new = [uid for uids in by_key_new.values() for uid in uids]
    # Ranks changed: match by description where it names one group on each side.
    base_desc = Counter(base[u][0] for u in left_base)
    new_desc = Counter(new[u][0] for u in left_new)
    for uid in list(left_base):
        desc = base[uid][0]
        if base_desc[desc] == 1 and new_desc[desc] == 1:
            other = next(u for u in left_new if new[u][0] == desc)
            pairs.append((uid, other, "description", base[uid]))
            left_base.remove(uid)
            left_new.remove(other)
    pairs += [(u, None, "base only", base[u]) for u in left_base] + [(None, u, "new only", new[u]) for u in left_new]
    labels = Counter(desc for _, _, _, (desc, _) in pairs)
    out = []
    for b, n, how, (desc, ranks) in pairs:
        label = desc  # a description shared by several groups (one tp group per node) is told apart by ranks
        if labels[desc] > 1 and ranks is not None:
            label = f"{desc} [{steps_text(list(ranks))}]"
        out.append(GroupMatch(label, b, n, base[b][1] if b is not None else None,
                              new[n][1] if n is not None else None, how))
    out.sort(key=lambda g: g.label)
    return out
